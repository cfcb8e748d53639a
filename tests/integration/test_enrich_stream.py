"""EnrichService.Enrich's stream, end to end: a real redis-server, a real server on port 0,
a real channel.

Freshness (a request waits until its maps cover the offsets it names, or its
deadline passes), bad requests (each fails the stream only after the requests
before it, and those taken with it, are answered), Redis down, and a client's
cancellation ending the reader task at any moment. Answers are compared with
``reference_join``, as in ``test_enrich_joins``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import orjson
import pytest
import redis

from materializer.contract.redis_layout import entity_key, meta_key
from materializer.contract.watermark import Watermark
from materializer.testing import closed_port
from materializer.testing.waiting import eventually
from materializer.v1 import common_pb2 as common
from materializer.v1 import enrich_service_pb2 as pb
from materializer.v1 import enrich_service_pb2_grpc as pb_grpc
from query_service.services.enrich_service import MAX_EVENTS_IN_FLIGHT, READER_TASK
from tests.helpers.enrich import SPECS, Maps, assert_answers, request, seed_maps
from tests.helpers.enrich_calls import DEADLINE, calls, exchange, make_config
from tests.helpers.query_redis import run


@pytest.fixture()
def maps(redis_client: redis.Redis) -> Iterator[Maps]:
    yield from seed_maps(redis_client)


def by_user(maps: Maps) -> list[pb.Lookup]:
    """The simplest join: the user whose id the event's ``user_id`` holds."""
    return [pb.Lookup(map=maps.users, key_field="user_id", alias="user")]


def min_offsets(topic: str, partition: int = 0, offset: int = 1) -> dict[str, common.Freshness]:
    position = common.PartitionOffset(topic=topic, partition=partition, offset=offset)
    return {"freshness": common.Freshness(min_offsets=[position])}


async def exchange_until_error(
    channel: grpc.aio.Channel, requests: Sequence[pb.EnrichRequest]
) -> tuple[list[pb.EnrichResponse], grpc.aio.AioRpcError]:
    call = pb_grpc.EnrichServiceStub(channel).Enrich(iter(requests), timeout=DEADLINE)
    responses = []
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for response in call:
            responses.append(response)
    return responses, info.value


def reader_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name() == READER_TASK and not t.done()]


def held_back(task: asyncio.Task[Any]) -> bool:
    """Whether the reader holds a request until the service takes some off its hands."""
    awaiting = task.get_coro().cr_await  # type: ignore[union-attr]
    return getattr(awaiting, "__qualname__", "") == "Event.wait"


# --- freshness ---------------------------------------------------------------------------


def test_freshness_waits_until_the_map_covers_the_offsets(
    redis_url: str, redis_client: redis.Redis, maps: Maps
) -> None:
    topic = maps.topic(maps.users)
    lookups = by_user(maps)
    req = request([{"user_id": "late"}], "fresh", lookups=lookups, **min_offsets(topic, 1, 30))

    async def body(channel: grpc.aio.Channel) -> list[pb.EnrichResponse]:
        polls = calls(redis_client, "hgetall")
        call = pb_grpc.EnrichServiceStub(channel).Enrich(timeout=DEADLINE)
        await call.write(req)
        # The service polls the watermark while it waits; only then does the write land.
        await eventually("the service to wait", lambda: calls(redis_client, "hgetall") > polls + 2)
        redis_client.set(entity_key(maps.users, "late"), b'{"id":"late"}')
        mark = Watermark(batch_id=12, offsets={topic: {0: 40, 1: 30}})
        redis_client.hset(meta_key(maps.users), mapping=mark.to_hash())
        await call.done_writing()
        return [r async for r in call]

    responses = run(make_config(redis_url, maps), body)

    assert len(responses) == 1
    assert orjson.loads(responses[0].events[0].event) == {
        "user_id": "late",
        "user": {"id": "late"},
    }
    offsets = {
        (o.topic, o.partition): o.offset for o in responses[0].watermarks[maps.users].offsets
    }
    assert offsets[topic, 1] >= 30


def test_freshness_not_reached_before_the_deadline_is_deadline_exceeded(
    redis_url: str, maps: Maps
) -> None:
    topic = maps.topic(maps.companies)
    lookups = SPECS["dependent-second-map"](maps.users, maps.companies)
    req = request([{"user_id": "u1"}], "never", lookups=lookups, **min_offsets(topic, 0, 10))

    async def body(channel: grpc.aio.Channel) -> grpc.aio.AioRpcError:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await exchange(channel, [req], timeout=1.0)
        return info.value

    error = run(make_config(redis_url, maps), body)

    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED


