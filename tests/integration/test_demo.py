"""``materializer demo`` as a user runs it: one process that starts everything, serves lookups of
the users it produced, and leaves nothing behind on Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from materializer.config import ENV_OVERRIDES
from materializer.demo.domain import (
    ORDER_AGGREGATES,
    ORDERS,
    USER_EVENTS,
    USER_FIELDS,
    USER_ORDERS,
    USERS,
)
from materializer.demo.events import EventGenerator
from materializer.demo.stack import clear_maps
from materializer.testing import free_port
from materializer.testing.reference import Event, fold_aggregate, fold_merge
from query_service.client import MaterializerClient

SEED = 7
RATE = 100
DURATION = 8
STARTUP_TIMEOUT = 300.0
FOLD_TIMEOUT = 900.0
"""A cold Spark with two stateful maps on two busy cores: minutes, not seconds."""
STOP_TIMEOUT = 300.0


class Output:
    """The demo's stdout, read on a thread so that waiting for a line never blocks the test."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        """The first line from now on matching ``pattern``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                line = ""
            if line is None:
                raise AssertionError(f"demo exited before {pattern!r}:\n" + "\n".join(self.lines))
            if line:
                self.lines.append(line)
                found = re.search(pattern, line)
                if found:
                    return found
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no {pattern!r} in {timeout:.0f} s:\n" + "\n".join(self.lines)
                )

    def rest(self, timeout: float) -> str:
        """Everything printed, once the process has closed its stdout."""
        self._thread.join(timeout)
        while True:
            try:
                line = self._queue.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.lines.append(line)
        return "\n".join(self.lines)


