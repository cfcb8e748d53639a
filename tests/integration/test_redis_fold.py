"""The fold in Redis: the ``latest`` function against a real redis-server, its changelog in a
real Kafka topic, and the order encoding on a real Spark session."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta

import orjson
import pyarrow as pa
import pytest
from redis.crc import key_slot

from materializer import record_columns as c
from materializer.clients.redis import client_for
from materializer.config import KafkaConfig, RedisConfig
from materializer.contract.changelog import APP_HEADER, BATCH_HEADER, EXPIRED_HEADER
from materializer.contract.markers import mark_whole
from materializer.contract.redis_layout import (
    EXPIRE_OP,
    changes_key,
    entity_key,
    expired_key,
    expiry_index_key,
    marker_key,
    state_key,
    state_keys_pattern,
)
from materializer.fold.aggregate import AggregateFolder, Spec
from materializer.fold.base import order_column
from materializer.redis.apply import apply_batches
from materializer.redis.deliveries import new_producer, producer_settings
from materializer.redis.expiry import sweep_expired
from materializer.redis.functions import EXPIRE, CopyLost, FoldTarget, load_library
from materializer.redis.prepare import ORDER
from materializer.redis.state_size import StateSize, measure
from materializer.testing.waiting import wait_until
from tests.helpers.redis_fold import apply
from tests.helpers.slices import read_topic


@pytest.fixture()
def target(redis_url: str, kafka_bootstrap: str, new_topic) -> FoldTarget:
    config = RedisConfig(url=redis_url)
    load_library(config)
    name = f"rf{random.randrange(10**9)}"
    mark_whole(client_for(config), name)
    return FoldTarget(
        redis=config,
        map_name=name,
        changelog_topic=new_topic(2),
        producer=producer_settings(KafkaConfig(bootstrap_servers=kafka_bootstrap), 1_048_576),
    )


def entity(client, target: FoldTarget, key: str) -> dict | None:
    raw = client.get(entity_key(target.map_name, key))
    return None if raw is None else orjson.loads(raw)


def changes(client, target: FoldTarget) -> list[tuple[str, str, str]]:
    entries = client.xrange(changes_key(target.map_name))
    return [(f[b"key"].decode(), f[b"op"].decode(), f[b"batch_id"].decode()) for _, f in entries]


def test_greatest_order_wins_and_a_replay_changes_nothing(target, redis_client, kafka_bootstrap):
    first = [("a", "02", {"v": 1}), ("a", "05", {"v": 2}), ("b", "03", {"v": 3}), ("c", "04", None)]
    assert apply(target, 0, first) == 3  # three keys; a's later record wins within the batch
    assert entity(redis_client, target, "a") == {"v": 2}
    assert entity(redis_client, target, "b") == {"v": 3}
    assert entity(redis_client, target, "c") is None
    assert sorted(changes(redis_client, target)) == [
        ("a", "upsert", "0"),
        ("b", "upsert", "0"),
        ("c", "delete", "0"),
    ]

    # The same batch again (a crash before its commit): no entity moves, no second entry.
    apply(target, 0, first)
    assert len(changes(redis_client, target)) == 3

    # A later batch: an older record loses, a newer one wins, a delete removes.
    apply(target, 1, [("a", "04", {"v": 9}), ("b", "06", None), ("c", "01", {"v": 7})])
    assert entity(redis_client, target, "a") == {"v": 2}
    assert entity(redis_client, target, "b") is None
    # The delete's order stays: an older record does not bring the entity back.
    assert entity(redis_client, target, "c") is None
    assert changes(redis_client, target)[-1] == ("b", "delete", "1")
    assert len(changes(redis_client, target)) == 4

    # The changelog holds every touched key's state after each call, applied or not,
    # so the last record per key is the entity as Redis has it.
    last: dict[str, bytes | None] = {}
    for msg in read_topic(kafka_bootstrap, target.changelog_topic):
        last[msg.key().decode()] = msg.value()
        headers = dict(msg.headers())
        assert headers[APP_HEADER] == b"app" and headers[BATCH_HEADER] in (b"0", b"1")
    assert {k: v and orjson.loads(v) for k, v in last.items()} == {
        "a": {"v": 2},
        "b": None,
        "c": None,
    }


def stateful(rows: list[tuple[str, int, int | None]]) -> list[pa.RecordBatch]:
    """(key, offset, amount or None for a delete) of partition 0 of topic ``t``, as the
    ``aggregate`` mode hands them over."""
    return [
        pa.RecordBatch.from_pydict(
            {
                c.KEY: [k for k, _, _ in rows],
                ORDER: [f"{0:010d}{o:019d}" for _, o, _ in rows],
                "__value": [None if a is None else orjson.dumps([str(a)]) for _, _, a in rows],
                "__aux": ["t"] * len(rows),
                "__timestamp_us": pa.array(range(len(rows)), pa.int64()),
                "__dl_key": pa.array([None] * len(rows), pa.binary()),
                "__dl_value": pa.array([None] * len(rows), pa.binary()),
                "__dl_headers": pa.array([None] * len(rows), pa.string()),
            }
        )
    ]


class Intruder(AggregateFolder):
    """Another writer: changes a key's state in Redis while this one folds it, once."""

    def __init__(self, target: FoldTarget, client) -> None:
        super().__init__([Spec("total", "sum", "int", 0), Spec("events", "count", "count", -1)])
        self.target, self.client, self.done = target, client, False

    def __call__(self, state, events):
        if not self.done:
            self.done = True
            theirs, value = super().__call__(state, [(f"{0:010d}{0:019d}", b'["100"]', "u")])
            self.client.set(state_key(self.target.map_name, "k"), theirs)
            self.client.set(entity_key(self.target.map_name, "k"), value)
        return super().__call__(state, events)


