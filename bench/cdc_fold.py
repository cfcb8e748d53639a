"""A table's change log folded through ``materializer run``: Debezium's envelope against the
same rows written as plain JSON.

N changes over K rows of one table, produced twice into 4-partition topics: as Debezium's
PostgreSQL connector writes them with Kafka Connect's JSON converter (``--wrapper``: with
its ``schema``/``payload`` wrapper; default: without, ``schemas.enable: false``), a
snapshot read (``op: r``) of every row, then updates, deletes with their tombstones and
creates, the row in ``after`` with Debezium's encodings (a decimal's unscaled bytes in
base64, a timestamp in epoch microseconds, a timestamptz as ISO text) beside its
``source`` block; and as the plain JSON of each row after the change (a delete as a
tombstone), decimals as numbers, timestamps as text. Each topic is folded by a cold
``materializer run`` of one ``latest`` map with every setting at its default, one after
the other.

  fold_s          the fold query's start to every key (the map's watermark at the
                  topic's end);
  ratio           the plain topic's fold_s over the envelope's: the goal is 0.8 or more
                  (an envelope map folds at least 80% as fast).

    .venv/bin/python bench/cdc_fold.py [--events N] [--keys K] [--wrapper]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import redis
import yaml
from bulk_run import folded_to, topic_end
from harness import PARTITIONS, bulk_producer, emit, run_doc, services, setup_line
from live import wait_for

from materializer.testing import create_topic
from materializer.testing.process import ManagedProcess

ROW = (
    "id INT, name STRING, email STRING, city STRING, credit DECIMAL(12,2), visits BIGINT, "
    "seen TIMESTAMP_NTZ, updated TIMESTAMP"
)
SOURCE = {
    "version": "3.6.1.Final",
    "connector": "postgresql",
    "name": "shop",
    "snapshot": "false",
    "db": "shop",
    "sequence": '["26390704","26390760"]',
    "schema": "public",
    "table": "customers",
    "txId": 736,
    "lsn": 26390760,
    "xmin": None,
}
WRAPPER_SCHEMA = orjson.loads(
    '{"type":"struct","fields":[{"type":"struct","fields":['
    '{"type":"int32","optional":false,"field":"id"},'
    '{"type":"string","optional":true,"field":"name"},'
    '{"type":"string","optional":true,"field":"email"},'
    '{"type":"string","optional":true,"field":"city"},'
    '{"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal",'
    '"version":1,"parameters":{"scale":"2","connect.decimal.precision":"12"},"field":"credit"},'
    '{"type":"int64","optional":true,"field":"visits"},'
    '{"type":"int64","optional":true,"name":"io.debezium.time.MicroTimestamp","version":1,'
    '"field":"seen"},'
    '{"type":"string","optional":true,"name":"io.debezium.time.ZonedTimestamp","version":1,'
    '"field":"updated"}],"optional":true,"name":"shop.public.customers.Value","field":"after"},'
    '{"type":"string","optional":false,"field":"op"},'
    '{"type":"int64","optional":true,"field":"ts_ms"}],'
    '"optional":false,"name":"shop.public.customers.Envelope","version":2}'
)
"""The JSON converter's schema of the envelope (before and source left out for brevity's
sake: the reader keeps only after's field names and parameters)."""
EPOCH_US = 1_700_000_000_000_000


def rows(rng: random.Random, n: int, keys: int) -> Iterator[tuple[int, str, dict[str, Any] | None]]:
    """N changes: a snapshot read of every row, then changes of random rows: an update, a
    delete now and then, a create of a deleted row: (id, op, the row after it; None for a
    delete)."""
    deleted: set[int] = set()
    for seq in range(n):
        if seq < keys:
            key, op = seq, "r"
        else:
            key = rng.randrange(keys)
            op = "c" if key in deleted else "u"
            deleted.discard(key)
            if op == "u" and rng.random() < 0.05:
                deleted.add(key)
                yield key, "d", None
                continue
        micros = EPOCH_US + seq * 1000
        yield (
            key,
            op,
            {
                "id": key,
                "name": f"Name {seq % 9973}",
                "email": f"user-{key}@example.org",
                "city": ("Lisbon", "Oslo", "Quito", "Perth")[seq % 4],
                "credit": Decimal(rng.randrange(10**8)).scaleb(-2),
                "visits": seq,
                "seen": micros,
                "updated": micros + 7_000_000,
            },
        )


