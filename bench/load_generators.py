"""The query benchmark's load generators: spawned processes that send pre-serialized
requests closed loop, open loop (at a fixed rate, latency from each call's scheduled
start) or on one stream, and the parent's side that runs them in phases."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import statistics
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import grpc
from cpu_window import CpuWindow

CALL_TIMEOUT = 10.0


MAX_MESSAGE_BYTES = 16 * 1024 * 1024


CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]


@dataclass(frozen=True)
class Load:
    """What one generator process does; plain data, so it pickles into a spawned process.

    ``mode`` is ``closed`` (``in_flight`` calls at all times, each sent as soon
    as the previous one returned), ``open`` (calls started at ``rate`` per
    second whatever the answers do) or ``stream`` (one bidirectional call,
    ``first`` then ``requests`` in turn, at most ``in_flight`` unanswered).
    """

    target: str
    method: str
    mode: str
    requests: list[bytes]
    in_flight: int = 1
    rate: float = 0.0
    phase: float = 0.0
    """Open loop: this process's offset into the shared schedule, in seconds, so the
    generators' calls interleave instead of firing together."""
    first: bytes = b""


@dataclass(frozen=True)
class Plan:
    """When to warm up, measure and stop, on the machine-wide monotonic clock."""

    warm: float
    start: float
    end: float


def generator(load: Load, conn: Connection) -> None:
    """Process entry: ready once connected, then the parent's plan, then the result."""
    try:
        conn.send(("result", asyncio.run(_generate(load, conn))))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


async def _generate(load: Load, conn: Connection) -> dict[str, Any]:
    if load.mode == "http":
        return await _http_closed_loop(load, conn)
    async with grpc.aio.insecure_channel(load.target, options=CHANNEL_OPTIONS) as channel:
        await asyncio.wait_for(channel.channel_ready(), 30)
        conn.send(("ready", None))
        plan: Plan = conn.recv()  # blocks the loop, but nothing is in flight yet
        await asyncio.sleep(max(0.0, plan.warm - time.monotonic()))
        if load.mode == "stream":
            return await _stream(channel.stream_stream(load.method), load, plan)
        call = channel.unary_unary(load.method)  # no serializers: bytes in, bytes out
        if load.mode == "closed":
            return await _closed_loop(call, load, plan)
        return await _open_loop(call, load, plan)