def test_a_stateful_fold_skips_a_replay_and_folds_again_after_another_writer(
    target, redis_client, kafka_bootstrap
):
    folder = AggregateFolder([Spec("total", "sum", "int", 0), Spec("events", "count", "count", -1)])
    summed = replace(target, folder=folder)
    batch = stateful([("k", 0, 5), ("k", 1, 6), ("j", 2, 1), ("j", 3, None)])
    done = apply_batches(summed, 0, "app", batch, new_producer(summed))
    assert done.keys == 2
    assert entity(redis_client, target, "k") == {"total": 11, "events": 2}
    assert entity(redis_client, target, "j") is None
    assert sorted(changes(redis_client, target)) == [("j", "delete", "0"), ("k", "upsert", "0")]

    # The same batch again: nothing folds twice, no second change entry, and the
    # changelog gets the state as Redis has it.
    apply_batches(summed, 0, "app", batch, new_producer(summed))
    assert entity(redis_client, target, "k") == {"total": 11, "events": 2}
    assert len(changes(redis_client, target)) == 2
    last = {
        m.key().decode(): m.value() for m in read_topic(kafka_bootstrap, target.changelog_topic)
    }
    assert orjson.loads(last["k"]) == {"total": 11, "events": 2} and last["j"] is None

    # Another writer changes k's state between this fold's read and its write: the write
    # is refused and k is folded again from the state the other writer left.
    raced = replace(target, folder=Intruder(target, redis_client))
    apply_batches(raced, 1, "app", stateful([("k", 4, 1)]), new_producer(raced))
    assert entity(redis_client, target, "k") == {"total": 112, "events": 4}


def test_a_ttl_expires_the_entity_and_its_order_together(target, redis_client):
    ttl = FoldTarget(**{**target.__dict__, "ttl_ms": 60_000})
    apply(ttl, 0, [("k", "1", {"v": 1})])
    entity_ttl = redis_client.pttl(entity_key(target.map_name, "k"))
    order_ttl = redis_client.pttl(state_key(target.map_name, "k"))
    assert 0 < entity_ttl <= 60_000 and 0 < order_ttl <= 60_000


def _changes(client, target: FoldTarget) -> list[tuple[str, str, str]]:
    return [
        (f[b"key"].decode(), f[b"op"].decode(), f[b"batch_id"].decode())
        for _, f in client.xrange(changes_key(target.map_name))
    ]


