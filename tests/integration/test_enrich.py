"""EnrichService.Enrich end to end: a real redis-server, a real server on port 0, a real channel.

Every answer is compared with ``reference_join``, which applies the lookups one
at a time in plain Python, so the rounds and the batching across requests are
checked as well as the per-lookup rules.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
import redis

from materializer.config import AppConfig, parse_config
from materializer.contract.redis_layout import Watermark, entity_key, meta_key
from materializer.testing import closed_port, produce
from materializer.testing.reference import fold_latest
from materializer.testing.waiting import eventually
from materializer.v1 import common_pb2 as common
from materializer.v1 import enrich_service_pb2 as pb
from materializer.v1 import enrich_service_pb2_grpc as pb_grpc
from query_service.enrich.batch import Job, run_jobs
from query_service.enrich.events import parse_event
from query_service.enrich.plan import plan_from_spec
from query_service.enrich.reference import Outcome, reference_join
from query_service.services.enrich_service import MAX_EVENTS_IN_FLIGHT, READER_TASK
from query_service.stores.redis import RedisMapStore
from tests.helpers.enrich import (
    ERROR,
    INNER,
    OMIT,
    SPECS,
    Entities,
    Maps,
    assert_answers,
    drop_maps,
    new_name,
    outcome,
    random_events,
    request,
    seed_maps,
    split,
)
from tests.helpers.query_redis import map_doc, run
from tests.helpers.slices import end_offsets, slice_config

DEADLINE = 30.0


@pytest.fixture()
def maps(redis_client: redis.Redis) -> Iterator[Maps]:
    yield from seed_maps(redis_client)


def by_user(maps: Maps) -> list[pb.Lookup]:
    """The simplest join: the user whose id the event's ``user_id`` holds."""
    return [pb.Lookup(map=maps.users, key_field="user_id", alias="user")]


def make_config(redis_url: str, maps: Maps, **query: Any) -> AppConfig:
    return parse_config(
        {
            "redis": {"url": redis_url},
            "maps": {m: map_doc(m) for m in (maps.users, maps.companies)},
            "query": query,
        }
    )


def min_offsets(topic: str, partition: int = 0, offset: int = 1) -> dict[str, common.Freshness]:
    position = common.PartitionOffset(topic=topic, partition=partition, offset=offset)
    return {"freshness": common.Freshness(min_offsets=[position])}


async def exchange(
    channel: grpc.aio.Channel, requests: Sequence[pb.EnrichRequest], timeout: float = DEADLINE
) -> list[pb.EnrichResponse]:
    """Send every request without waiting for answers; collect the answers."""
    call = pb_grpc.EnrichServiceStub(channel).Enrich(iter(requests), timeout=timeout)
    return [response async for response in call]


async def exchange_until_error(
    channel: grpc.aio.Channel, requests: Sequence[pb.EnrichRequest]
) -> tuple[list[pb.EnrichResponse], grpc.aio.AioRpcError]:
    call = pb_grpc.EnrichServiceStub(channel).Enrich(iter(requests), timeout=DEADLINE)
    responses = []
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for response in call:
            responses.append(response)
    return responses, info.value


def calls(client: redis.Redis, command: str) -> int:
    """How often Redis has run ``command``: what the service costs it, counted by Redis."""
    stats = client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def reader_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name() == READER_TASK and not t.done()]


def held_back(task: asyncio.Task[Any]) -> bool:
    """Whether the reader holds a request until the service takes some off its hands."""
    awaiting = task.get_coro().cr_await  # type: ignore[union-attr]
    return getattr(awaiting, "__qualname__", "") == "Event.wait"


# --- joins against the reference ---------------------------------------------------------


@pytest.mark.parametrize("spec", list(SPECS))
def test_enrich_matches_the_reference_join(redis_url: str, maps: Maps, spec: str) -> None:
    rng = random.Random(spec)
    lookups = SPECS[spec](maps.users, maps.companies)
    batches = split(rng, random_events(rng, 400))
    # The spec goes with the first request only; the later ones reuse it.
    requests = [
        request(events, f"r{i}-{rng.random()}", lookups=lookups if i == 0 else None)
        for i, events in enumerate(batches)
    ]

    responses = run(make_config(redis_url, maps), lambda ch: exchange(ch, requests))

    assert len(responses) == len(requests)
    for response, req in zip(responses, requests, strict=True):
        assert_answers(response, req, lookups, maps)
    outcomes = [outcome(e) for r in responses for e in r.events]
    # The random events reach every kind of answer the spec can give.
    assert any(o.event is not None and not o.missed for o in outcomes)
    assert any(o.missed for o in outcomes)


