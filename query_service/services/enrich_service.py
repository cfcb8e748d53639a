"""``materializer.v1.EnrichService``: events joined with materialized maps by key."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass

import grpc

from materializer.catalog.live import LiveMaps, as_live
from materializer.config import AppConfig
from materializer.contract.watermark import Watermark
from materializer.enrichment.plan import JoinPlan
from materializer.v1 import common_pb2 as common
from materializer.v1 import enrich_service_pb2 as pb
from materializer.v1 import enrich_service_pb2_grpc as pb_grpc
from query_service.enrich.batch import Job, run_jobs
from query_service.enrich.errors import ProfileNotFound
from query_service.enrich.events import parse_events
from query_service.enrich.inbox import Inbox
from query_service.enrich.plan import plan_from_profile, plan_from_spec
from query_service.errors import InvalidArgument, QueryServiceError, ResourceExhausted
from query_service.freshness import FreshnessGate, watermark_to_proto
from query_service.stores.base import MapStore

MAX_EVENTS_IN_FLIGHT = 4096
"""Events read ahead of processing on one stream, and the most one batch takes together
(a single larger request, up to ``query.max_batch_keys``, still goes alone)."""
READER_TASK = "enrich-reader"
"""The name of each stream's request-reading task."""


@dataclass
class _Stream:
    """What one call remembers between requests."""

    plan: JoinPlan | None = None
    received: int = 0


@dataclass(frozen=True)
class _Request:
    request_id: str
    job: Job
    wanted: dict[str, list[common.PartitionOffset]]
    """Freshness: per looked-up map, the positions of its topics the request waits for."""