def _tombstones(bootstrap: str, topic: str) -> list[str]:
    return [
        m.key().decode()
        for m in read_topic(bootstrap, topic)
        if m.value() is None and (EXPIRED_HEADER, b"1") in (m.headers() or [])
    ]


def test_an_expiry_reaches_the_change_stream_and_the_changelog_once(
    target, redis_client, kafka_bootstrap
):
    short = replace(target, ttl_ms=300)
    apply(replace(target, ttl_ms=600_000), 0, [("long", "1", {"v": 1})])
    apply(short, 1, [("a", "1", {"v": 1}), ("b", "1", {"v": 1}), ("c", "1", None)])
    producer = new_producer(short)
    wait_until(
        "the keys to expire",
        lambda: not redis_client.exists(*(entity_key(short.map_name, k) for k in "ab")),
    )
    assert sweep_expired(short, producer) == 2  # not "long", nor "c" (deleted)
    assert sweep_expired(short, producer) == 0  # each expiry once
    expired = [(k, b) for k, op, b in _changes(redis_client, short) if op == EXPIRE_OP]
    assert sorted(expired) == [("a", "-1"), ("b", "-1")]
    assert sorted(_tombstones(kafka_bootstrap, short.changelog_topic)) == ["a", "b"]
    assert redis_client.zrange(expiry_index_key(short.map_name), 0, -1) == [b"long"]


def test_a_key_written_again_before_the_sweep_does_not_expire(target, redis_client):
    short = replace(target, ttl_ms=400)
    apply(short, 0, [("a", "1", {"v": 1})])
    index = expiry_index_key(short.map_name)
    first = redis_client.zscore(index, "a")
    long = replace(target, ttl_ms=60_000)
    apply(long, 1, [("a", "2", {"v": 2})])  # rescored
    assert redis_client.zscore(index, "a") > first
    # An early score (as rehydrate's clock may write) is scored again, not expired.
    redis_client.zadd(index, {"a": 0})
    assert sweep_expired(long, new_producer(long)) == 0
    assert redis_client.zscore(index, "a") > first
    assert entity(redis_client, long, "a") == {"v": 2}


def test_expiries_found_but_not_sent_go_with_the_next_sweep(target, redis_client, kafka_bootstrap):
    short = replace(target, ttl_ms=200)
    apply(short, 0, [("a", "1", {"v": 1})])
    wait_until(
        "the key to expire", lambda: not redis_client.exists(entity_key(short.map_name, "a"))
    )
    # A sweep that stopped after Redis moved the key and before Kafka had its tombstone.
    found = redis_client.execute_command(
        "FCALL",
        EXPIRE,
        1,
        expiry_index_key(short.map_name),
        changes_key(short.map_name),
        "1000",
        entity_key(short.map_name, ""),
        marker_key(short.map_name),
        expiry_index_key(short.map_name),
        expired_key(short.map_name),
        "10",
    )
    assert found == [b"a"]
    assert _tombstones(kafka_bootstrap, short.changelog_topic) == []
    assert sweep_expired(short, new_producer(short)) == 1
    assert _tombstones(kafka_bootstrap, short.changelog_topic) == ["a"]
    assert redis_client.scard(expired_key(short.map_name)) == 0


def test_a_sweep_refuses_a_server_that_lost_the_map(target, redis_client):
    short = replace(target, ttl_ms=60_000)
    apply(short, 0, [("a", "1", {"v": 1})])
    redis_client.delete(marker_key(short.map_name))
    with pytest.raises(CopyLost):
        sweep_expired(short, new_producer(short))


