"""``materializer sql`` as users run it, a process of its own, against a query service
serving two maps whose Delta tables delta-rs wrote with their commits' offsets: each
format's answer against the rows computed here, the tables read with their versions
and watermarks, the JSON the HTTP front's own, parameters, read-your-writes, and the
refusals with their status and message."""

from __future__ import annotations

import asyncio
import csv
import io
import os
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from materializer.config import AppConfig
from tests.helpers.query_redis import started
from tests.helpers.sql_tables import BATCH_ID, OFFSETS, USERS, SqlMaps, expected_groups

ADMIN = "sql-cli-admin-token-0123456789"
READER = "sql-cli-reader-token-0123456789"


def config_of(maps: SqlMaps, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> AppConfig:
    tokens = [
        {"name": "admin", "token": ADMIN, "maps": ["*"], "verbs": ["*"]},
        {"name": "reader", "token": READER, "maps": [maps.users], "verbs": ["query"]},
    ]
    return maps.config(redis_url, tokens, "SQL_CLI_TEST_TOKENS", monkeypatch)


class Cli:
    """``materializer sql`` at a served query service, run as a process of its own."""

    def __init__(self, port: int) -> None:
        self.address = f"127.0.0.1:{port}"

    async def __call__(
        self, *args: str, token: str | None = ADMIN, status: int = 0
    ) -> tuple[str, str]:
        env = {**os.environ, "COLUMNS": "200"}  # one line per row of the table
        env.pop("MATERIALIZER_TOKEN", None)
        if token is not None:
            env["MATERIALIZER_TOKEN"] = token
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "materializer", "sql", "--address", self.address, *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
        )  # fmt: skip
        out, err = await asyncio.wait_for(process.communicate(), 120)
        assert process.returncode == status, (process.returncode, out.decode(), err.decode())
        return out.decode(), err.decode()


def serve(config: AppConfig, body: Any) -> None:
    async def main() -> None:
        async with started(config) as servers:
            await body(servers)

    asyncio.run(main())


def table_line(name: str) -> str:
    offsets = " ".join(f"{name}-events[{p}]={o}" for p, o in sorted(OFFSETS.items()))
    return f"{name}: version 1, watermark batch {BATCH_ID}: {offsets}"


def test_each_format_prints_the_answer_and_the_tables_read(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    maps = SqlMaps(tmp_path)
    maps.write()
    config = config_of(maps, redis_url, monkeypatch)
    groups = expected_groups()

    async def body(servers: Any) -> None:
        cli = Cli(servers.port)

        # table: one line per row, then the count and a line per table read.
        out, _ = await cli(maps.group_by())
        lines = out.splitlines()
        for group in groups:
            row = next(line for line in lines if f" {group['tier']} " in line)
            assert f" {group['orders']} " in row and f" {group['total']} " in row, row
        assert "3 rows" in lines
        assert table_line(maps.orders) in lines and table_line(maps.users) in lines

        # Values are data: their brackets and :names: print as they are.
        out, _ = await cli(f"SELECT '[b]x[/b] :zero:' AS s FROM {maps.users} LIMIT 1")
        assert "[b]x[/b] :zero:" in out

        # json: the HTTP front's answer to the same statement, to the byte's meaning.
        out, _ = await cli(maps.group_by(), "--format", "json")
        answer = orjson.loads(out)
        assert answer["rows"] == groups
        assert answer["columns"] == [
            {"name": "tier", "type": "string"},
            {"name": "orders", "type": "int64"},
            {"name": "total", "type": "double"},
        ]
        assert {t["map"]: t["version"] for t in answer["tables"]} == {
            maps.users: 1,
            maps.orders: 1,
        }
        for table in answer["tables"]:
            offsets = {str(p): o for p, o in OFFSETS.items()}
            assert table["watermark"]["offsets"] == {f"{table['map']}-events": offsets}
            assert table["redis"] is False
        url = f"http://127.0.0.1:{servers.http_port}/v1/sql"
        async with (
            aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN}"}) as http,
            http.post(url, json={"sql": maps.group_by()}) as r,
        ):
            assert r.status == 200
            assert orjson.loads(await r.read()) == answer

        # csv: a header, then the rows.
        out, _ = await cli(maps.group_by(), "--format", "csv")
        read = list(csv.reader(io.StringIO(out)))
        assert read[0] == ["tier", "orders", "total"]
        assert [(t, int(n), float(s)) for t, n, s in read[1:]] == [
            (g["tier"], g["orders"], g["total"]) for g in groups
        ]

        # Parameters typed from text, and a limit that cuts the answer short.
        statement = (
            f"SELECT _key, spend FROM {maps.users} WHERE tier = $1 AND spend > $2 ORDER BY _key"
        )
        out, _ = await cli(statement, "-p", "gold", "-p", "20", "--format", "json")
        assert orjson.loads(out)["rows"] == [
            {"_key": k, "spend": s} for k, t, s in USERS if t == "gold" and s > 20
        ]
        out, _ = await cli(statement, "-p", "gold", "-p", "0", "--limit", "1", "--format", "json")
        assert len(orjson.loads(out)["rows"]) == 1
        # A JSON string is the text inside its quotes.
        out, _ = await cli(
            f"SELECT count(*) AS n FROM {maps.users} WHERE id = $1", "-p", '"u1"', "--format", "csv"
        )
        assert out.splitlines() == ['"n"', "1"]

        # Read-your-writes: offsets the tables reflect answer at once.
        wanted = ",".join(f"{maps.users}-events:{p}:{o}" for p, o in OFFSETS.items())
        out, _ = await cli(f"SELECT count(*) AS n FROM {maps.users}", "--min-offsets", wanted)
        assert table_line(maps.users) in out.splitlines()

    serve(config, body)


def test_refusals_print_their_status_and_message_and_exit_2(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    maps = SqlMaps(tmp_path)
    maps.write()
    config = config_of(maps, redis_url, monkeypatch)

    async def body(servers: Any) -> None:
        cli = Cli(servers.port)
        out, err = await cli(f"DELETE FROM {maps.users}", status=2)
        assert out == "" and err.startswith("INVALID_ARGUMENT: "), err
        _, err = await cli(f"SELECT * FROM {maps.orders}", token=READER, status=2)
        assert err.startswith("PERMISSION_DENIED: ") and maps.orders in err, err
        _, err = await cli(f"SELECT * FROM {maps.users}", token=None, status=2)
        assert err.startswith("UNAUTHENTICATED: "), err
        _, err = await cli("SELECT * FROM nowhere_to_be_found", status=2)
        assert err.startswith("NOT_FOUND: ") and "nowhere_to_be_found" in err, err
        _, err = await cli(
            f"SELECT * FROM {maps.users}", "--min-offsets", f"{maps.users}-events:0:999",
            "--timeout", "1", status=2,
        )  # fmt: skip
        assert err.startswith("DEADLINE_EXCEEDED: ") and "[0] >= 999" in err, err
        # Refused before any call: the option says what it wants.
        _, err = await cli("SELECT 1", "--min-offsets", "users:zero:1", status=2)
        assert "--min-offsets: 'users:zero:1' is not topic:partition:offset" in err
        _, err = await cli("SELECT $1", "-p", str(2**64), status=2)
        assert "--param $1" in err and "64 bits" in err

    serve(config, body)
