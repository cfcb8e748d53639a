"""``materializer.v1.AdminService``: map status and lag, pause/resume/restart, operations the
run carries out (verify, rehydrate, rebuild), validation, and maps created, changed and
deleted at runtime (Kafka Connect's ``/connectors`` over gRPC)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
import orjson
from confluent_kafka import KafkaException
from redis import RedisError

from materializer.catalog.changes import (
    ChangeInvalid,
    ChangeRefused,
    MapExists,
    NoSuchMap,
    check_delete,
    check_put,
)
from materializer.catalog.live import LiveMaps, as_live
from materializer.catalog.purge import purge
from materializer.catalog.store import CatalogUnavailable
from materializer.config import MAP_NAME, AppConfig, validate_text, with_maps
from materializer.contract.map_catalog import StoredMap
from materializer.contract.operations import KINDS, Operation
from materializer.contract.status import (
    IN_HAND,
    STALE_REPORT_MS,
    MapReport,
    effective_state,
    live_report,
    partition_lags,
    total_lag,
)
from materializer.contract.table_layout import table_path
from materializer.errors import ConfigError
from materializer.v1 import admin_service_pb2 as pb
from materializer.v1 import admin_service_pb2_grpc as pb_grpc
from query_service.auth import CALLER
from query_service.catalog import CatalogWatcher
from query_service.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    MapNotFound,
    NotFound,
    StoreUnavailable,
)
from query_service.freshness import watermark_to_proto
from query_service.stores.admin import ControlStore, LogEnds, MapSnapshot

T = TypeVar("T")
State = pb.MapStatus.State
MAX_CONFIG_BYTES = 1024 * 1024
PURGE_WAIT_SECONDS = 180.0
"""A deleted map stops after its batch in flight and its Delta table's last catch-up
(``spark.stop_timeout``, 100 s by default)."""
PURGE_POLL_SECONDS = 0.25
_LEFTOVERS = {"source": {"topics": ["-"]}, "key": "-"}
"""A stand-in definition for purging a map deleted before: its names are the defaults."""

log = logging.getLogger(__name__)

_STATES = {
    "not_started": State.NOT_STARTED,
    "running": State.RUNNING,
    "paused": State.PAUSED,
    "failed": State.FAILED,
    "stopped": State.STOPPED,
    "restoring": State.RESTORING,
    "rebuilding": State.REBUILDING,
    "catching_up": State.CATCHING_UP,
}


def map_state(report: MapReport | None, now_ms: int) -> pb.MapStatus.State:
    """The state a report implies (``materializer.contract.status.effective_state``)."""
    return _STATES.get(effective_state(report, now_ms), State.STATE_UNSPECIFIED)


class AdminServicer(pb_grpc.AdminServiceServicer):
    """Reads what the materializer reports in Redis and writes the control keys it obeys;
    writes map definitions to the catalog, which every materializer follows."""

    def __init__(
        self,
        config: AppConfig | LiveMaps,
        control: ControlStore,
        log_ends: LogEnds,
        catalog: CatalogWatcher | None = None,
    ) -> None:
        self._live = as_live(config)
        self._control = control
        self._log_ends = log_ends
        self._catalog = catalog if catalog is not None else CatalogWatcher(self._live)
        self._purge_wait = PURGE_WAIT_SECONDS

    @property
    def _config(self) -> AppConfig:
        return self._live.config

    async def ListMaps(
        self, request: pb.ListMapsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListMapsResponse:
        """The declared maps, in name order."""
        return pb.ListMapsResponse(
            maps=[
                pb.MapInfo(
                    name=name,
                    topics=m.source.topics,
                    format=m.source.format,
                    key=m.key,
                    fold_mode=m.fold.mode,
                    table_path=table_path(self._config, name),
                    origin=self._live.maps.origin.get(name, "file"),
                    version=self._live.maps.version(name) if name in self._live.maps.stored else 0,
                )
                for name, m in sorted(self._config.maps.items())
            ]
        )

    async def GetStatus(
        self, request: pb.GetStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetStatusResponse:
        """State, last batch, per-partition lag and rates of one map or all."""
        names = [self._check_map(request.map)] if request.map else sorted(self._config.maps)
        snapshots = await self._control.snapshot(names)
        topics = sorted({t for n in names for t in self._config.maps[n].source.topics})
        ends = await self._log_ends.ends(topics) if topics else {}
        now_ms = int(time.time() * 1000)
        return pb.GetStatusResponse(
            maps=[self._status(n, snapshots[n], ends, now_ms) for n in names]
        )

    def _status(
        self,
        name: str,
        snap: MapSnapshot,
        ends: dict[str, dict[int, int]] | None,
        now_ms: int,
    ) -> pb.MapStatus:
        state = effective_state(snap.report, now_ms)
        status = pb.MapStatus(
            map=name,
            state=_STATES.get(state, State.STATE_UNSPECIFIED),
            state_keys=-1,
            state_bytes=-1,
            eta_seconds=-1,
            serves_from_table=state == "restoring",
        )
        if snap.report is not None:
            status.error = snap.report.error
            status.input_rows_per_second = snap.report.input_rows_per_second
            status.output_rows_per_second = snap.report.processed_rows_per_second
            status.state_keys = snap.report.state_keys
            status.state_bytes = snap.report.state_bytes
            status.worker_id = snap.report.worker
            if snap.report.reported_at_ms:
                status.reported_at.FromMilliseconds(snap.report.reported_at_ms)
        mark = snap.watermark
        if mark is not None:
            status.watermark.CopyFrom(watermark_to_proto(mark))
            status.last_batch_id = mark.batch_id
            if mark.updated_at_ms:
                status.last_batch_at.FromMilliseconds(mark.updated_at_ms)
        live = live_report(snap.report, state)  # a map whose fold runs: figures of now
        if live is not None:
            status.catch_up_rate = live.catch_up_rate
            status.input_rate = live.input_rate
            status.eta_seconds = live.eta_seconds
        rows = partition_lags(self._config.maps[name].source.topics, mark, ends, live)
        status.partitions.extend(pb.PartitionLag(**dataclasses.asdict(row)) for row in rows)
        status.total_lag = -1 if ends is None else total_lag(rows)
        return status

    async def Pause(
        self, request: pb.ControlRequest, context: grpc.aio.ServicerContext
    ) -> pb.ControlResponse:
        """Ask the materializer to stop folding the map after its batch in flight."""
        return await self._ask(request.map, "paused")

    async def Resume(
        self, request: pb.ControlRequest, context: grpc.aio.ServicerContext
    ) -> pb.ControlResponse:
        """Ask the materializer to fold the map again from where it paused."""
        return await self._ask(request.map, "running")

    async def Restart(
        self, request: pb.ControlRequest, context: grpc.aio.ServicerContext
    ) -> pb.ControlResponse:
        """Ask for a stop and start of the map's queries (a failed map tries again)."""
        return await self._ask(request.map, "running", restart=True)

    async def _ask(self, name: str, desired: str, *, restart: bool = False) -> pb.ControlResponse:
        self._check_map(name)
        await self._control.request(name, desired=desired, restart=restart)
        return pb.ControlResponse(map=name, requested_state=_STATES[desired])

    async def StartOperation(
        self, request: pb.OperationRequest, context: grpc.aio.ServicerContext
    ) -> pb.Operation:
        """Store a request for an operation that the run holding the map carries out."""
        name = self._check_map(request.map)
        if request.kind not in KINDS:
            raise InvalidArgument(f"kind: unknown {request.kind!r} (one of {', '.join(KINDS)})")
        report = (await self._control.snapshot([name]))[name].report
        now_ms = int(time.time() * 1000)
        state = effective_state(report, now_ms)
        reporting = report is not None and now_ms - report.reported_at_ms <= STALE_REPORT_MS
        if not reporting or state == "stopped":
            raise FailedPrecondition(
                f"map {name!r} is {state}: no materializer runs it to carry out the "
                f"{request.kind}; start one (materializer run), or use materializer "
                f"{request.kind} {name}"
            )
        asked = Operation.request(request.kind, CALLER.get())
        standing = await self._control.start_operation(name, asked)
        if standing.id != asked.id:
            raise FailedPrecondition(
                f"map {name!r}: {standing.kind} {standing.id} asked by "
                f"{standing.requested_by} is {standing.state}; one operation at a time, "
                "ask again once it ended"
            )
        log.info("map %s: %s %s asked by %s", name, asked.kind, asked.id, asked.requested_by)
        return operation_to_proto(name, standing)

    async def GetOperation(
        self, request: pb.GetOperationRequest, context: grpc.aio.ServicerContext
    ) -> pb.Operation:
        """The last operation asked of the map, as its run last reported it."""
        name = self._check_map(request.map)
        operation = await self._control.operation(name)
        if operation is None:
            raise NotFound(f"map {name!r}: no operation was asked of it yet")
        return operation_to_proto(name, operation)

    async def ValidateConfig(
        self, request: pb.ValidateConfigRequest, context: grpc.aio.ServicerContext
    ) -> pb.ValidateConfigResponse:
        """The problems ``materializer validate`` would print for the same document."""
        if not request.config.strip():
            raise InvalidArgument("config: empty; send a configuration document (YAML or JSON)")
        if len(request.config.encode()) > MAX_CONFIG_BYTES:
            raise InvalidArgument(f"config: larger than {MAX_CONFIG_BYTES} bytes")
        problems = validate_text(request.config, "<request>")
        return pb.ValidateConfigResponse(valid=not problems, problems=problems)

    async def CreateMap(
        self, request: pb.PutMapRequest, context: grpc.aio.ServicerContext
    ) -> pb.MapDefinition:
        """Store a new map's definition (``ALREADY_EXISTS`` for a map that exists)."""
        return await self._put(request, create_only=True)

    async def PutMapConfig(
        self, request: pb.PutMapRequest, context: grpc.aio.ServicerContext
    ) -> pb.MapDefinition:
        """Store a map's definition, creating the map or changing it."""
        return await self._put(request, create_only=False)

    async def _put(self, request: pb.PutMapRequest, *, create_only: bool) -> pb.MapDefinition:
        name = _map_name(request.map)
        config = _config_json(request.config_json)
        by = CALLER.get()
        async with self._catalog.changing() as (maps, topic):
            change = await asyncio.to_thread(
                _translated, check_put, maps, name, config,
                by=by, rebuild=request.rebuild, create_only=create_only,
            )  # fmt: skip
            record = await asyncio.to_thread(_translated, topic.write, change.record)
        await self._catalog.written()
        verb = "created" if change.created else "changed"
        log.info(
            "map %s %s by %s (version %d%s)",
            name, verb, by, record.version, ", rebuilding" if change.rebuilt else "",
        )  # fmt: skip
        answer = _definition(name, record, "api")
        answer.created, answer.rebuilding = change.created, change.rebuilt
        return answer

    async def GetMapConfig(
        self, request: pb.GetMapConfigRequest, context: grpc.aio.ServicerContext
    ) -> pb.MapDefinition:
        """The map's definition: the catalog's record, or the file's section."""
        name = self._check_map(request.map)
        record = self._live.maps.stored.get(name)
        if record is not None:
            return _definition(name, record, "api")
        section = self._config.maps[name].model_dump(
            mode="json", by_alias=True, exclude_defaults=True
        )
        return pb.MapDefinition(map=name, config_json=orjson.dumps(section).decode(), origin="file")

    async def DeleteMap(
        self, request: pb.DeleteMapRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteMapResponse:
        """Delete a map from the catalog; with ``purge``, remove its data once no
        materializer runs it any more (a map deleted before may be purged again)."""
        name = _map_name(request.map)
        by = CALLER.get()
        async with self._catalog.changing() as (maps, topic):
            if request.purge and maps.origin.get(name) == "file":
                raise FailedPrecondition(
                    f"map {name!r} is declared in the configuration file (maps.{name}): its "
                    "data is the file's map's, and is never purged through the API"
                )
            known = name in maps.config.maps or name in maps.left_out
            config = maps.config
            if name not in config.maps and request.purge:  # its definition is not in force
                config = _translated(with_maps, config, {**config.maps, name: _LEFTOVERS})
            if known or not request.purge:
                tombstone = await asyncio.to_thread(_translated, check_delete, maps, name, by=by)
                record = await asyncio.to_thread(_translated, topic.write, tombstone)
                version = record.version
            else:  # a purge of what a deleted map left
                version = maps.version(name)
        if known:
            await self._catalog.written()
            log.info("map %s deleted by %s (version %d)", name, by, version)
        answer = pb.DeleteMapResponse(map=name, version=version)
        if request.purge:
            await self._stopped(name)
            purged = await asyncio.to_thread(_translated, purge, config, name)
            if not purged and not known:
                raise MapNotFound(name, self._config.maps)
            log.info("map %s purged by %s", name, by)
            answer.purged.extend(purged)
        return answer

    async def _stopped(self, name: str) -> None:
        """Wait until no materializer runs the map (they stop it after its batch in flight,
        once their Delta table took in its changelog)."""
        deadline = time.monotonic() + self._purge_wait
        while True:
            snapshot = (await self._control.snapshot([name]))[name]
            state = effective_state(snapshot.report, int(time.time() * 1000))
            if state not in IN_HAND:
                return
            if time.monotonic() > deadline:
                raise FailedPrecondition(
                    f"map {name!r} is deleted, but a materializer still reports it {state} "
                    f"after {self._purge_wait:.0f} s, so its data was not purged: purge it "
                    f"once it stopped (DELETE /v1/maps/{name}?purge=true)"
                )
            await asyncio.sleep(PURGE_POLL_SECONDS)

    def _check_map(self, name: str) -> str:
        if not name:
            raise InvalidArgument("map: must not be empty")
        if name not in self._config.maps:
            raise MapNotFound(name, self._config.maps)
        return name


def _map_name(name: str) -> str:
    if not name:
        raise InvalidArgument("map: must not be empty")
    if not MAP_NAME.match(name):
        raise InvalidArgument(f"map: {name!r} must match {MAP_NAME.pattern}")
    return name


def _config_json(text: str) -> dict[str, Any]:
    if len(text.encode()) > MAX_CONFIG_BYTES:
        raise InvalidArgument(f"config: larger than {MAX_CONFIG_BYTES} bytes")
    try:
        config = orjson.loads(text or "null")
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument(f"config: not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise InvalidArgument("config: must be a JSON object (the map's section of the file)")
    return config


def _translated(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """The catalog's errors as the statuses they mean."""
    try:
        return fn(*args, **kwargs)
    except ChangeInvalid as exc:
        raise InvalidArgument("; ".join(exc.problems)) from None
    except ChangeRefused as exc:
        raise FailedPrecondition(str(exc)) from None
    except MapExists as exc:
        raise AlreadyExists(str(exc)) from None
    except NoSuchMap as exc:
        raise MapNotFound(exc.name, exc.known) from None
    except CatalogUnavailable as exc:
        raise StoreUnavailable(str(exc)) from None
    except ConfigError as exc:
        raise InvalidArgument("; ".join(exc.problems)) from None
    except (KafkaException, RedisError, OSError) as exc:  # a purge's stores
        raise StoreUnavailable(f"cannot remove what the map left: {exc}") from None


def _definition(name: str, record: StoredMap, origin: str) -> pb.MapDefinition:
    answer = pb.MapDefinition(
        map=name,
        config_json=orjson.dumps(record.config).decode(),
        origin=origin,
        version=record.version,
        changed_by=record.by,
    )
    if record.at_ms:
        answer.changed_at.FromMilliseconds(record.at_ms)
    return answer


_OPERATION_STATES = {
    "requested": pb.Operation.State.REQUESTED,
    "running": pb.Operation.State.RUNNING,
    "done": pb.Operation.State.DONE,
    "failed": pb.Operation.State.FAILED,
}


def _differences(found: Any) -> pb.KeyDifferences:
    found = found or {}
    return pb.KeyDifferences(count=int(found.get("count", 0)), first=list(found.get("first", [])))


def operation_to_proto(name: str, operation: Operation) -> pb.Operation:
    """An operation record (``materializer.contract.operations``) as the API answers it."""
    answer = pb.Operation(
        map=name,
        id=operation.id,
        kind=operation.kind,
        requested_by=operation.requested_by,
        state=_OPERATION_STATES.get(operation.state, pb.Operation.State.STATE_UNSPECIFIED),
        phase=operation.phase,
        progress_done=operation.done,
        progress_total=operation.total,
        worker_id=operation.worker,
        error=operation.error,
    )
    for stamp, ms in (
        (answer.requested_at, operation.requested_at_ms),
        (answer.started_at, operation.started_at_ms),
        (answer.finished_at, operation.finished_at_ms),
    ):
        if ms:
            stamp.FromMilliseconds(ms)
    result = operation.result
    if result and operation.kind == "verify":
        answer.verify.CopyFrom(
            pb.VerifyResult(
                identical=bool(result.get("identical")),
                expected=int(result.get("expected", 0)),
                actual=int(result.get("actual", 0)),
                missing=_differences(result.get("missing")),
                extra=_differences(result.get("extra")),
                different=_differences(result.get("different")),
                watermark_matches=bool(result.get("watermark_matches")),
            )
        )
    elif result and operation.kind == "rehydrate":
        answer.rehydrate.CopyFrom(
            pb.RehydrateResult(
                loaded=int(result.get("loaded", 0)),
                removed=int(result.get("removed", 0)),
                expired=int(result.get("expired", 0)),
                seconds=float(result.get("seconds", 0.0)),
            )
        )
    elif result and operation.kind == "rebuild":
        answer.rebuild.CopyFrom(pb.RebuildResult(generation=int(result.get("generation", 0))))
    return answer
