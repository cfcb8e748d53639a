"""Two maps of users and companies in the Redis layout, join specs over them, and the
reference answers Enrich must give: shared by the Enrich tests and its scale test."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import redis

from materializer.contract.redis_layout import entity_key, meta_key
from materializer.contract.watermark import Watermark
from materializer.v1 import common_pb2 as common
from materializer.v1 import enrich_service_pb2 as pb
from tests.helpers.enrich_reference import Outcome, reference_join

LEFT, INNER = pb.Lookup.LEFT, pb.Lookup.INNER
NULL, OMIT, ERROR = pb.Lookup.NULL, pb.Lookup.OMIT, pb.Lookup.ERROR

Entities = dict[str, dict[str, dict[str, Any]]]


@dataclass(frozen=True)
class Maps:
    """Two maps written into Redis as the materializer writes them."""

    users: str
    companies: str
    entities: Entities
    marks: dict[str, Watermark]

    def topic(self, map_name: str) -> str:
        return f"{map_name}-events"  # as map_doc declares it


def new_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def write_map(
    client: redis.Redis, name: str, entities: dict[str, dict[str, Any]], mark: Watermark
) -> None:
    """Entities first, then the watermark, as the materializer orders a batch's writes."""
    for key, entity in entities.items():
        client.set(entity_key(name, key), orjson.dumps(entity))
    client.hset(meta_key(name), mapping=mark.to_hash())


def drop_maps(client: redis.Redis, *names: str) -> None:
    for name in names:
        keys = list(client.scan_iter(match=f"{name}:*"))
        if keys:
            client.delete(*keys)


def seed_maps(redis_client: redis.Redis) -> Iterator[Maps]:
    """Users and companies in the Redis layout, removed when the generator closes."""
    rng = random.Random(7)
    users, companies = new_name("users"), new_name("companies")
    user_entities: dict[str, dict[str, Any]] = {}
    for i in range(30):
        entity: dict[str, Any] = {"id": f"u{i}", "name": f"user {i}", "age": rng.randrange(90)}
        if rng.random() < 0.8:
            entity["company_id"] = f"c{rng.randrange(12)}"  # c10, c11 do not exist
        user_entities[f"u{i}"] = entity
    # Keys that events give as numbers and booleans (keyed by their JSON text).
    user_entities["42"] = {"id": 42, "name": "answer", "company_id": "c1"}
    user_entities["true"] = {"id": "true", "name": "yes"}
    user_entities["2.5"] = {"id": "2.5", "name": "half", "company_id": "c2"}
    company_entities = {
        f"c{i}": {"id": f"c{i}", "name": f"company {i}", "country": rng.choice(["FR", "NO"])}
        for i in range(10)
    }
    built = Maps(
        users=users,
        companies=companies,
        entities={users: user_entities, companies: company_entities},
        marks={
            users: Watermark(
                batch_id=11,
                offsets={f"{users}-events": {0: 40, 1: 17}},
                updated_at_ms=1_700_000_000_123,
            ),
            companies: Watermark(batch_id=5, offsets={f"{companies}-events": {0: 9}}),
        },
    )
    for name in (users, companies):
        write_map(redis_client, name, built.entities[name], built.marks[name])
    yield built
    drop_maps(redis_client, users, companies)


def random_key(rng: random.Random) -> Any:
    """Mostly existing keys; also missing ones, other JSON types, and values no key can be."""
    roll = rng.random()
    if roll < 0.6:
        return f"u{rng.randrange(34)}"  # u30..u33 do not exist
    if roll < 0.9:
        return rng.choice([42, 7, True, False, 2.5, None, "", "__meta__"])
    return rng.choice([{"id": "u1"}, ["u1"]])


def random_events(rng: random.Random, n: int) -> list[dict[str, Any]]:
    events = []
    for i in range(n):
        event: dict[str, Any] = {"n": i, "note": rng.choice(["a", "é", "ü\u2028"])}
        if rng.random() < 0.9:
            event["user_id"] = random_key(rng)
        if rng.random() < 0.6:
            event["ctx"] = {"user": random_key(rng)}
        elif rng.random() < 0.3:
            event["ctx"] = "flat"
        if rng.random() < 0.3:
            event["user"] = "a member a lookup replaces"
        events.append(event)
    return events


