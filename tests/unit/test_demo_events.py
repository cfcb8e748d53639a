"""The demo's event stream: replayable from its seed, and shaped like the domain says."""

from __future__ import annotations

import itertools

import orjson

from materializer.demo.domain import ORDERS, USER_EVENTS, USER_FIELDS
from materializer.demo.events import MIN_USERS, EventGenerator, iso_time

START_US = 1_750_000_000_000_000


def _events(seed: int, n: int, rate: float = 200):
    return list(itertools.islice(EventGenerator(seed, START_US, rate), n))


def test_the_same_seed_gives_the_same_bytes_and_another_seed_another_stream():
    first = [(e.topic, e.key, e.encoded()) for e in _events(3, 3000)]
    assert first == [(e.topic, e.key, e.encoded()) for e in _events(3, 3000)]
    assert first != [(e.topic, e.key, e.encoded()) for e in _events(4, 3000)]


def test_event_times_follow_the_schedule_in_the_materializers_timestamp_form():
    events = _events(1, 500, rate=250)
    assert iso_time(START_US) == "2025-06-15T15:06:40.000000Z"
    for i, event in enumerate(events):
        assert event.value is None or iso_time(START_US + i * 4000) in event.value.values()


def test_users_sign_up_update_some_fields_order_and_are_deleted_for_good():
    live: set[str] = set()
    deleted: set[str] = set()
    seen = {"signup": 0, "update": 0, "order": 0, "delete": 0}
    for i, event in enumerate(_events(1, 20_000)):
        assert event.user_id not in deleted
        value = event.value
        if event.topic == ORDERS:
            assert value is not None and value["user_id"] in live
            assert 1.0 <= value["amount"] <= 5000.0
            assert round(value["amount"], 2) == value["amount"]
            seen["order"] += 1
        elif value is None:
            assert event.user_id in live and len(live) >= MIN_USERS
            live.remove(event.user_id)
            deleted.add(event.user_id)
            seen["delete"] += 1
        elif event.user_id not in live:
            assert set(value) == set(USER_FIELDS)
            live.add(event.user_id)
            seen["signup"] += 1
        else:
            assert event.topic == USER_EVENTS
            assert {"id", "updated_at"} < set(value) < set(USER_FIELDS)
            assert len(value) == 3
            seen["update"] += 1
        assert i >= MIN_USERS or seen == {"signup": i + 1, "update": 0, "order": 0, "delete": 0}
    assert min(seen.values()) > 100, seen


def test_the_kafka_record_is_the_user_id_and_compact_json_or_a_tombstone():
    events = _events(2, 2000)
    for event in events:
        assert event.key == event.user_id.encode()
        encoded = event.encoded()
        assert encoded is None if event.value is None else orjson.loads(encoded) == event.value