def _parents() -> dict[int, int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # The command name is in parentheses and may hold spaces: split after it.
            parents[int(entry.name)] = int(stat.rpartition(")")[2].split()[1])
    return parents


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` right now, by parent pid."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie waiting for a reaper that is not its parent."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _still_running(pids: set[int]) -> list[int]:
    """The processes among ``pids`` that have not ended within a few seconds (a process
    killed a moment ago may still be on its way out)."""
    deadline = time.monotonic() + 10
    while True:
        left = sorted(pid for pid in pids if running(pid))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


class Descendants:
    """Collects a process's descendants every half second while it runs (children come late:
    Spark's JVM and its Python workers start well after the demo)."""

    def __init__(self, pid: int) -> None:
        self.seen: set[int] = set()
        self._pid = pid
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.seen |= descendants(self._pid)
            self._stop.wait(0.5)

    def stop(self) -> set[int]:
        self._stop.set()
        self._thread.join()
        return self.seen


def replay(start: str, produced: int) -> tuple[list[Event], list[Event]]:
    """The demo's first ``produced`` events for the seed, as (user-events, orders) records.

    Each user's events share a key, so they are in one partition in produce
    order; numbering the records in produce order keeps that order, which is
    all the reference folds need.
    """
    start_us = (datetime.fromisoformat(start) - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(
        microseconds=1
    )
    by_topic: dict[str, list[Event]] = {USER_EVENTS: [], ORDERS: []}
    generated = itertools.islice(EventGenerator(SEED, start_us, RATE), produced)
    for i, event in enumerate(generated):
        by_topic[event.topic].append((0, i, event.key, event.encoded()))
    return by_topic[USER_EVENTS], by_topic[ORDERS]


def _money(entity: dict[str, Any] | None) -> dict[str, Any] | None:
    """A float sum of decimal amounts, to the cent the DECIMAL sum keeps."""
    if entity is None or "total_amount" not in entity:
        return entity
    return {**entity, "total_amount": round(entity["total_amount"], 2)}


async def _wait_for_maps(
    address: str, users: dict[str, Any], orders: dict[str, Any], ends: dict[str, int]
) -> tuple[dict[str, Any], dict[str, Any], str]:
    """Both maps once their watermarks cover every produced record; and a user found by Get."""
    keys = sorted(users)
    async with MaterializerClient(address, deadline=10) as client:
        present = next(k for k in keys if users[k] is not None)
        deadline = time.monotonic() + FOLD_TIMEOUT
        while (await client.get(USERS, present)).entity is None:
            assert time.monotonic() < deadline, f"{USERS}/{present} never found"
            await asyncio.sleep(1)
        while True:
            got_users, user_mark = await client.batch_get(USERS, keys)
            got_orders, orders_mark = await client.batch_get(USER_ORDERS, keys)
            folded = {
                USER_EVENTS: sum(user_mark.offsets.values()) if user_mark else 0,
                ORDERS: sum(orders_mark.offsets.values()) if orders_mark else 0,
            }
            if folded == ends:
                return got_users, got_orders, present
            assert time.monotonic() < deadline, f"folded {folded} of {ends}"
            await asyncio.sleep(1)


@pytest.mark.timeout(FOLD_TIMEOUT + STARTUP_TIMEOUT + STOP_TIMEOUT + 120)
@pytest.mark.parametrize("encoding", ["JSON", "Avro"])
def test_demo_serves_the_users_it_produced_and_stops_cleanly_on_ctrl_c(encoding: str):
    """The same stream, as JSON typed by the config or as Avro written by Confluent's
    serializer through a real schema registry, folds into the same maps."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL" and k not in ENV_OVERRIDES}
    env["PYTHONUNBUFFERED"] = "1"
    args = [sys.executable, "-m", "materializer", "demo", "--port", str(port), "--seed", str(SEED)]
    args += ["--rate", str(RATE), "--duration", str(DURATION)]
    if encoding == "Avro":
        args.append("--schema-registry")
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,  # a terminal's process group: Ctrl-C reaches all of it
    )
    out = Output(proc)
    family = Descendants(proc.pid)
    try:
        workdir = Path(out.wait_for(r"^work dir (\S+) \(removed at exit\)", 30).group(1))
        assert out.wait_for(r"starting redis-server… ok", STARTUP_TIMEOUT)
        listening = out.wait_for(r"^query service listening on 127\.0\.0\.1:(\d+)$", 300)
        assert int(listening.group(1)) == port
        producing = out.wait_for(r"^producing .* as (\w+) to .*event times from (\S+)\)$", 30)
        assert producing.group(1) == encoding
        start = producing.group(2)
        done = out.wait_for(
            r"^produced ([\d,]+) events in .*\(user-events ([\d,]+), orders ([\d,]+)\)", 120
        )
        produced, user_events, orders = (int(g.replace(",", "")) for g in done.groups())
        assert produced == user_events + orders > 0

        user_records, order_records = replay(start, produced)
        assert (len(user_records), len(order_records)) == (user_events, orders)
        expected_users: dict[str, Any] = dict.fromkeys({r[2].decode() for r in user_records})
        expected_users |= fold_merge(user_records, "id", USER_FIELDS)
        expected_orders: dict[str, Any] = dict.fromkeys(expected_users)
        expected_orders |= fold_aggregate(order_records, "user_id", ORDER_AGGREGATES)
        # The seed's stream exercises what it should: deletions, partial updates, several orders.
        assert any(u is None for u in expected_users.values())
        assert any(o and o["orders"] > 2 for o in expected_orders.values())

        got_users, got_orders, found = asyncio.run(
            _wait_for_maps(
                f"127.0.0.1:{port}",
                expected_users,
                expected_orders,
                {USER_EVENTS: user_events, ORDERS: orders},
            )
        )
        assert got_users[found] == expected_users[found]
        assert got_users == expected_users
        assert {k: _money(v) for k, v in got_orders.items()} == {
            k: _money(v) for k, v in expected_orders.items()
        }
        assert len(family.seen) >= 5, family.seen  # broker, redis, pipeline + JVM, query service
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C, as a terminal delivers it
        try:
            code = proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        finally:
            seen = family.stop()
            left = _still_running(seen)
            for pid in left:  # never leave them to the next test, but fail below
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    text = out.rest(30)
    assert code == 0, text
    assert left == [], text
    assert not workdir.exists()
    assert "stopping the pipeline… ok" in text
    assert "stopping Kafka broker… ok" in text
    if encoding == "Avro":
        assert "registering the Avro schemas of user-events, orders… ok" in text
        assert "stopping the schema registry… ok" in text


def test_an_existing_redis_gets_the_demo_maps_cleared_and_nothing_else(redis_url: str):
    client = redis.Redis.from_url(redis_url)
    try:
        keep = {"usersx:a", "other:users:b", "user_ordersx:c"}
        for key in [*keep, "users:u-1", "users:__meta__", "user_orders:u-1", "user_orders:x:y"]:
            client.set(key, "1")
        assert clear_maps(redis_url, [USERS, USER_ORDERS]) == 4
        left = {k.decode() for k in client.scan_iter(match="*user*")}
        assert keep <= left
        assert not {k for k in left if k.startswith(("users:", "user_orders:"))}
    finally:
        for key in ["usersx:a", "other:users:b", "user_ordersx:c"]:
            client.delete(key)
        client.close()


def _gone(pids: set[int], timeout: float) -> list[int]:
    """The processes among ``pids`` still running after ``timeout`` seconds: a child told to
    stop as its parent died may take a graceful stop's time."""
    deadline = time.monotonic() + timeout
    while True:
        left = sorted(pid for pid in pids if running(pid))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


@pytest.mark.timeout(STARTUP_TIMEOUT + STOP_TIMEOUT + 120)
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGKILL], ids=["sighup", "sigkill"])
def test_a_demo_whose_terminal_closes_or_that_is_killed_leaves_nothing_running(sig):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL" and k not in ENV_OVERRIDES}
    env["PYTHONUNBUFFERED"] = "1"
    args = [sys.executable, "-m", "materializer", "demo", "--port", str(port), "--rate", "50"]
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    out = Output(proc)
    family = Descendants(proc.pid)
    workdir: Path | None = None
    try:
        workdir = Path(out.wait_for(r"^work dir (\S+) \(removed at exit\)", 30).group(1))
        out.wait_for(r"^query service listening on 127\.0\.0\.1:(\d+)$", STARTUP_TIMEOUT)
        # Broker, redis-server, the pipeline and its JVM, the query service.
        deadline = time.monotonic() + 120
        while len(family.seen) < 5 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert len(family.seen) >= 5, family.seen
        proc.send_signal(sig)
        code = proc.wait(STOP_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
        seen = family.stop()
        left = _gone(seen, STOP_TIMEOUT)
        for pid in left:  # never leave them to the next test, but fail below
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if workdir is not None:  # a killed demo cannot remove its own
            shutil.rmtree(workdir, ignore_errors=True)
    assert left == [], out.rest(5)
    assert code == (0 if sig == signal.SIGHUP else -signal.SIGKILL)