class _Tally:
    """Calls answered and failed inside the measured window, and the first failure."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.calls = 0
        self.errors = 0
        self.first_error = ""
        self.latencies: list[float] = []

    def inside(self, moment: float) -> bool:
        return self.plan.start <= moment < self.plan.end

    def failed(self, exc: grpc.aio.AioRpcError, moment: float) -> None:
        if self.inside(moment):
            self.errors += 1
        if not self.first_error:
            self.first_error = f"{exc.code().name}: {exc.details()}"

    def result(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "errors": self.errors,
            "first_error": self.first_error,
            "latencies": self.latencies,
        }


async def _closed_loop(call: Any, load: Load, plan: Plan) -> dict[str, Any]:
    """``in_flight`` callers, each sending its next request as soon as one returns."""
    tally = _Tally(plan)
    requests, n = load.requests, len(load.requests)

    async def caller(i: int) -> None:
        while time.monotonic() < plan.end:
            try:
                await call(requests[i % n], timeout=CALL_TIMEOUT)
            except grpc.aio.AioRpcError as exc:
                tally.failed(exc, time.monotonic())
            else:
                if tally.inside(time.monotonic()):
                    tally.calls += 1
            i += load.in_flight

    await asyncio.gather(*(caller(k) for k in range(load.in_flight)))
    return tally.result()


async def _http_closed_loop(load: Load, conn: Connection) -> dict[str, Any]:
    """``in_flight`` HTTP/1.1 keep-alive connections, each sending its next request (raw
    bytes, from ``requests``) as soon as the answer before it was read; a status other
    than 200 is a failure."""
    host, _, port = load.target.rpartition(":")
    streams = [await asyncio.open_connection(host, int(port)) for _ in range(load.in_flight)]
    conn.send(("ready", None))
    plan: Plan = conn.recv()
    await asyncio.sleep(max(0.0, plan.warm - time.monotonic()))
    tally = _Tally(plan)
    requests, n = load.requests, len(load.requests)

    async def caller(i: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while time.monotonic() < plan.end:
            writer.write(requests[i % n])
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            await reader.readexactly(length)
            moment = time.monotonic()
            if head.startswith(b"HTTP/1.1 200"):
                if tally.inside(moment):
                    tally.calls += 1
            else:
                if tally.inside(moment):
                    tally.errors += 1
                tally.first_error = tally.first_error or head.split(b"\r\n", 1)[0].decode()
            i += load.in_flight
        writer.close()

    await asyncio.gather(*(caller(k, r, w) for k, (r, w) in enumerate(streams)))
    return tally.result()


async def _open_loop(call: Any, load: Load, plan: Plan) -> dict[str, Any]:
    """Calls started on a fixed schedule; latency counts from the scheduled start.

    A call is never held back by the ones before it, so when the server (or the
    generator's own event loop) falls behind, the wait shows up in the latency.
    """
    tally = _Tally(plan)
    requests, n = load.requests, len(load.requests)
    pending: set[asyncio.Task[None]] = set()
    interval = 1.0 / load.rate

    async def one(request: bytes, due: float) -> None:
        try:
            await call(request, timeout=CALL_TIMEOUT)
        except grpc.aio.AioRpcError as exc:
            tally.failed(exc, due)
        else:
            if tally.inside(due):
                tally.calls += 1
                tally.latencies.append(time.monotonic() - due)

    due, sent = plan.warm + load.phase, 0
    while due < plan.end:
        while due <= time.monotonic() and due < plan.end:
            task = asyncio.create_task(one(requests[sent % n], due))
            pending.add(task)
            task.add_done_callback(pending.discard)
            sent += 1
            due += interval
        await asyncio.sleep(max(0.0, due - time.monotonic()))
    if pending:
        await asyncio.wait(pending, timeout=CALL_TIMEOUT + 1)
    return tally.result()


async def _stream(open_call: Any, load: Load, plan: Plan) -> dict[str, Any]:
    """One bidirectional call: a writer keeps ``in_flight`` requests unanswered, a reader
    counts the answers (one per request, in order) that arrive inside the window."""
    tally = _Tally(plan)
    requests, n = load.requests, len(load.requests)
    call = open_call(timeout=plan.end - time.monotonic() + CALL_TIMEOUT)
    window = asyncio.Semaphore(load.in_flight)

    async def write() -> None:
        await window.acquire()
        await call.write(load.first)  # carries the join spec; later requests reuse it
        i = 0
        while time.monotonic() < plan.end:
            await window.acquire()
            await call.write(requests[i % n])
            i += 1
        await call.done_writing()

    async def read() -> None:
        while (response := await call.read()) is not grpc.aio.EOF:
            window.release()
            if response and tally.inside(time.monotonic()):
                tally.calls += 1

    try:
        await asyncio.gather(write(), read())
    except grpc.aio.AioRpcError as exc:
        tally.failed(exc, time.monotonic())
    return tally.result()


def sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


def _expect(conn: Connection, what: str, timeout: float) -> Any:
    if not conn.poll(timeout):
        raise TimeoutError(f"a load generator sent no {what} within {timeout:.0f} s")
    kind, payload = conn.recv()
    if kind == "error":
        raise RuntimeError(f"a load generator failed:\n{payload}")
    if kind != what:
        raise RuntimeError(f"a load generator sent {kind}, expected {what}")
    return payload


@contextlib.contextmanager
def generators(loads: Sequence[Load]) -> Iterator[tuple[list[Connection], list[int]]]:
    """Spawned generator processes; always stopped on the way out, even on error.

    Spawned, not forked: a forked child would inherit the parent's gRPC state,
    which gRPC does not support, and a fresh interpreter per generator is what
    a separate client would be.
    """
    ctx = mp.get_context("spawn")
    procs: list[Any] = []
    conns: list[Connection] = []
    try:
        for load in loads:
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=generator, args=(load, theirs), daemon=True)
            proc.start()
            theirs.close()
            procs.append(proc)
            conns.append(mine)
        yield conns, [p.pid for p in procs]
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in conns:
            conn.close()


def run_phase(
    loads: Sequence[Load], warmup: float, seconds: float, watch: Mapping[str, Sequence[int]]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Start the generators, warm up together, measure together; the summed tallies and
    the CPU each watched group (plus the generators) used over the measured window."""
    with generators(loads) as (conns, pids):
        for conn in conns:
            _expect(conn, "ready", 60)
        warm = time.monotonic() + 0.2
        plan = Plan(warm=warm, start=warm + warmup, end=warm + warmup + seconds)
        for conn in conns:
            conn.send(plan)
        cpu = CpuWindow({**watch, "generators": pids})
        sleep_until(plan.start)
        cpu.begin()
        sleep_until(plan.end)
        usage = cpu.end()
        results = [_expect(conn, "result", CALL_TIMEOUT + 60) for conn in conns]
    total: dict[str, Any] = {
        "calls": sum(r["calls"] for r in results),
        "errors": sum(r["errors"] for r in results),
        "first_error": next((r["first_error"] for r in results if r["first_error"]), ""),
        "latencies": [x for r in results for x in r["latencies"]],
    }
    return total, usage


def unary_loads(
    target: str, method: str, pools: Sequence[list[bytes]], in_flight: int
) -> list[Load]:
    """Closed loop: one generator per request pool, ``in_flight`` calls each."""
    return [Load(target, method, "closed", pool, in_flight=in_flight) for pool in pools]


def open_loads(target: str, method: str, pools: Sequence[list[bytes]], rate: float) -> list[Load]:
    """Open loop: ``rate`` calls/s in all, shared by one generator per request pool."""
    per = rate / len(pools)
    return [
        Load(target, method, "open", pool, rate=per, phase=i / rate) for i, pool in enumerate(pools)
    ]


def closed_line(total: dict[str, Any], seconds: float) -> dict[str, Any]:
    """Calls/s of a closed-loop phase; a failed call fails the benchmark (no silent errors)."""
    if total["errors"] or not total["calls"]:
        raise RuntimeError(f"{total['errors']} failed calls, first: {total['first_error']}")
    return {"calls": total["calls"], "calls_per_s": round(total["calls"] / seconds)}


def latency_line(total: dict[str, Any], rate: float, seconds: float) -> dict[str, Any]:
    """Percentiles of an open-loop phase, as ``freshness.freshness`` computes them."""
    ms = sorted(x * 1000 for x in total["latencies"])
    if total["errors"] or len(ms) < 2:
        raise RuntimeError(f"{total['errors']} failed calls, first: {total['first_error']}")
    q = statistics.quantiles(ms, n=100)
    return {
        "offered_per_s": round(rate),
        "achieved_per_s": round(len(ms) / seconds),
        "samples": len(ms),
        "p50_ms": round(q[49], 2),
        "p90_ms": round(q[89], 2),
        "p99_ms": round(q[98], 2),
        "max_ms": round(ms[-1], 2),
    }
