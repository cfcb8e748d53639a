"""`query-service serve` with SQL on: its statement processes, its Flight SQL port, and
how they end with it, gracefully or killed, leaving no process behind."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import adbc_driver_flightsql.dbapi as flight_sql
import orjson
import pyarrow as pa
import pytest
import yaml
from deltalake import write_deltalake

from materializer.testing import free_port
from materializer.testing.waiting import wait_until
from tests.helpers.query_redis import grpc_serving, map_doc, query_service_command

USERS = pa.table(
    {"_key": [f"u{i}" for i in range(100)], "tier": [("gold", "silver")[i % 2] for i in range(100)]}
)
EXPECTED = {"gold": 50, "silver": 50}
STATEMENT = "SELECT tier, count(*) AS n FROM users GROUP BY tier ORDER BY tier"


def group_members(pgid: int) -> list[int]:
    """The live processes of a process group, read from /proc (zombies left out)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry))
    return members


def statement_over_http(http_port: int) -> dict[str, int]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{http_port}/v1/sql",
        data=orjson.dumps({"sql": STATEMENT}),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        return {row["tier"]: row["n"] for row in orjson.loads(answer.read())["rows"]}


@pytest.fixture
def served(tmp_path: Path, redis_url: str) -> Iterator[subprocess.Popen[bytes]]:
    write_deltalake(str(tmp_path / "delta" / "users"), USERS)
    config = {
        "redis": {"url": redis_url},
        "delta": {"root": str(tmp_path / "delta")},
        "query": {"sql": {"flight_port": free_port(), "workers": 2}},
        "maps": {"users": map_doc("users")},
    }
    config_file = tmp_path / "maps.yaml"
    config_file.write_text(yaml.safe_dump(config))
    http_port, grpc_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MATERIALIZER_")}
    proc = subprocess.Popen(
        [
            *query_service_command(),
            "serve",
            "-c",
            str(config_file),
            "--host",
            "127.0.0.1",
            "--port",
            str(grpc_port),
            "--metrics-port",
            str(free_port()),
            "--http-port",
            str(http_port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,  # a group of its own, as a service manager gives it
    )
    proc.http_port = http_port  # type: ignore[attr-defined]
    proc.grpc_port = grpc_port  # type: ignore[attr-defined]
    proc.flight_port = config["query"]["sql"]["flight_port"]  # type: ignore[attr-defined,index]
    yield proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    for pid in group_members(proc.pid):
        os.kill(pid, signal.SIGKILL)


def use_both_processes(proc: subprocess.Popen[bytes]) -> None:
    """Two statements at once over HTTP (two statement processes), one over Flight SQL."""
    grpc_port = proc.grpc_port  # type: ignore[attr-defined]
    alive = lambda: proc.poll() is None  # noqa: E731 - a service that exited says so at once
    wait_until("the gRPC port", lambda: grpc_serving(grpc_port), 90, alive, retry_errors=True)
    port = proc.http_port  # type: ignore[attr-defined]
    wait_until("the SQL port", lambda: statement_over_http(port) == EXPECTED, 60, retry_errors=True)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: statement_over_http(port), range(4)))
    assert answers == [EXPECTED] * 4
    flight_port = proc.flight_port  # type: ignore[attr-defined]
    with flight_sql.connect(f"grpc://127.0.0.1:{flight_port}") as conn, conn.cursor() as cur:
        cur.execute(STATEMENT)
        table = cur.fetch_arrow_table()
    assert dict(zip(table["tier"].to_pylist(), table["n"].to_pylist(), strict=True)) == EXPECTED
    # The service and its statement processes share its group; at most query.sql.workers.
    assert 2 <= len(group_members(proc.pid)) <= 3


@pytest.mark.parametrize("signalled", ["sigterm", "sigint"])
def test_a_stop_to_the_whole_group_ends_the_statement_processes_too(
    served: subprocess.Popen[bytes], signalled: str
) -> None:
    """A terminal's Ctrl-C or systemd's stop reaches the statement processes as well as the
    service: they leave it to the service, which ends them and exits 0."""
    use_both_processes(served)

    os.killpg(served.pid, signal.SIGINT if signalled == "sigint" else signal.SIGTERM)
    output, _ = served.communicate(timeout=60)

    assert served.returncode == 0, output.decode()
    assert b"Traceback" not in output, output.decode()
    assert b"fork()" not in output, output.decode()
    assert group_members(served.pid) == []


def test_a_killed_service_leaves_no_statement_process(served: subprocess.Popen[bytes]) -> None:
    """kill -9 of the service alone: the kernel ends its statement processes with it."""
    use_both_processes(served)

    os.kill(served.pid, signal.SIGKILL)
    served.communicate(timeout=60)

    wait_until("the statement processes to end", lambda: group_members(served.pid) == [], 30)