def iso(micros: int, zone: str = "") -> str:
    seconds, fraction = divmod(micros, 1_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{fraction:06d}{zone}"


def plain(row: dict[str, Any]) -> bytes:
    """The row as plain JSON: a decimal as a number, timestamps as text."""
    out = dict(row, credit=orjson.Fragment(str(row["credit"])))
    out["seen"], out["updated"] = iso(row["seen"]), iso(row["updated"], "Z")
    return orjson.dumps(out)


def debezium(row: dict[str, Any]) -> dict[str, Any]:
    """The row as Debezium's JSON converter encodes it."""
    unscaled = int(row["credit"].scaleb(2))
    size = max(1, (unscaled.bit_length() + 8) // 8)
    credit = base64.b64encode(unscaled.to_bytes(size, "big", signed=True)).decode()
    return dict(row, credit=credit, updated=iso(row["updated"], "Z"))


def envelope(op: str, key: int, row: dict[str, Any] | None, seq: int, wrapper: bool) -> bytes:
    doc = {
        "before": {"id": key} if op == "d" else None,
        "after": None if row is None else debezium(row),
        "source": dict(
            SOURCE, ts_ms=1_700_000_000_000 + seq, snapshot="true" if op == "r" else "false"
        ),
        "transaction": None,
        "op": op,
        "ts_ms": 1_700_000_000_100 + seq,
    }
    return orjson.dumps({"schema": WRAPPER_SCHEMA, "payload": doc} if wrapper else doc)


def produce(bootstrap: str, topics: dict[str, str], n: int, keys: int, wrapper: bool) -> None:
    """The same changes into both topics, keyed by the row's id as each writes it."""
    producer = bulk_producer(bootstrap)
    rng = random.Random(50)
    key_json = {"schema": {"type": "struct"}, "payload": None} if wrapper else None
    for seq, (key, op, row) in enumerate(rows(rng, n, keys)):
        as_debezium = orjson.dumps(dict(key_json, payload={"id": key}) if key_json else {"id": key})
        producer.produce(topics["debezium"], envelope(op, key, row, seq, wrapper), as_debezium)
        if op == "d":
            producer.produce(topics["debezium"], None, as_debezium)
        producer.produce(topics["plain"], None if row is None else plain(row), str(key).encode())
        if seq % 10_000 == 0:
            producer.flush()
    producer.flush()


def write_config(work: Path, bootstrap: str, redis_url: str, topic: str, name: str) -> Path:
    source: dict[str, Any] = {"topics": [topic], "format": "json", "schema": ROW}
    if name == "debezium":
        source["envelope"] = "debezium"
    doc = run_doc(work, bootstrap, redis_url, {name: {"source": source, "key": "$kafka_key"}})
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def fold(
    work: Path, bootstrap: str, redis_url: str, client: redis.Redis, topic: str, name: str
) -> float:
    """Seconds from the fold query's start to the map's watermark at the topic's end."""
    end = topic_end(bootstrap, topic)
    config = write_config(work, bootstrap, redis_url, topic, name)
    log = work / f"{name}.log"
    proc = ManagedProcess([sys.executable, "-m", "materializer", "run", "-c", str(config)], log)
    try:
        line = f"query={name}.fold started"
        wait_for(
            "the fold query's start", lambda: line in log.read_text(errors="replace"), 600, proc
        )
        started = time.perf_counter()
        wait_for("every change folded", lambda: folded_to(client, name, topic, end), 1800, proc)
        return time.perf_counter() - started
    finally:
        proc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--wrapper", action="store_true")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="materializer-cdc-fold-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        bootstrap, redis_url = stack.enter_context(services())
        client = redis.Redis.from_url(redis_url)
        stack.callback(client.close)
        setup_line("local[*]", args.events, args.keys)
        topics = {name: create_topic(bootstrap, PARTITIONS) for name in ("plain", "debezium")}
        produce(bootstrap, topics, args.events, args.keys, args.wrapper)
        seconds = {}
        for name, topic in topics.items():
            client.flushall()
            seconds[name] = fold(work, bootstrap, redis_url, client, topic, name)
            records = sum(topic_end(bootstrap, topic).values())
            emit(
                name=f"cdc_fold_{name}",
                units="s, records/s",
                changes=args.events,
                rows=args.keys,
                records=records,
                wrapper=args.wrapper,
                fold_s=round(seconds[name], 2),
                records_per_s=round(records / seconds[name]),
                changes_per_s=round(args.events / seconds[name]),
            )
        emit(
            name="cdc_fold",
            changes=args.events,
            rows=args.keys,
            wrapper=args.wrapper,
            ratio=round(seconds["plain"] / seconds["debezium"], 3),
            goal_ratio=0.8,
            loadavg_1m=round(os.getloadavg()[0], 2),
        )


if __name__ == "__main__":
    main()