def test_profiles_and_specs_switch_mid_stream(redis_url: str, maps: Maps) -> None:
    u, c = maps.users, maps.companies
    by_user = [pb.Lookup(map=u, key_field="user_id", fields=["name"], join=INNER)]
    with_company = SPECS["dependent-second-map"](u, c)
    nested = SPECS["nested-key-path"](u, c)
    profiles = {
        "by_user": {
            "lookups": [{"map": u, "key_field": "user_id", "fields": ["name"], "join": "inner"}]
        },
        "with_company": {
            "lookups": [
                {"map": u, "key_field": "user_id", "alias": "user"},
                {
                    "map": c,
                    "key_field": "user.company_id",
                    "alias": "company",
                    "join": "inner",
                    "fields": ["country"],
                },
            ]
        },
    }
    rng = random.Random(3)
    plan: list[tuple[dict[str, Any], list[pb.Lookup]]] = [
        ({"profile": "with_company"}, with_company),
        ({}, with_company),
        ({"lookups": nested}, nested),
        ({}, nested),
        ({"profile": "by_user"}, by_user),
        ({}, by_user),
        ({}, by_user),
        ({"profile": "with_company"}, with_company),
    ]
    requests = [
        request(random_events(rng, 40), f"r{i}", **join) for i, (join, _) in enumerate(plan)
    ]

    config = make_config(redis_url, maps, enrich_profiles=profiles)
    responses = run(config, lambda ch: exchange(ch, requests))

    assert len(responses) == len(plan)
    for response, req, (_, lookups) in zip(responses, requests, plan, strict=True):
        assert_answers(response, req, lookups, maps)


def test_many_requests_in_flight_are_answered_in_order(redis_url: str, maps: Maps) -> None:
    rng = random.Random(11)
    lookups = SPECS["two-maps-three-rounds"](maps.users, maps.companies)
    requests = [
        request(
            random_events(rng, rng.randrange(1, 4)),
            uuid.uuid4().hex,
            lookups=lookups if i == 0 else None,
        )
        for i in range(600)
    ]

    responses = run(make_config(redis_url, maps), lambda ch: exchange(ch, requests))

    assert [r.request_id for r in responses] == [r.request_id for r in requests]
    for response, req in zip(responses, requests, strict=True):
        assert_answers(response, req, lookups, maps)


def test_error_text_names_the_lookup_and_the_key(redis_url: str, maps: Maps) -> None:
    lookups = [pb.Lookup(map=maps.users, key_field="ctx.user", alias="who", on_miss=ERROR)]
    events = [{"ctx": {"user": "u99"}}, {"ctx": {}}, {"ctx": {"user": ["u1"]}}]

    responses = run(
        make_config(redis_url, maps),
        lambda ch: exchange(ch, [request(events, "r", lookups=lookups)]),
    )

    errors = [e.error for e in responses[0].events]
    assert "'who'" in errors[0] and "'u99'" in errors[0] and maps.users in errors[0]
    assert "'ctx.user'" in errors[1] and "missing" in errors[1]
    assert "'ctx.user'" in errors[2] and "an array" in errors[2]
    assert [list(e.missed) for e in responses[0].events] == [["who"], ["who"], []]


# --- batching ----------------------------------------------------------------------------


def test_a_batch_of_requests_costs_one_mget_per_map_and_round(
    redis_url: str, redis_client: redis.Redis, maps: Maps
) -> None:
    """What the service does with every batch it takes off a stream, counted by Redis."""
    rng = random.Random(9)
    u, c = maps.users, maps.companies
    specs = [SPECS["two-maps-three-rounds"](u, c), SPECS["nested-key-path"](u, c)]
    all_events = [random_events(rng, 20) for _ in range(30)]

    def jobs() -> list[Job]:
        return [
            Job(
                plan_from_spec(pb.JoinSpec(lookups=specs[i % 2]), {u, c}, "spec"),
                [parse_event(orjson.dumps(e), "event") for e in events],
            )
            for i, events in enumerate(all_events)
        ]

    async def main() -> list[Job]:
        store = RedisMapStore.from_url(redis_url)
        try:
            batch = jobs()
            before = calls(redis_client, "mget"), calls(redis_client, "hgetall")
            await run_jobs(store, batch)
            after = calls(redis_client, "mget"), calls(redis_client, "hgetall")
        finally:
            await store.close()
        # Round 0: users (both specs); round 1: companies and users; round 2: companies.
        assert after[0] - before[0] == 4
        # A watermark read within the last moments is reused: at most one per map and round.
        assert 2 <= after[1] - before[1] <= 4
        return batch

    batch = asyncio.run(main())

    for i, (job, events) in enumerate(zip(batch, all_events, strict=True)):
        got = [
            Outcome(
                orjson.loads(s.encoded()) if s.doc is not None else None,
                s.dropped,
                bool(s.error),
                tuple(s.missed),
            )
            for s in job.events
        ]
        assert got == [reference_join(e, specs[i % 2], maps.entities) for e in events]


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