# --- bad requests ------------------------------------------------------------------------


@dataclass(frozen=True)
class Bad:
    """A bad request that follows a good one on the same stream."""

    make: Callable[[Maps], pb.EnrichRequest]
    code: grpc.StatusCode
    mentions: tuple[str, ...]
    first: bool = False
    """Sent as the stream's first request (no good one before it)."""


def raw(*events: bytes, **kw: Any) -> pb.EnrichRequest:
    return pb.EnrichRequest(request_id="bad-1", events=list(events), **kw)


def spec_of(*lookups: pb.Lookup) -> dict[str, pb.JoinSpec]:
    return {"spec": pb.JoinSpec(lookups=lookups)}


INVALID, NOT_FOUND = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
BAD: dict[str, Bad] = {
    "malformed-json": Bad(
        lambda m: raw(b'{"user_id":"u1"}', b'{"user_id": '), INVALID, ("events[1]", "JSON")
    ),
    "array-event": Bad(lambda m: raw(b"[1, 2]"), INVALID, ("events[0]", "array")),
    "number-event": Bad(lambda m: raw(b"{}", b"{}", b"42"), INVALID, ("events[2]", "number")),
    "invalid-utf8": Bad(lambda m: raw(b'{"user_id":"\xff\xfe"}'), INVALID, ("events[0]", "UTF-8")),
    "unknown-map": Bad(
        lambda m: raw(b"{}", **spec_of(pb.Lookup(map="no-such-map", key_field="id"))),
        NOT_FOUND,
        ("spec.lookups[0].map", "no-such-map"),
    ),
    "unknown-map-in-second-lookup": Bad(
        lambda m: raw(
            **spec_of(pb.Lookup(map=m.users, key_field="id"), pb.Lookup(map="gone", key_field="x"))
        ),
        NOT_FOUND,
        ("spec.lookups[1].map", "gone"),
    ),
    "unknown-profile": Bad(
        lambda m: raw(b"{}", profile="no-such-profile"), NOT_FOUND, ("profile", "no-such-profile")
    ),
    "empty-spec": Bad(lambda m: raw(b"{}", spec=pb.JoinSpec()), INVALID, ("spec.lookups",)),
    "empty-key-field": Bad(
        lambda m: raw(b"{}", **spec_of(pb.Lookup(map=m.users))),
        INVALID,
        ("spec.lookups[0].key_field", "empty"),
    ),
    "broken-key-path": Bad(
        lambda m: raw(b"{}", **spec_of(pb.Lookup(map=m.users, key_field="a..b"))),
        INVALID,
        ("spec.lookups[0].key_field", "a..b"),
    ),
    "unknown-join": Bad(
        lambda m: raw(b"{}", **spec_of(pb.Lookup(map=m.users, key_field="id", join=7))),
        INVALID,
        ("spec.lookups[0].join", "7"),
    ),
    "unknown-on-miss": Bad(
        lambda m: raw(b"{}", **spec_of(pb.Lookup(map=m.users, key_field="id", on_miss=9))),
        INVALID,
        ("spec.lookups[0].on_miss", "9"),
    ),
    "too-many-events": Bad(
        lambda m: raw(*[b"{}"] * 6), grpc.StatusCode.RESOURCE_EXHAUSTED, ("events", "6", "5")
    ),
    "freshness-topic-no-lookup-reads": Bad(
        lambda m: raw(b"{}", **min_offsets(m.topic(m.companies))),
        INVALID,
        ("freshness.min_offsets[0].topic", "companies"),
    ),
    "freshness-negative-offset": Bad(
        lambda m: raw(b"{}", **min_offsets(m.topic(m.users), offset=-1)),
        INVALID,
        ("freshness.min_offsets[0]", ">= 0"),
    ),
    "no-join-on-the-first-request": Bad(
        lambda m: raw(b"{}"), INVALID, ("first request", "spec or profile"), first=True
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_request_fails_the_stream_after_answering_the_ones_before(
    redis_url: str, maps: Maps, case: str
) -> None:
    bad = BAD[case]
    lookups = by_user(maps)
    good = request([{"user_id": "u1"}, {"user_id": "u2"}], "good-0", lookups=lookups)
    requests = [bad.make(maps)] if bad.first else [good, bad.make(maps)]

    async def body(
        channel: grpc.aio.Channel,
    ) -> tuple[list[pb.EnrichResponse], grpc.aio.AioRpcError, list[pb.EnrichResponse]]:
        answered, error = await exchange_until_error(channel, requests)
        # The server goes on serving new streams.
        after = await exchange(channel, [good])
        return answered, error, after

    answered, error, after = run(make_config(redis_url, maps, max_batch_keys=5), body)

    assert error.code() == bad.code, error.details()
    assert "bad-1" in error.details()  # the request_id
    for mention in bad.mentions:
        assert mention in error.details()
    assert [r.request_id for r in answered] == ([] if bad.first else ["good-0"])
    for response in (*answered, *after):
        assert_answers(response, good, lookups, maps)
    assert len(after) == 1


def test_requests_taken_with_a_bad_one_are_answered_before_the_stream_fails(
    redis_url: str, redis_client: redis.Redis, maps: Maps
) -> None:
    good = request([{"user_id": "u1"}, {"user_id": "u2"}], "good-1")
    lookups = by_user(maps)
    topic = maps.topic(maps.users)
    first = request([{"user_id": "u3"}], "waits", lookups=lookups, **min_offsets(topic, 0, 41))
    rest = [
        good,
        raw(b'{"user_id": "u1"}', b"{oops"),
        request([{}] * MAX_EVENTS_IN_FLIGHT, "filler-a"),
        request([{}], "filler-b"),
    ]

    async def body(
        channel: grpc.aio.Channel,
    ) -> tuple[list[pb.EnrichResponse], grpc.aio.AioRpcError]:
        call = pb_grpc.EnrichServiceStub(channel).Enrich(timeout=DEADLINE)
        await call.write(first)
        await eventually("the reader to start", lambda: len(reader_tasks()) == 1)
        for req in rest:
            await call.write(req)
        # Everything up to the fillers is read while the first request waits, so the
        # good and the bad request are taken off the stream together.
        await eventually("the reader to hold back", lambda: held_back(reader_tasks()[0]))
        mark = Watermark(batch_id=12, offsets={topic: {0: 41, 1: 17}})
        redis_client.hset(meta_key(maps.users), mapping=mark.to_hash())
        responses = []
        with pytest.raises(grpc.aio.AioRpcError) as info:
            while (response := await call.read()) is not grpc.aio.EOF:
                responses.append(response)
        return responses, info.value

    responses, error = run(make_config(redis_url, maps), body)

    assert [r.request_id for r in responses] == ["waits", "good-1"]
    assert responses[1].events[1].event  # answered in full
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "bad-1" in error.details() and "events[1]" in error.details()


def test_redis_down_is_unavailable(maps: Maps) -> None:
    lookups = by_user(maps)

    async def body(channel: grpc.aio.Channel) -> grpc.aio.AioRpcError:
        _, error = await exchange_until_error(
            channel, [request([{"user_id": "u1"}], "r", lookups=lookups)]
        )
        return error

    with closed_port() as port:
        error = run(make_config(f"redis://127.0.0.1:{port}/0", maps), body)

    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert "redis" in error.details()


# --- cancellation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "moment", ["waiting-for-freshness", "waiting-for-requests", "reader-held-back"]
)
def test_client_cancellation_ends_the_reader_task(redis_url: str, maps: Maps, moment: str) -> None:
    lookups = by_user(maps)
    first = request([{"user_id": "u1"}], "r0", lookups=lookups)
    if moment != "waiting-for-requests":
        # A position the map never reaches: the call waits until it is cancelled.
        first.freshness.CopyFrom(min_offsets(maps.topic(maps.users), 0, 10**9)["freshness"])

    async def body(channel: grpc.aio.Channel) -> list[pb.EnrichResponse]:
        call = pb_grpc.EnrichServiceStub(channel).Enrich()  # no deadline
        await call.write(first)
        if moment == "waiting-for-requests":
            assert (await call.read()).request_id == "r0"
        await eventually("the reader to start", lambda: len(reader_tasks()) == 1)
        if moment == "reader-held-back":
            # While the first request waits, more events than the batch taken with it
            # and the read-ahead together can hold.
            for i in range(2 * MAX_EVENTS_IN_FLIGHT // 1000 + 2):
                await call.write(request([{"user_id": "u1"}] * 1000, f"big-{i}"))
            await eventually("the reader to hold back", lambda: held_back(reader_tasks()[0]))
        call.cancel()
        await eventually("the reader to end", lambda: not reader_tasks())
        # The server goes on serving.
        return await exchange(channel, [request([{"user_id": "u2"}], "next", lookups=lookups)])

    responses = run(make_config(redis_url, maps), body)

    assert [r.request_id for r in responses] == ["next"]
    assert_answers(responses[0], request([{"user_id": "u2"}], "next"), lookups, maps)