class EnrichServicer(pb_grpc.EnrichServiceServicer):
    """Joins events with map entities, batching the lookups of all requests in flight.

    A reader task reads requests ahead; each turn takes every request waiting
    (up to ``MAX_EVENTS_IN_FLIGHT`` events), waits for their freshness, reads
    their entities in one store round trip per join round, and answers them in
    order. A bad request fails the stream after the requests before it are
    answered. Raises ``QueryServiceError`` subclasses; the wrapper of every
    servicer method (``interceptors``) turns them into statuses.
    """

    def __init__(self, config: AppConfig | LiveMaps, store: MapStore, gate: FreshnessGate) -> None:
        self._live = as_live(config)
        config = self._live.config
        self._profiles = config.query.enrich_profiles
        self._profile_plans: dict[str, JoinPlan] = {}
        self._max_events = config.query.max_batch_keys
        self._store = store
        self._gate = gate

    def _topics(self, map_name: str) -> list[str]:
        """The topics a map reads, as its definition in force says."""
        return self._live.config.maps[map_name].source.topics

    async def Enrich(
        self,
        request_iterator: AsyncIterator[pb.EnrichRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.EnrichResponse]:
        """Answer each request in order, one response per request."""
        inbox: Inbox[pb.EnrichRequest] = Inbox(_weight, MAX_EVENTS_IN_FLIGHT)
        reader = inbox.read_from(request_iterator, READER_TASK)
        stream = _Stream()
        try:
            while batch := await inbox.take():
                requests, error = self._prepare(stream, batch)
                if requests:
                    for response in await self._answer(requests, context):
                        yield response
                if error is not None:
                    raise error
        finally:
            reader.cancel()
            await asyncio.wait([reader])

    def _prepare(
        self, stream: _Stream, batch: Sequence[pb.EnrichRequest]
    ) -> tuple[list[_Request], QueryServiceError | None]:
        """The batch's requests up to the first bad one, and its error."""
        requests = []
        for request in batch:
            try:
                requests.append(self._request(stream, request))
            except QueryServiceError as exc:
                return requests, exc
        return requests, None

    def _request(self, stream: _Stream, request: pb.EnrichRequest) -> _Request:
        where = f"request #{stream.received} (request_id {request.request_id!r})"
        stream.received += 1
        plan = stream.plan = self._plan(request, stream.plan, where)
        if len(request.events) > self._max_events:
            raise ResourceExhausted(
                f"{where}: events: {len(request.events)} events, at most {self._max_events} "
                "per request (query.max_batch_keys)"
            )
        events = parse_events(request.events, where)
        wanted = self._freshness(plan, request.freshness.min_offsets, where)
        return _Request(request.request_id, Job(plan, events), wanted)

    def _plan(self, request: pb.EnrichRequest, last: JoinPlan | None, where: str) -> JoinPlan:
        given = request.WhichOneof("join")
        if given == "spec":
            return plan_from_spec(request.spec, self._live.config.maps, f"{where}: spec")
        if given == "profile":
            return self._profile_plan(request.profile, where)
        if last is None:
            raise InvalidArgument(f"{where}: spec or profile: the first request must carry one")
        return last

    def _profile_plan(self, name: str, where: str) -> JoinPlan:
        """A profile is validated on first use; a bad one names its configuration key."""
        if name not in self._profiles:
            raise ProfileNotFound(f"{where}: profile", name, self._profiles)
        if name not in self._profile_plans:
            self._profile_plans[name] = plan_from_profile(
                self._profiles[name], self._live.config.maps, f"query.enrich_profiles.{name}"
            )
        return self._profile_plans[name]

    def _freshness(
        self, plan: JoinPlan, min_offsets: Sequence[common.PartitionOffset], where: str
    ) -> dict[str, list[common.PartitionOffset]]:
        """Each position goes to every looked-up map reading its topic; one that no such
        map reads could never be reached."""
        wanted: dict[str, list[common.PartitionOffset]] = {}
        for i, position in enumerate(min_offsets):
            at = f"{where}: freshness.min_offsets[{i}]"
            readers = [m for m in plan.maps if position.topic in self._topics(m)]
            if not readers:
                read = sorted({t for m in plan.maps for t in self._topics(m)})
                raise InvalidArgument(
                    f"{at}.topic: no looked-up map reads {position.topic!r} "
                    f"(they read {', '.join(read)})"
                )
            if position.partition < 0 or position.offset < 0:
                raise InvalidArgument(f"{at}: partition and offset must be >= 0")
            for m in readers:
                wanted.setdefault(m, []).append(position)
        return wanted

    async def _answer(
        self, requests: Sequence[_Request], context: grpc.aio.ServicerContext
    ) -> list[pb.EnrichResponse]:
        for map_name, wanted in _merged(requests).items():
            await self._gate.wait(map_name, wanted, context.time_remaining())
        marks = await run_jobs(self._store, [r.job for r in requests])
        return [_response(r, m) for r, m in zip(requests, marks, strict=True)]


def _weight(request: pb.EnrichRequest) -> int:
    return max(1, len(request.events))


def _merged(requests: Sequence[_Request]) -> dict[str, list[common.PartitionOffset]]:
    """Per map, the furthest position per partition any request of the batch waits for."""
    furthest: dict[str, dict[tuple[str, int], int]] = {}
    for request in requests:
        for map_name, positions in request.wanted.items():
            by_partition = furthest.setdefault(map_name, {})
            for p in positions:
                key = (p.topic, p.partition)
                by_partition[key] = max(by_partition.get(key, 0), p.offset)
    return {
        map_name: [
            common.PartitionOffset(topic=t, partition=p, offset=o) for (t, p), o in ps.items()
        ]
        for map_name, ps in furthest.items()
    }


def _response(request: _Request, marks: Mapping[str, Watermark | None]) -> pb.EnrichResponse:
    response = pb.EnrichResponse(
        request_id=request.request_id,
        watermarks={m: watermark_to_proto(w) for m, w in marks.items() if w is not None},
    )
    # Built in place, as BatchGet's entries: a list given to the constructor is copied. An
    # event every lookup hit sets two fields only: each field given costs as much again.
    add = response.events.add
    for i, e in enumerate(request.job.events):
        if e.missed or e.doc is None:
            add(index=i, event=e.encoded(), dropped=e.dropped, error=e.error, missed=e.missed)
        else:
            add(index=i, event=e.encoded())
    return response
