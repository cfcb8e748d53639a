"""The enrichment join without a server: rounds, key rules, and the read-ahead inbox."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from materializer.enrichment.plan import JoinPlan
from materializer.enrichment.rounds import BadKey, apply_round, key_of, round_keys
from materializer.v1 import enrich_service_pb2 as pb
from query_service.enrich.events import parse_event
from query_service.enrich.inbox import Inbox
from query_service.enrich.plan import plan_from_spec
from query_service.errors import InvalidArgument
from tests.helpers.enrich_reference import Outcome, reference_join

MAPS = ("a", "b")


def lookup(map_name: str, key_field: str, **kw: Any) -> pb.Lookup:
    return pb.Lookup(map=map_name, key_field=key_field, **kw)


def run_plan(
    plan: JoinPlan, events: list[dict[str, Any]], maps: dict[str, dict[str, Any]]
) -> list[Outcome]:
    """The service's join over in-memory maps: rounds, keys taken before each round."""
    states = [parse_event(orjson.dumps(e), "event") for e in events]
    stored = {m: {k: orjson.dumps(v) for k, v in entities.items()} for m, entities in maps.items()}
    for steps in plan.rounds:
        keys = round_keys(states, steps)
        apply_round(states, steps, keys, stored)
    return [
        Outcome(
            None if s.doc is None else orjson.loads(s.encoded()),
            dropped=s.dropped,
            failed=bool(s.error),
            missed=tuple(s.missed),
        )
        for s in states
    ]


def test_dependent_lookups_start_new_rounds() -> None:
    spec = pb.JoinSpec(
        lookups=[
            lookup("a", "user_id", alias="user"),
            lookup("b", "user.company_id", alias="company"),
            lookup("a", "ctx.user", alias="other"),
            lookup("b", "other.company_id", alias="company2", fields=["name"]),
        ]
    )

    plan = plan_from_spec(spec, MAPS, "spec")

    assert [[s.alias for s in r] for r in plan.rounds] == [
        ["user"],
        ["company", "other"],
        ["company2"],
    ]
    # Decoded only where looked into (user, other) or projected (company2).
    assert [s.parse for r in plan.rounds for s in r] == [True, False, True, True]
    assert plan.maps == ("a", "b")


def test_a_lookup_keyed_on_its_own_alias_member_stays_in_one_round() -> None:
    # The key is read before the entity replaces it, as one lookup at a time would.
    spec = pb.JoinSpec(lookups=[lookup("a", "id", alias="id"), lookup("b", "x", alias="y")])

    plan = plan_from_spec(spec, MAPS, "spec")

    assert len(plan.rounds) == 1
    assert run_plan(plan, [{"id": "k"}], {"a": {"k": {"v": 1}}, "b": {}}) == [
        Outcome({"id": {"v": 1}, "y": None}, missed=("y",))
    ]


@pytest.mark.parametrize(
    ("doc", "path", "key"),
    [
        ({"k": "u1"}, ("k",), "u1"),
        ({"k": 42}, ("k",), "42"),
        ({"k": -7}, ("k",), "-7"),
        ({"k": 2.5}, ("k",), "2.5"),
        ({"k": True}, ("k",), "true"),
        ({"k": False}, ("k",), "false"),
        ({"k": None}, ("k",), None),
        ({}, ("k",), None),
        ({"k": ""}, ("k",), None),
        ({"k": "__meta__"}, ("k",), None),
        ({"a": {"b": {"c": "deep"}}}, ("a", "b", "c"), "deep"),
        ({"a": "text"}, ("a", "b"), None),
        ({"a": None}, ("a", "b"), None),
        ({"k": {"x": 1}}, ("k",), BadKey("an object")),
        ({"k": [1]}, ("k",), BadKey("an array")),
    ],
)
def test_key_rules(doc: dict[str, Any], path: tuple[str, ...], key: object) -> None:
    assert key_of(doc, path) == key


@pytest.mark.parametrize(
    ("raw", "mentions"),
    [
        (b"{", "not a UTF-8 JSON object"),
        (b'{"a":"\xff"}', "not a UTF-8 JSON object"),
        (b"[1]", "not an array"),
        (b"null", "not null"),
        (b'"s"', "not a string"),
        (b"", "not a UTF-8 JSON object"),
    ],
)
def test_events_must_be_json_objects(raw: bytes, mentions: str) -> None:
    with pytest.raises(InvalidArgument, match="events\\[3\\]") as info:
        parse_event(raw, "events[3]")
    assert mentions in str(info.value)