def test_a_deleted_entitys_state_stays_for_its_retention_and_goes_with_the_next_write(
    target, redis_client
):
    held = replace(target, deleted_retention_ms=60_000)
    apply(held, 0, [("a", "1", {"v": 1}), ("b", "1", {"v": 1})])
    apply(held, 1, [("a", "2", None)])
    # Within the retention, a replay of the batch that made it cannot bring it back.
    apply(held, 0, [("a", "1", {"v": 1})])
    assert entity(redis_client, held, "a") is None
    assert 0 < redis_client.pttl(state_key(held.map_name, "a")) <= 60_000
    assert redis_client.pttl(state_key(held.map_name, "b")) == -1
    # Written again, the entity keeps its state for good.
    apply(held, 2, [("a", "3", {"v": 3})])
    assert redis_client.pttl(state_key(held.map_name, "a")) == -1
    assert entity(redis_client, held, "a") == {"v": 3}


def test_the_state_is_measured_in_keys_and_bytes(target, redis_client):
    apply(target, 0, [(f"k{i}", "1", {"v": i}) for i in range(10)])
    apply(target, 1, [(f"k{i}", "2", None) for i in range(3)])
    size = measure(redis_client, target.map_name)
    # Deleted entities keep their state for fold.deleted_retention: 7 live, 3 deleted.
    assert size.keys == 10
    assert size.bytes >= 10 * redis_client.memory_usage(state_key(target.map_name, "k9")) // 2
    assert measure(redis_client, "nothing-here") == StateSize(0, 0)


def test_keys_that_come_and_go_leave_the_state_bounded(target, redis_client):
    churn = replace(target, deleted_retention_ms=200)
    alive: dict[str, dict] = {}
    for cycle in range(6):
        born = [(f"c{cycle}-{i}", f"{cycle}1", {"v": i}) for i in range(40)]
        apply(churn, 2 * cycle, born)
        # Each cycle deletes its keys but the first five.
        gone = [(k, f"{cycle}2", None) for k, _, _ in born[5:]]
        apply(churn, 2 * cycle + 1, gone)
        alive.update({k: e for k, _, e in born[:5]})
    states = state_keys_pattern(churn.map_name)

    def bounded() -> bool:
        return len(list(redis_client.scan_iter(match=states, count=1000))) == len(alive)

    wait_until("the deleted keys' states to go", bounded, timeout=30)
    held = {k: entity(redis_client, churn, k) for k in alive}
    assert held == alive
    assert all(
        entity(redis_client, churn, f"c{c}-{i}") is None for c in range(6) for i in range(5, 40)
    )


def test_a_server_without_the_maps_marker_takes_no_write(target, redis_client, kafka_bootstrap):
    apply(target, 0, [("a", "1", {"v": 1})])
    # As a restart without persistence: every key of the map goes, the marker too.
    redis_client.delete(*redis_client.keys(f"{target.map_name}*"))
    with pytest.raises(CopyLost, match=f"map {target.map_name}: Redis at .* has lost"):
        apply(target, 1, [("b", "2", {"v": 2})])
    assert redis_client.keys(f"{target.map_name}*") == []
    # The batch that failed sent nothing to the changelog: its replay folds it once.
    assert [r.key() for r in read_topic(kafka_bootstrap, target.changelog_topic)] == [b"a"]


def test_a_server_that_lost_the_library_gets_it_again(target, redis_client):
    redis_client.function_delete("materializer")
    apply(target, 0, [("k", "1", {"v": 1})])
    assert entity(redis_client, target, "k") == {"v": 1}


@pytest.mark.parametrize(
    ("key", "same_slot"),
    [
        ("plain", True),
        ("a{tag}b", True),
        ("{x", True),
        ("a{b}c{d}", True),
        ("é{ü}", True),
        # A '}' without a hash tag before it cannot be part of a tag: such keys need a
        # single server (on a cluster the function refuses the non-local key).
        ("x}", False),
        ("{}x", False),
    ],
)
def test_an_order_key_shares_its_entitys_slot_and_stays_out_of_entity_scans(key, same_slot):
    ek = entity_key("users~3", key).encode()
    ok = state_key("users~3", key)
    assert (key_slot(ok) == key_slot(ek)) is same_slot
    assert ok.startswith(state_keys_pattern("users~3")[:-1])
    assert not ok.startswith(b"users~3:")


