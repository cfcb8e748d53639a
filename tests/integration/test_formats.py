"""Value formats other than declared-schema JSON, end to end on real services."""

from __future__ import annotations

import io
import random
from pathlib import Path

import fastavro
import orjson

from materializer.contract.table_layout import table_path
from materializer.job import start_map
from materializer.testing import produce
from materializer.testing.reference import fold_latest
from tests.helpers.slices import config, delta_map_rs, redis_map

AVRO_SCHEMA = {
    "type": "record",
    "name": "User",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "name", "type": ["null", "string"], "default": None},
        {"name": "age", "type": "int"},
    ],
}


def avro(doc: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(AVRO_SCHEMA), doc)
    return out.getvalue()


def test_avro_from_a_schema_file(
    spark, kafka_bootstrap, redis_url, redis_client, new_topic, tmp_path: Path
):
    topic = new_topic(2)
    schema_file = tmp_path / "user.avsc"
    schema_file.write_text(orjson.dumps(AVRO_SCHEMA).decode())
    doc = {
        "kafka": {"bootstrap_servers": kafka_bootstrap},
        "redis": {"url": redis_url},
        "delta": {"root": str(tmp_path / "warehouse")},
        "spark": {"checkpoint_root": str(tmp_path / "checkpoints")},
        "maps": {
            "avro_users": {
                "source": {"topics": [topic], "format": "avro", "schema_file": str(schema_file)},
                "key": "id",
                "dead_letter": {"topic": f"{topic}.dlq"},
            }
        },
    }
    rng = random.Random(5)
    docs = []
    records: list[tuple[bytes | None, bytes | None]] = []
    for i in range(200):
        uid = f"a{rng.randrange(20)}"
        if rng.random() < 0.1:
            records.append((uid.encode(), None))
            docs.append(None)
            continue
        user = {"id": uid, "name": None if i % 7 == 0 else f"n{i}", "age": i}
        records.append((uid.encode(), avro(user)))
        docs.append(user)
    records.append((b"junk", b"\xff\xfe not avro"))
    docs.append(None)
    positions = produce(kafka_bootstrap, topic, records)
    queries = start_map(spark, config(doc), "avro_users")
    try:
        queries.process_all_available()
    finally:
        queries.stop()

    # The reference folds the same users as JSON: Avro decoding must yield the same entities.
    as_json = [
        (p, o, k, None if v is None else (orjson.dumps(d) if d is not None else b"not json"))
        for (p, o), (k, v), d in zip(positions, records, docs, strict=True)
    ]
    reference = fold_latest(as_json, "id", ["id", "name", "age"])
    assert redis_map(redis_client, "avro_users") == reference
    assert delta_map_rs(Path(table_path(config(doc), "avro_users"))) == reference
