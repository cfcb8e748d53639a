"""The SQL benchmark's maps: their Delta tables, the Redis copy of ``users``, the config.

Three maps, each a table of ``_key`` and the entity's fields: ``users`` (1M entities by
default), ``customers`` and ``orders`` (100k each; every order names a customer). Each
table is written as the pipeline's default Delta engine (``delta.merge_engine:
delta_rs``) writes a map's: created by delta-rs, one MERGE on ``_key`` of every entity
(a backlog's batch), then a few MERGEs of changed entities (live batches), each of which
rewrites the files it touches. The pipeline itself is not run: this writes the same
table layout in seconds instead of a Kafka topic and a Spark fold.

``users`` is also written to Redis, the entities as the fold leaves them (its final
values, under ``<map>:<key>`` as JSON) with its watermark and marker, so ``Get`` and a
key lookup through SQL read the same entities as the table holds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import redis
import yaml
from deltalake import DeltaTable

from materializer.contract.markers import mark_whole
from materializer.contract.redis_layout import entity_key, meta_key
from materializer.contract.table_layout import TABLE_KEY
from materializer.contract.watermark import Watermark

TIERS = ["free", "basic", "pro", "team", "enterprise"]
REGIONS = [f"region-{i:02d}" for i in range(20)]
PARTITIONS = 4
APP_ID = "bench:sql"
CHANGE_BATCHES = 3
"""MERGEs of changed entities after the first one, as live batches."""
CHANGED_PER_BATCH = 2000
LOAD_CHUNK = 2000
"""SETs per pipelined round trip, as the materializer's Redis sink writes them."""
PEOPLE = (
    "id STRING, name STRING, tier STRING, region STRING, spend DOUBLE, age INT, updated_at BIGINT"
)
ORDERS = "id STRING, user_id STRING, amount DOUBLE, sku STRING, qty INT, updated_at BIGINT"


@dataclass
class Map:
    """One map's final entities, column by column (``_key`` first), and what changes."""

    name: str
    schema: str
    columns: dict[str, np.ndarray[Any, Any]]
    changing: str
    """The numeric field each change batch gives new values."""

    @property
    def rows(self) -> int:
        return len(self.columns[TABLE_KEY])

    def table(self, rows: np.ndarray[Any, Any] | None = None) -> pa.Table:
        """The entities (those at ``rows``, or all) as the table's rows."""
        arrays = {n: c if rows is None else c[rows] for n, c in self.columns.items()}
        table = pa.table({n: pa.array(a) for n, a in arrays.items()})
        return table.cast(table.schema.set(0, pa.field(TABLE_KEY, pa.string(), nullable=False)))


def keys(prefix: str, n: int) -> np.ndarray[Any, Any]:
    digits = len(str(max(n - 1, 1)))
    return np.array([f"{prefix}-{i:0{digits}d}" for i in range(n)], dtype=object)


def people(name: str, prefix: str, n: int, rng: np.random.Generator) -> Map:
    ids = keys(prefix, n)
    columns = {
        TABLE_KEY: ids,
        "id": ids,
        "name": np.array([f"Name {i % 9973}" for i in range(n)], dtype=object),
        "tier": np.array(TIERS, dtype=object)[rng.integers(0, len(TIERS), n)],
        "region": np.array(REGIONS, dtype=object)[rng.integers(0, len(REGIONS), n)],
        "spend": np.round(rng.random(n) * 1000, 2),
        "age": rng.integers(18, 80, n).astype(np.int32),
        "updated_at": 1_700_000_000_000 + np.arange(n, dtype=np.int64),
    }
    return Map(name, PEOPLE, columns, "spend")


def orders(n: int, customers: Map, rng: np.random.Generator) -> Map:
    ids = keys("order", n)
    columns = {
        TABLE_KEY: ids,
        "id": ids,
        "user_id": customers.columns[TABLE_KEY][rng.integers(0, customers.rows, n)],
        "amount": np.round(rng.random(n) * 500 + 1, 2),
        "sku": np.array([f"sku-{i % 10_000:05d}" for i in range(n)], dtype=object),
        "qty": (1 + np.arange(n) % 5).astype(np.int32),
        "updated_at": 1_700_000_000_000 + np.arange(n, dtype=np.int64),
    }
    return Map("orders", ORDERS, columns, "amount")