def test_order_text_sorts_as_the_fold_orders_events(spark):
    from pyspark.sql import functions as F

    rng = random.Random(5)
    moments = [None, -(2**62), -1, 0, 1, 2**40, 2**62]
    base = datetime(2024, 1, 1, tzinfo=UTC)
    rows = []
    for _ in range(60):
        n = rng.choice(moments)
        micros = timedelta(microseconds=rng.randrange(-(10**12), 10**12))
        days = timedelta(days=rng.randrange(-9000, 9000))
        rows.append(
            {
                "n": n,
                "ts": None if n is None else base + micros,
                "d": None if n is None else date(2024, 1, 1) + days,
                "s": rng.choice([None, "", "a", "ab", "b", "aa"]),
                c.PARTITION: rng.randrange(3),
                c.OFFSET: rng.randrange(10**6),
            }
        )
    frame = spark.createDataFrame(
        rows,
        f"n long, ts timestamp, d date, s string, {c.PARTITION} int, {c.OFFSET} long",
    )
    for field in ("n", "ts", "d", "s"):
        ordered = frame.select(
            F.col(field).alias("t"), c.PARTITION, c.OFFSET, order_column(frame, field).alias("o")
        ).collect()
        by_text = sorted(ordered, key=lambda r: r["o"].encode())
        by_fold = sorted(
            ordered,
            key=lambda r: (
                (r["t"] is not None, r["t"] or 0, r[c.PARTITION], r[c.OFFSET])
                if field != "s"
                else (r["t"] is not None, r["t"] or "", r[c.PARTITION], r[c.OFFSET])
            ),
        )
        assert [(r["t"], r[c.PARTITION], r[c.OFFSET]) for r in by_text] == [
            (r["t"], r[c.PARTITION], r[c.OFFSET]) for r in by_fold
        ], field


def test_dead_letters_keep_their_headers_null_values_included(target, kafka_bootstrap, new_topic):
    letters = FoldTarget(**{**target.__dict__, "dead_letter_topic": new_topic(1)})
    headers = [
        {"key": "trace", "value": "dA=="},  # base64 of b"t"
        {"key": "empty"},  # Spark's to_json leaves a null value out
        {"key": "x-error-stage", "value": "ZGVjb2Rl"},  # b"decode"
    ]
    batch = pa.RecordBatch.from_pydict(
        {
            c.KEY: pa.array(["a", None], pa.string()),
            ORDER: pa.array(["01", None], pa.string()),
            "__value": pa.array([b'{"v":1}', None], pa.binary()),
            "__aux": pa.array([None, None], pa.string()),
            # The dead letter is the newer record: the batch's newest folded one is "a".
            "__timestamp_us": pa.array([1_000, 2_000], pa.int64()),
            "__dl_key": pa.array([None, b"k"], pa.binary()),
            "__dl_value": pa.array([None, b"{broken"], pa.binary()),
            "__dl_headers": pa.array([None, orjson.dumps(headers).decode()], pa.string()),
        }
    )
    done = apply_batches(letters, 0, "app", [batch], new_producer(letters))
    assert (done.keys, done.dead_letters, done.newest_timestamp_us) == (1, 1, 1_000)
    [msg] = read_topic(kafka_bootstrap, letters.dead_letter_topic)
    assert (msg.key(), msg.value()) == (b"k", b"{broken")
    assert msg.headers() == [("trace", b"t"), ("empty", None), ("x-error-stage", b"decode")]


def test_an_entity_restored_without_its_state_is_folded_on_not_started_over(target, redis_client):
    """As after ``rehydrate`` (entities from Delta, no fold state) or an earlier version."""
    folder = AggregateFolder([Spec("total", "sum", "int", 0), Spec("events", "count", "count", -1)])
    summed = replace(target, folder=folder)
    redis_client.set(entity_key(target.map_name, "k"), b'{"total":40,"events":4}')
    apply_batches(summed, 7, "app", stateful([("k", 9, 2)]), new_producer(summed))
    assert entity(redis_client, target, "k") == {"total": 42, "events": 5}
    assert redis_client.exists(state_key(target.map_name, "k"))
