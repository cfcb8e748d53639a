"""``materializer.v1.AdminService``: map status and lag, pause/resume/restart, validation."""

from __future__ import annotations

import dataclasses
import time

import grpc

from materializer.config import AppConfig, validate_text
from materializer.contract.redis_layout import MapReport
from materializer.contract.status import effective_state, partition_lags, total_lag
from materializer.contract.table_layout import table_path
from materializer.v1 import admin_service_pb2 as pb
from materializer.v1 import admin_service_pb2_grpc as pb_grpc
from query_service.errors import InvalidArgument, MapNotFound
from query_service.services.map_service import watermark_to_proto
from query_service.stores.admin import ControlStore, LogEnds, MapSnapshot

State = pb.MapStatus.State
MAX_CONFIG_BYTES = 1024 * 1024

_STATES = {
    "not_started": State.NOT_STARTED,
    "running": State.RUNNING,
    "paused": State.PAUSED,
    "failed": State.FAILED,
    "stopped": State.STOPPED,
    "restoring": State.RESTORING,
}


def map_state(report: MapReport | None, now_ms: int) -> pb.MapStatus.State:
    """The state a report implies (``materializer.contract.status.effective_state``)."""
    return _STATES.get(effective_state(report, now_ms), State.STATE_UNSPECIFIED)


class AdminServicer(pb_grpc.AdminServiceServicer):
    """Reads what the materializer reports in Redis and writes the control keys it obeys."""

    def __init__(self, config: AppConfig, control: ControlStore, log_ends: LogEnds) -> None:
        self._config = config
        self._control = control
        self._log_ends = log_ends

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
        status = pb.MapStatus(
            map=name, state=map_state(snap.report, now_ms), state_keys=-1, state_bytes=-1
        )
        if snap.report is not None:
            status.error = snap.report.error
            status.input_rows_per_second = snap.report.input_rows_per_second
            status.output_rows_per_second = snap.report.processed_rows_per_second
            status.state_keys = snap.report.state_keys
            status.state_bytes = snap.report.state_bytes
            if snap.report.reported_at_ms:
                status.reported_at.FromMilliseconds(snap.report.reported_at_ms)
        mark = snap.watermark
        if mark is not None:
            status.watermark.CopyFrom(watermark_to_proto(mark))
            status.last_batch_id = mark.batch_id
            if mark.updated_at_ms:
                status.last_batch_at.FromMilliseconds(mark.updated_at_ms)
        rows = partition_lags(self._config.maps[name].source.topics, mark, ends)
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

    def _check_map(self, name: str) -> str:
        if not name:
            raise InvalidArgument("map: must not be empty")
        if name not in self._config.maps:
            raise MapNotFound(name, self._config.maps)
        return name