# --- the rounds against one lookup at a time, on random joins --------------------------

NAMES = ["k", "user", "x", "a"]
PATHS = ["k", "user", "user.k", "x.k", "a.user", "x", "a.k"]
VALUES = st.one_of(
    st.sampled_from(["k1", "k2", "k3", "", "__meta__"]),
    st.integers(0, 3),
    st.booleans(),
    st.none(),
    st.just({"k": "k1"}),
    st.just([1]),
)
ENTITY = st.fixed_dictionaries(
    {},
    optional={
        "k": st.sampled_from(["k1", "k2", "k9", "1", "true"]),
        "user": st.sampled_from(["k1", "k3"]),
        "n": st.integers(0, 9),
    },
)
LOOKUPS = st.lists(
    st.builds(
        lookup,
        map_name=st.sampled_from(MAPS),
        key_field=st.sampled_from(PATHS),
        alias=st.sampled_from(["", *NAMES]),
        fields=st.lists(st.sampled_from(["k", "user", "n", "zz"]), max_size=2),
        join=st.sampled_from(list(pb.Lookup.Join.values())),
        on_miss=st.sampled_from(list(pb.Lookup.OnMiss.values())),
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=300, deadline=None)
@given(
    lookups=LOOKUPS,
    events=st.lists(
        st.dictionaries(
            st.sampled_from(NAMES), st.one_of(VALUES, st.dictionaries(st.just("k"), VALUES))
        ),
        max_size=8,
    ),
    maps=st.fixed_dictionaries(
        {
            m: st.dictionaries(st.sampled_from(["k1", "k2", "k3", "0", "1", "true"]), ENTITY)
            for m in MAPS
        }
    ),
)
def test_rounds_give_what_one_lookup_at_a_time_gives(
    lookups: list[pb.Lookup], events: list[dict[str, Any]], maps: dict[str, dict[str, Any]]
) -> None:
    plan = plan_from_spec(pb.JoinSpec(lookups=lookups), MAPS, "spec")

    assert run_plan(plan, events, maps) == [reference_join(e, lookups, maps) for e in events]


# --- the inbox --------------------------------------------------------------------------


async def drain(inbox: Inbox[int], task: asyncio.Task[None]) -> list[list[int]]:
    """Every batch the inbox hands over until its source ends."""
    batches = []
    while batch := await inbox.take():
        batches.append(batch)
    await task
    return batches


def test_inbox_hands_over_all_waiting_items_and_reads_ahead_only_to_its_limit() -> None:
    pulled: list[int] = []

    async def source() -> AsyncIterator[int]:
        for i in range(25):
            pulled.append(i)
            yield i

    async def main() -> list[list[int]]:
        inbox: Inbox[int] = Inbox(lambda _: 1, limit=10)
        task = inbox.read_from(source(), "reader")
        for _ in range(1000):  # let the reader run as far as the bound allows
            await asyncio.sleep(0)
        # Ten waiting, and the eleventh read but held back until there is room.
        assert len(pulled) == 11
        return await drain(inbox, task)

    batches = asyncio.run(main())

    assert batches[0] == list(range(10))
    assert [i for b in batches for i in b] == list(range(25))
    assert all(len(b) <= 10 for b in batches)


def test_inbox_passes_on_the_source_error_after_what_came_before() -> None:
    async def source() -> AsyncIterator[int]:
        yield 1
        yield 2
        raise RuntimeError("stream broke")

    async def main() -> list[int]:
        inbox: Inbox[int] = Inbox(lambda _: 1, limit=10)
        task = inbox.read_from(source(), "reader")
        await asyncio.wait([task])
        got = await inbox.take()
        with pytest.raises(RuntimeError, match="stream broke"):
            await inbox.take()
        return got

    assert asyncio.run(main()) == [1, 2]


def test_inbox_gives_an_oversized_item_a_batch_of_its_own() -> None:
    async def main() -> list[list[int]]:
        async def source() -> AsyncIterator[int]:
            for w in (3, 30, 4, 5):
                yield w

        inbox: Inbox[int] = Inbox(lambda w: w, limit=10)
        return await drain(inbox, inbox.read_from(source(), "reader"))

    batches = asyncio.run(main())

    assert [i for b in batches for i in b] == [3, 30, 4, 5]
    assert [30] in batches