def maps(users: int, customers: int, order_count: int) -> list[Map]:
    rng = np.random.default_rng(42)
    buyers = people("customers", "cust", customers, rng)
    return [people("users", "user", users, rng), buyers, orders(order_count, buyers, rng)]


def write_table(root: Path, m: Map, rng: np.random.Generator) -> dict[str, Any]:
    """The map's Delta table, MERGEd as the pipeline's delta-rs engine does; the map's
    columns end as its final entities."""
    started = time.perf_counter()
    path = str(root / m.name)
    first = m.table()
    DeltaTable.create(path, first.schema)
    merge(path, first)
    for batch in range(CHANGE_BATCHES):
        rows = rng.choice(m.rows, min(CHANGED_PER_BATCH, m.rows), replace=False)
        m.columns[m.changing][rows] = np.round(m.columns[m.changing][rows] + batch + 1.25, 2)
        m.columns["updated_at"][rows] += 10_000_000 * (batch + 1)
        merge(path, m.table(rows))
    table = DeltaTable(path)
    sizes = table.get_add_actions(flatten=True).column("size_bytes").to_pylist()
    return {
        "map": m.name,
        "rows": m.rows,
        "version": table.version(),
        "files": len(sizes),
        "bytes": sum(sizes),
        "seconds": round(time.perf_counter() - started, 2),
    }


def merge(path: str, rows: pa.Table) -> None:
    """One batch's MERGE on ``_key`` (update or insert every column), as ``DeltaSink``."""
    columns = {name: f"s.{name}" for name in rows.schema.names}
    (
        DeltaTable(path)
        .merge(rows, predicate=f"t.{TABLE_KEY} = s.{TABLE_KEY}", source_alias="s", target_alias="t")
        .when_matched_update(updates=columns)
        .when_not_matched_insert(updates=columns)
        .execute()
    )


def load_redis(client: redis.Redis, m: Map) -> dict[str, Any]:
    """The map's entities under ``<map>:<key>`` (pipelined SETs of their JSON, as the sink
    writes them), its watermark, and its marker (its copy is whole)."""
    started = time.perf_counter()
    fields = [n for n in m.columns if n != TABLE_KEY]
    values = [m.columns[n].tolist() for n in fields]
    pipe = client.pipeline(transaction=False)
    size = 0
    for i, key in enumerate(m.columns[TABLE_KEY].tolist()):
        entity = orjson.dumps(dict(zip(fields, (v[i] for v in values), strict=True)))
        size += len(entity)
        pipe.set(entity_key(m.name, key), entity)
        if (i + 1) % LOAD_CHUNK == 0:
            pipe.execute()
    pipe.execute()
    mark = Watermark(
        batch_id=CHANGE_BATCHES,
        offsets={topic(m.name): {p: m.rows // PARTITIONS for p in range(PARTITIONS)}},
        updated_at_ms=int(time.time() * 1000),
        app_id=APP_ID,
    )
    client.hset(meta_key(m.name), mapping=dict[Any, Any](mark.to_hash()))
    mark_whole(client, m.name)
    seconds = time.perf_counter() - started
    return {
        "map": m.name,
        "entities": m.rows,
        "seconds": round(seconds, 2),
        "avg_entity_bytes": round(size / m.rows),
    }


def topic(map_name: str) -> str:
    return f"{map_name}-events"


def write_config(
    path: Path, redis_url: str, warehouse: Path, all_maps: list[Map], flight_port: int
) -> None:
    """The query service's YAML: Redis, the warehouse and the maps; SQL at its defaults,
    with Arrow Flight SQL on ``flight_port`` (0: off)."""
    doc: dict[str, Any] = {
        "redis": {"url": redis_url},
        "delta": {"root": str(warehouse)},
        "maps": {
            m.name: {
                "source": {"topics": [topic(m.name)], "format": "json", "schema": m.schema},
                "key": "id",
            }
            for m in all_maps
        },
    }
    if flight_port:
        doc["query"] = {"sql": {"flight_port": flight_port}}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
