"""EnrichService.Enrich's answers, end to end: a real redis-server, a real server on port 0,
a real channel.

Every answer is compared with ``reference_join``, which applies the lookups one
at a time in plain Python, so the rounds and the batching across requests are
checked as well as the per-lookup rules: random events under each join spec,
profiles and specs switching mid-stream, many requests in flight, error texts,
what a batch of requests costs Redis, and maps the real pipeline materialized.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from materializer.config import parse_config
from materializer.testing import produce
from materializer.testing.reference import fold_latest
from materializer.v1 import enrich_service_pb2 as pb
from query_service.enrich.batch import Job, run_jobs
from query_service.enrich.events import parse_event
from query_service.enrich.plan import plan_from_spec
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
from tests.helpers.enrich_calls import calls, exchange, make_config
from tests.helpers.enrich_reference import Outcome, reference_join
from tests.helpers.query_redis import run
from tests.helpers.slices import end_offsets, slice_config


@pytest.fixture()
def maps(redis_client: redis.Redis) -> Iterator[Maps]:
    yield from seed_maps(redis_client)


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
