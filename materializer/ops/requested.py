"""Operations asked through the AdminService, carried out by the run that holds the map.

The query service stores a request in ``<map>:__operation__``
(``materializer.contract.operations``); ``materializer run`` looks at the maps it
holds once per loop of its supervisor, takes a new request up and carries it
out on a thread of its own (verify and rehydrate without Spark, a rebuild on the
run's own session), so the loop goes on obeying pauses and resumes meanwhile:
verify and rehydrate hold the map still through ``MapControl.held``, which the
loop obeys, and a rebuild pauses it at its switch. Progress goes to the record
as it goes; the outcome when the thread ends.

A run that stops interrupts its operations: each ends at its next step (the
hold released, a rebuild's queries stopped) and is reported failed with
``INTERRUPTED``; one that does not end within ``STOP_SECONDS`` is reported so
anyway, and its thread (a daemon) keeps nothing alive. A map that leaves the
run (moved to another worker of the group, deleted) interrupts its operation
likewise. A record left ``running`` by a run that ended without saying so is
marked failed by the next run that holds the map.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import redis

from materializer.clients.redis import client_for, connect
from materializer.config import AppConfig
from materializer.contract.control import MapControl
from materializer.contract.operations import (
    DONE,
    FAILED,
    INTERRUPTED,
    KINDS,
    REPORT_SCRIPT,
    REQUESTED,
    RUNNING,
    Operation,
    now_ms,
    report_args,
)
from materializer.contract.redis_layout import operation_key
from materializer.errors import MaterializerError
from materializer.ops.rebuild import PHASES, rebuild
from materializer.ops.rebuild import Progress as RebuildProgress
from materializer.ops.verify import Differences, verify
from materializer.restore.expected_state import ExpectedState
from materializer.restore.rehydrate import rehydrate

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
_R = TypeVar("_R")

STOP_SECONDS = 30.0
"""How long a stopping run waits for its operations to end at their next step."""
REPORT_SECONDS = 0.5
"""Progress is written at most this often (a new phase, and a phase's end, at once)."""
SHOW_KEYS = 10
"""Keys a verify lists per kind of difference."""
HOLDING = "holding the map still"


class Interrupted(MaterializerError):
    """The run stopped, or the map left it, while an operation ran."""


@dataclass
class _Job:
    """One operation under way on its thread."""

    map_name: str
    operation: Operation
    report: Callable[..., None]
    thread: threading.Thread | None = None
    result: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    ended: bool = False
    why: str = ""
    """Set (with ``stop``): the reason the operation is to end at its next step."""
    stop: threading.Event = field(default_factory=threading.Event)
    _phase: str = ""
    _reported: float = 0.0

    def interrupt(self, why: str) -> None:
        """Ask the operation to end at its next step, failed with ``why``."""
        if not self.stop.is_set():
            self.why = why
            self.stop.set()

    def progress(self, phase: str, done: int = 0, total: int = 0) -> None:
        """Report how far it is (throttled); raises ``Interrupted`` once asked to end."""
        if self.stop.is_set():
            raise Interrupted(self.why)
        now = time.monotonic()
        whole = total > 0 and done >= total  # a phase's end is always written
        if whole or phase != self._phase or now - self._reported >= REPORT_SECONDS:
            self._phase, self._reported = phase, now
            self.report(phase=phase, done=done, total=total)


class RequestedOperations:
    """The operations the run's maps were asked for, one at a time per map."""

    def __init__(
        self,
        spark: SparkSession,
        config: Callable[[], AppConfig],
        worker: str,
        *,
        busy: Callable[[str, str], str] = lambda _, __: "",
        grace_seconds: float = 60.0,
    ) -> None:
        """``config``: the config in force now; ``worker``: this run's worker id, for the
        record; ``busy``: why the run cannot take an operation of a kind on a map now
        ("" when it can); ``grace_seconds``: how long a rebuild keeps the old copy for readers."""
        self._spark = spark
        self._config = config
        self._worker = worker
        self._busy = busy
        self._grace = grace_seconds
        self._client = connect(config().redis, socket_timeout=5.0, socket_connect_timeout=5.0)
        self._jobs: dict[str, _Job] = {}
        self._warned = False

    def step(self, names: Iterable[str]) -> None:
        """Once per loop: report operations that ended, interrupt those of maps the run no
        longer holds, take up new requests of ``names`` (the maps it holds) and mark
        failed a record still ``running`` that no thread of this run carries out."""
        held = set(names)
        for name, job in list(self._jobs.items()):
            if job.ended:
                if self._finish(job):
                    del self._jobs[name]
            elif name not in held:
                job.interrupt("interrupted: the map left this run")
        idle = sorted(held - self._jobs.keys())
        if not idle:
            return
        try:
            pipe = self._client.pipeline(transaction=False)
            for name in idle:
                pipe.hgetall(operation_key(name))
            replies = pipe.execute()
        except redis.RedisError as exc:
            self._warn(exc)
            return
        self._warned = False
        for name, raw in zip(idle, replies, strict=True):
            try:
                operation = Operation.from_hash(raw)
            except ValueError as exc:  # not a record this contract wrote: left as it is
                log.warning("map %s: unreadable operation record: %s", name, exc)
                continue
            if operation is None:
                continue
            if operation.state == REQUESTED:
                self._begin(name, operation)
            elif operation.state == RUNNING:
                log.warning("map %s: %s %s was left running", name, operation.kind, operation.id)
                self._write(
                    name,
                    operation.id,
                    state=FAILED,
                    error="interrupted: the run carrying it out ended before it did",
                    finished_at_ms=now_ms(),
                )

    def interrupt(self, why: str = INTERRUPTED) -> None:
        """Ask every operation under way to end at its next step."""
        for job in self._jobs.values():
            job.interrupt(why)

    def close(self, timeout: float = STOP_SECONDS) -> None:
        """The run's end: interrupt what runs, wait up to ``timeout`` for it to end, report
        every outcome (one still running: failed, ``INTERRUPTED``)."""
        self.interrupt()
        deadline = time.monotonic() + timeout
        for job in self._jobs.values():
            if job.thread is not None:
                job.thread.join(max(0.0, deadline - time.monotonic()))
        for job in self._jobs.values():
            if not job.ended:
                log.warning(
                    "map %s: %s %s did not end in time: reported interrupted",
                    job.map_name, job.operation.kind, job.operation.id,
                )  # fmt: skip
                job.error = job.why or INTERRUPTED
            self._finish(job)
        self._jobs.clear()
        self._client.close()

    def _begin(self, name: str, operation: Operation) -> None:
        refused = "" if operation.kind in KINDS else f"unknown kind {operation.kind!r}"
        refused = refused or self._busy(name, operation.kind)
        if refused:
            self._write(
                name,
                operation.id,
                state=FAILED,
                error=refused,
                worker=self._worker,
                finished_at_ms=now_ms(),
            )
            return
        written = self._write(
            name,
            operation.id,
            state=RUNNING,
            phase="starting",
            worker=self._worker,
            started_at_ms=now_ms(),
        )
        if written is not True:
            return  # ended meanwhile, or Redis away: looked at again next loop

        def report(**fields: Any) -> None:
            self._write(name, operation.id, **fields)

        job = self._jobs[name] = _Job(name, operation, report)
        job.thread = threading.Thread(
            target=self._run, args=(job,), name=f"{operation.kind}-{name}", daemon=True
        )
        log.info(
            "map %s: %s %s asked by %s: starting",
            name, operation.kind, operation.id, operation.requested_by,
        )  # fmt: skip
        job.thread.start()

    def _run(self, job: _Job) -> None:
        kind = job.operation.kind
        try:
            job.result = {"verify": self._verify, "rehydrate": self._rehydrate}.get(
                kind, self._rebuild
            )(job)
        except Interrupted as exc:
            job.error = str(exc)
        except Exception as exc:  # noqa: BLE001 - reported as the operation's error
            job.error = f"{kind} failed: {exc}"
        finally:
            job.ended = True
        if job.error:
            log.error("map %s: %s %s: %s", job.map_name, kind, job.operation.id, job.error)
        else:
            log.info("map %s: %s %s done", job.map_name, kind, job.operation.id)

    def _finish(self, job: _Job) -> bool:
        """Write an ended operation's outcome; whether it was (Redis may be away)."""
        if job.error:
            fields: dict[str, Any] = {"state": FAILED, "error": job.error}
        else:
            fields = {"state": DONE, "phase": "done"}
        if job.result:
            fields["result"] = job.result
        written = self._write(job.map_name, job.operation.id, finished_at_ms=now_ms(), **fields)
        return written is not None  # a record that is another's or has ended has no say

    def _write(self, name: str, operation_id: str, **fields: Any) -> bool | None:
        """Update the record of ``operation_id`` while it is unfinished: whether it was (the
        record may be another's, or have ended); None when Redis did not answer."""
        try:
            written = self._client.eval(
                REPORT_SCRIPT, 1, operation_key(name), *report_args(operation_id, **fields)
            )
        except redis.RedisError as exc:
            self._warn(exc)
            return None
        return bool(written)

    def _warn(self, exc: Exception) -> None:
        if not self._warned:
            log.warning("cannot reach Redis for the maps' operations: %s", exc)
            self._warned = True

    def _held(self, job: _Job, phase: str, work: Callable[..., _R]) -> _R:
        """A verify or a rehydrate: ``work`` holds the map still and reads its expected state,
        whose rows are ``phase``'s progress."""
        config = self._config()
        rows = _Counter(job, phase)
        job.progress(HOLDING)
        client = client_for(config.redis)
        return work(config, job.map_name, client, on_start=rows.start, on_progress=rows.advance)

    def _verify(self, job: _Job) -> dict[str, Any]:
        phase = "comparing Redis with the Delta table and the changelog"
        report = self._held(job, phase, functools.partial(verify, show=SHOW_KEYS))
        return {
            "identical": report.identical,
            "expected": report.expected,
            "actual": report.actual,
            "missing": _keys(report.stores.missing),
            "extra": _keys(report.stores.extra),
            "different": _keys(report.stores.different),
            "watermark_matches": report.watermark_matches,
        }

    def _rehydrate(self, job: _Job) -> dict[str, Any]:
        phase = "loading Redis from the Delta table and the changelog"
        report = self._held(job, phase, rehydrate)
        return {
            "loaded": report.written,
            "removed": report.removed,
            "expired": report.expired,
            "seconds": round(report.seconds, 3),
        }

    def _rebuild(self, job: _Job) -> dict[str, Any]:
        config = self._config()
        control = MapControl(client_for(config.redis), job.map_name)

        def moved(progress: RebuildProgress) -> None:
            if progress.phase == "grace" and not job.result:
                # Readers use the new copy from now on: the result stands, whatever follows.
                job.result = {"generation": control.generation()}
                job.report(result=job.result)
            phase = PHASES.get(progress.phase, progress.phase)
            job.progress(phase, progress.folded, progress.target)

        generation = rebuild(
            self._spark, config, job.map_name, grace_seconds=self._grace, report=moved
        )
        return {"generation": generation}


class _Counter:
    """Rows of an expected state handled so far, reported as a phase's progress."""

    def __init__(self, job: _Job, phase: str) -> None:
        self.job, self.phase = job, phase
        self.done = self.total = 0

    def start(self, state: ExpectedState) -> None:
        self.total = state.source_rows
        self.job.progress(self.phase, 0, self.total)

    def advance(self, rows: int) -> None:
        self.done += rows
        self.job.progress(self.phase, self.done, self.total)


def _keys(found: Differences) -> Mapping[str, Any]:
    return {"count": found.count, "first": list(found.first)}
