"""Dead letters of every kind keep their record whole, however big, and the map goes on."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import Consumer

from materializer.config.names import dead_letter_topic
from materializer.job import start_map
from materializer.testing import create_topic, produce
from tests.helpers.slices import config, redis_map, slice_config, watermark

BIG = 4 * 1024 * 1024


def _read_all(bootstrap: str, topic: str, expected: int) -> list[tuple[bytes | None, bytes, dict]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{topic}",
            "auto.offset.reset": "earliest",
            "fetch.max.bytes": 2 * BIG,
        }
    )
    consumer.subscribe([topic])
    out = []
    try:
        for _ in range(120):
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                headers = {k: v for k, v in msg.headers() or []}
                out.append((msg.key(), msg.value(), headers))
            if len(out) >= expected:
                break
    finally:
        consumer.close()
    return out


def test_big_null_keyed_and_mistyped_records_reach_the_dead_letter_topic_whole(
    spark, kafka_bootstrap, redis_url, redis_client, tmp_path: Path
):
    # The source takes records up to 4 MB; the dead-letter topic does not exist yet.
    topic = create_topic(kafka_bootstrap, 1, config={"max.message.bytes": str(BIG)})
    cfg = config(slice_config(tmp_path, kafka_bootstrap, redis_url, topic, map_name="letters"))
    two_mb_garbage = b"{" + b"x" * (2 * 1024 * 1024)
    records: list[tuple[bytes | None, bytes | None]] = [
        (b"a", b'{"id": "a", "name": "Ann", "age": 30}'),
        (b"huge", two_mb_garbage),  # 2 MB, not JSON
        (None, b'{"id": null, "name": "no key at all"}'),  # null Kafka key, null id
        (b"t", b'{"id": "t", "tags": "not-an-array"}'),  # wrong type in a collection
        (b"n", b'{"id": "n", "age": 12.5e40}'),  # a number too big for INT
        (b"b", b'{"id": "b", "name": "Bob"}'),
    ]
    produce(kafka_bootstrap, topic, records, settings={"message.max.bytes": BIG + 1024})
    queries = start_map(spark, cfg, "letters")
    try:
        queries.process_all_available()
    finally:
        queries.stop()

    assert redis_map(redis_client, "letters") == {
        "a": {"id": "a", "name": "Ann", "age": 30},
        "b": {"id": "b", "name": "Bob"},
    }
    mark = watermark(redis_client, "letters")
    assert mark is not None and mark.offsets == {topic: {0: len(records)}}

    letters = _read_all(kafka_bootstrap, dead_letter_topic(cfg, "letters"), 4)
    by_offset = {int(h["x-source-offset"]): (k, v, h) for k, v, h in letters}
    assert sorted(by_offset) == [1, 2, 3, 4]
    expected_stage = {1: b"decode", 2: b"key", 3: b"decode", 4: b"decode"}
    for offset, stage in expected_stage.items():
        key, value, headers = by_offset[offset]
        assert (key, value) == records[offset]
        assert headers["x-error-stage"] == stage
        assert headers["x-source-topic"] == topic.encode()
        assert headers["x-source-partition"] == b"0"
        assert headers["x-error-message"]
    assert len(by_offset[1][1]) == len(two_mb_garbage)