# --- maps written by the real pipeline ---------------------------------------------------

USERS_SCHEMA = "id STRING, name STRING, company_id STRING"
COMPANIES_SCHEMA = "id STRING, name STRING, country STRING"


def test_enrich_joins_maps_the_pipeline_materialized(
    spark: Any,
    kafka_bootstrap: str,
    redis_url: str,
    redis_client: redis.Redis,
    new_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    from materializer.job import start_map

    rng = random.Random(21)
    users, companies = new_name("pusers"), new_name("pcompanies")
    users_topic, companies_topic = new_topic(2), new_topic(1)
    doc = slice_config(tmp_path, kafka_bootstrap, redis_url, users_topic)
    doc["maps"] = {
        users: {"source": {"topics": [users_topic], "schema": USERS_SCHEMA}, "key": "id"},
        companies: {
            "source": {"topics": [companies_topic], "schema": COMPANIES_SCHEMA},
            "key": "id",
        },
    }
    cfg = parse_config(doc)
    user_records: list[tuple[bytes | None, bytes | None]] = []
    for i in range(300):
        uid = f"u{rng.randrange(40)}"
        if rng.random() < 0.1:
            user_records.append((uid.encode(), None))  # a tombstone deletes the user
            continue
        user = {"id": uid, "name": f"name-{i}", "company_id": f"c{rng.randrange(12)}"}
        user_records.append((uid.encode(), orjson.dumps(user)))
    company_records: list[tuple[bytes | None, bytes | None]] = [
        (
            f"c{i % 10}".encode(),
            orjson.dumps({"id": f"c{i % 10}", "name": f"co-{i}", "country": rng.choice("AB")}),
        )
        for i in range(30)
    ]
    user_positions = produce(kafka_bootstrap, users_topic, user_records)
    company_positions = produce(kafka_bootstrap, companies_topic, company_records)
    entities: Entities = {
        users: fold_latest(
            [(p, o, k, v) for (p, o), (k, v) in zip(user_positions, user_records, strict=True)],
            "id",
            ["id", "name", "company_id"],
        ),
        companies: fold_latest(
            [
                (p, o, k, v)
                for (p, o), (k, v) in zip(company_positions, company_records, strict=True)
            ],
            "id",
            ["id", "name", "country"],
        ),
    }
    lookups = [
        pb.Lookup(map=users, key_field="user_id", alias="user", fields=["name", "company_id"]),
        pb.Lookup(map=companies, key_field="user.company_id", alias="company", on_miss=OMIT),
    ]
    events = [{"n": i, "user_id": f"u{rng.randrange(45)}"} for i in range(200)]
    requests = [
        request(events[i : i + 50], f"p{i}", lookups=lookups if i == 0 else None)
        for i in range(0, len(events), 50)
    ]

    try:
        running = [start_map(spark, cfg, users), start_map(spark, cfg, companies)]
        try:
            for queries in running:
                queries.process_all_available()
        finally:
            for queries in running:
                queries.stop()
        responses = run(cfg, lambda ch: exchange(ch, requests))
    finally:
        drop_maps(redis_client, users, companies)

    assert [r.request_id for r in responses] == [r.request_id for r in requests]
    ends = {users: end_offsets(user_positions), companies: end_offsets(company_positions)}
    topics = {users: users_topic, companies: companies_topic}
    for response, req in zip(responses, requests, strict=True):
        got = [outcome(e) for e in response.events]
        assert got == [reference_join(orjson.loads(e), lookups, entities) for e in req.events]
        for name in (users, companies):
            mark = response.watermarks[name]
            assert {(o.topic, o.partition): o.offset for o in mark.offsets} == {
                (topics[name], p): o for p, o in ends[name].items()
            }
    outcomes = [outcome(e) for r in responses for e in r.events]
    assert any(not o.missed for o in outcomes)  # users and companies both found
    assert any(o.missed == ("user", "company") for o in outcomes)  # a deleted or unknown user