def split(rng: random.Random, events: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Requests of random sizes, some empty."""
    out = []
    i = 0
    while i < len(events):
        size = rng.choice([0, 1, 2, 5, 17, 30])
        out.append(events[i : i + size])
        i += size
    return out


def request(
    events: Sequence[dict[str, Any]],
    request_id: str,
    *,
    lookups: Sequence[pb.Lookup] | None = None,
    profile: str | None = None,
    freshness: common.Freshness | None = None,
) -> pb.EnrichRequest:
    req = pb.EnrichRequest(
        request_id=request_id, events=[orjson.dumps(e) for e in events], freshness=freshness
    )
    if lookups is not None:
        req.spec.CopyFrom(pb.JoinSpec(lookups=lookups))
    if profile is not None:
        req.profile = profile
    return req


def outcome(event: pb.EnrichedEvent) -> Outcome:
    if event.dropped or event.error:
        assert event.event == b""  # nothing half-enriched leaks out
    return Outcome(
        orjson.loads(event.event) if event.event else None,
        dropped=event.dropped,
        failed=bool(event.error),
        missed=tuple(event.missed),
    )


def assert_answers(
    response: pb.EnrichResponse,
    req: pb.EnrichRequest,
    lookups: Sequence[pb.Lookup],
    maps: Maps,
) -> None:
    events = [orjson.loads(e) for e in req.events]
    assert response.request_id == req.request_id
    assert [e.index for e in response.events] == list(range(len(events)))
    assert [outcome(e) for e in response.events] == [
        reference_join(e, lookups, maps.entities) for e in events
    ]
    looked_up = {lookup.map for lookup in lookups}
    assert set(response.watermarks) == looked_up
    for name in looked_up:
        mark = response.watermarks[name]
        assert mark.batch_id == maps.marks[name].batch_id
        assert {(o.topic, o.partition): o.offset for o in mark.offsets} == {
            (t, p): o for t, ps in maps.marks[name].offsets.items() for p, o in ps.items()
        }


Spec = Callable[[str, str], list[pb.Lookup]]


SPECS: dict[str, Spec] = {
    "left-defaults": lambda u, c: [pb.Lookup(map=u, key_field="user_id")],
    "left-null-alias": lambda u, c: [
        pb.Lookup(map=u, key_field="user_id", alias="user", join=LEFT, on_miss=NULL)
    ],
    "left-omit-projection": lambda u, c: [
        pb.Lookup(
            map=u, key_field="user_id", alias="user", fields=["name", "age", "absent"], on_miss=OMIT
        )
    ],
    "left-error": lambda u, c: [pb.Lookup(map=u, key_field="user_id", on_miss=ERROR)],
    "inner": lambda u, c: [pb.Lookup(map=u, key_field="user_id", join=INNER, fields=["name"])],
    "nested-key-path": lambda u, c: [pb.Lookup(map=u, key_field="ctx.user", alias="who")],
    "dependent-second-map": lambda u, c: [
        pb.Lookup(map=u, key_field="user_id", alias="user"),
        pb.Lookup(
            map=c, key_field="user.company_id", alias="company", join=INNER, fields=["country"]
        ),
    ],
    "two-maps-three-rounds": lambda u, c: [
        pb.Lookup(map=u, key_field="user_id", alias="user"),
        pb.Lookup(map=c, key_field="user.company_id", alias="company", on_miss=OMIT),
        pb.Lookup(map=u, key_field="ctx.user", alias="other", fields=["company_id"]),
        pb.Lookup(map=c, key_field="other.company_id", alias="company2", on_miss=ERROR),
    ],
    "alias-replaces-its-key": lambda u, c: [
        pb.Lookup(map=u, key_field="user_id", alias="user_id"),
        pb.Lookup(map=c, key_field="user_id.company_id", on_miss=OMIT),
    ],
}
