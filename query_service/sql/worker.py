"""A statement process: runs SQL statements, one at a time, for the query service.

Started by ``query_service.sql.workers`` as ``python -m query_service.sql.worker``;
it reads requests on stdin and writes answers on stdout, in frames (``frames``).
The engine is DataFusion, over the maps' Delta tables through delta-rs, in a
session per statement that knows only that statement's tables, with a memory pool
of the request's size and no disk to spill to, and that refuses DDL, DML and
``SET`` itself. Number literals with a point or an exponent are exact decimals, as
PostgreSQL reads them (``credit - 0.01`` stays a DECIMAL), not floats.

A process of its own, because a running statement cannot be stopped from outside
the engine: the service ends the process instead (its deadline passed, or its
caller left), and a panic or a runaway allocation ends it, not the service.
It ignores the signals a terminal sends its whole process group (the service
decides when it stops) and ends with the service: at the end of its stdin, or,
on Linux, at once when the service dies (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import ctypes
import pickle
import signal
import sys
from typing import Any, BinaryIO

import pyarrow as pa

from query_service.sql import engine, frames
from query_service.sql.arrow_types import cast, portable

_SIGKILL = 9
_PR_SET_PDEATHSIG = 1
_RESOURCES = "Resources exhausted"


def main() -> None:
    """Serve requests until stdin ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent()
    requests, answers = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but frames on the answer pipe
    engine = Engine()
    frames.write(answers, frames.READY, b"")
    while True:
        request = frames.read(requests)
        if request is None:
            return
        engine.run(pickle.loads(request[1]), answers)  # noqa: S301 - our own parent's bytes


class Engine:
    """Opened tables and a session, kept between statements.

    The session is made again only when the request's settings change; before each
    statement it is left knowing exactly that statement's tables, at the versions the
    service fixed: a table of the statement before is dropped, a newer version
    registered in place of the older (read incrementally from the table kept open).
    """

    def __init__(self) -> None:
        self._tables: dict[str, Any] = {}
        self._context: Any = None
        self._settings: tuple[int, int] | None = None
        self._registered: dict[str, tuple[str, int]] = {}

    def run(self, request: dict[str, Any], out: BinaryIO) -> None:
        """Answer one request: a schema frame, batch frames, then done or an error."""
        try:
            frame = self._dataframe(request)
        except Exception as exc:  # noqa: BLE001 - every engine error is the caller's answer
            self._failed(out, exc)
            return
        try:
            schema = portable(frame.schema())
            frames.write(out, frames.SCHEMA, schema.serialize().to_pybytes())
            for batch in frame.execute_stream():
                record = cast(batch.to_pyarrow(), schema)
                if record.num_rows:
                    frames.write(out, frames.BATCH, record.serialize().to_pybytes())
        except Exception as exc:  # noqa: BLE001
            self._failed(out, exc)
            return
        frames.write(out, frames.DONE, b"")

    def _failed(self, out: BinaryIO, exc: Exception) -> None:
        """The statement's error to the caller. One past the memory pool leaves its session
        behind: the engine's tasks of the stopped plan give their share of the pool back
        only as they end, which the next statement in this process must not wait for (it
        would be refused for memory it never asked for)."""
        kind, message = _classify(exc)
        if kind == frames.MEMORY:
            self._context, self._settings, self._registered = None, None, {}
        frames.write_error(out, kind, message)

    def _dataframe(self, request: dict[str, Any]) -> Any:
        """The statement's plan, in the session kept for it (which must outlive the plan's
        run: the plan's tasks reach their session through it)."""
        context = self._session(request["partitions"], request["memory_bytes"])
        wanted = {name: (uri, version) for name, uri, _, version in request["tables"]}
        for name in [n for n in self._registered if wanted.get(n) != self._registered[n]]:
            context.deregister_table(name)
            del self._registered[name]
        for name, uri, options, version in request["tables"]:
            if name not in self._registered:
                context.register_table(name, self._table(uri, options, version))
                self._registered[name] = (uri, version)
        frame = context.sql_with_options(
            request["sql"], engine.read_only(), param_values=engine.parameters(request["params"])
        )
        return frame.limit(request["rows"])

    def _session(self, partitions: int, memory_bytes: int) -> Any:
        from datafusion import RuntimeEnvBuilder, SessionContext

        if self._context is None or self._settings != (partitions, memory_bytes):
            runtime = (
                RuntimeEnvBuilder()
                .with_greedy_memory_pool(memory_bytes)
                .with_disk_manager_disabled()
            )
            self._context = SessionContext(engine.session_config(partitions), runtime)
            self._settings = (partitions, memory_bytes)
            self._registered = {}
        return self._context

    def _table(self, uri: str, options: dict[str, str] | None, version: int) -> Any:
        from deltalake import DeltaTable

        table = self._tables.get(uri)
        if table is None:
            table = self._tables[uri] = DeltaTable(uri, version=version, storage_options=options)
        elif table.version() != version:
            table.load_as_version(version)
        return table


def _classify(exc: Exception) -> tuple[str, str]:
    """An engine error as (kind, message): the service turns the kind into a status."""
    text = _one_line(str(exc))
    if _RESOURCES in text:
        return frames.MEMORY, text
    if isinstance(exc, pa.ArrowException | OSError) and "object store" in text.lower():
        return frames.STORAGE, text
    return frames.INVALID, text


def _one_line(text: str) -> str:
    """An engine message on one line, without the backtrace ``RUST_BACKTRACE`` adds."""
    kept = []
    for line in text.splitlines():
        if line.strip().startswith(("0:", "Stack backtrace:")):
            break
        kept.append(line.strip())
    return " ".join(part for part in kept if part)


def _die_with_parent() -> None:
    """Ask Linux to end this process when the service that started it dies (kill -9)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, _SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the end of stdin still ends it, after its statement


if __name__ == "__main__":
    main()
