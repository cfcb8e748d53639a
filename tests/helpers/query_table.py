"""A Delta table the real pipeline wrote, for the tests of MapService.Query and GetAsOf.

Two waves of events folded by ``start_map`` (Kafka, Spark, Delta, Redis all real),
the table version remembered after each, and the reference folds to compare the
service's rows with. Each test module builds its table once (a module-scoped
fixture over ``build_table``), under a map name of its own.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import grpc
import orjson
import pytest
from deltalake import DeltaTable

from materializer.config import AppConfig
from materializer.contract.table_layout import table_path
from materializer.job import start_map
from materializer.testing import create_topic, produce
from materializer.testing.reference import fold_latest
from materializer.v1 import map_service_pb2 as pb
from materializer.v1 import map_service_pb2_grpc as pb_grpc
from tests.helpers.query_redis import run as serve_and_run
from tests.helpers.slices import config, slice_config

T = TypeVar("T")
NO_TABLE = "people_later"
SCHEMA = "id STRING, name STRING, age INT, tags ARRAY<STRING>, score DOUBLE, joined TIMESTAMP"
FIELDS = ["id", "name", "age", "tags", "score", "joined"]
NAMES = ["Ann", "O'Brien", "back\\slash", "Zoë", "semi;colon", "--dash", "Bob", "ann"]
DEADLINE = 60.0
Entity = dict[str, Any]
Events = list[tuple[bytes | None, bytes | None]]
OLD_QUERY = pb.QueryRequest(where="age >= 20", page_size=5)
"""Started before the second wave and continued after it (on the table's map)."""


def new_map_name() -> str:
    """A map of one test module's own: modules that share a process share one Redis."""
    return f"people{uuid.uuid4().hex[:8]}"


def joined(i: int) -> str:
    """A timestamp in the exact form the pipeline writes (microseconds, Z), some with .000000."""
    when = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(days=i, microseconds=(i % 3) * 123_457)
    return when.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def person(i: int, *, age_shift: int = 0) -> Entity:
    doc: Entity = {"id": f"u{i:02d}", "name": NAMES[i % len(NAMES)], "score": i * 1.25}
    if i % 11:
        doc["age"] = (i * 7 + age_shift) % 100
    if i % 2 == 0:
        doc["tags"] = [f"t{i % 3}", f"t{(i + 1) % 3}"]
    if i % 4:
        doc["joined"] = joined(i)
    if i % 13 == 5:
        doc["name"] = None
    return doc


def upsert(doc: Entity) -> tuple[bytes, bytes]:
    return doc["id"].encode(), orjson.dumps(doc)


def tombstone(i: int) -> tuple[bytes, None]:
    return f"u{i:02d}".encode(), None


def first_wave() -> Events:
    events: Events = [upsert(person(i)) for i in range(70)]
    events += [upsert({**person(i), "name": f"renamed-{i}"}) for i in range(10)]
    events += [tombstone(i) for i in range(60, 65)]
    return events


def second_wave() -> Events:
    events: Events = [upsert(person(i, age_shift=1)) for i in range(20)]  # modified
    events += [tombstone(i) for i in range(20, 30)]  # deleted
    events += [upsert({**person(i), "name": None}) for i in range(30, 35)]  # a field removed
    events += [upsert(person(i)) for i in range(70, 80)]  # created
    return events


@dataclass
class Table:
    """What the module's pipeline wrote, and what the tests compare against."""

    map: str
    cfg: AppConfig
    path: str
    first: dict[str, Entity]
    """The reference fold after the first wave: the table at ``first_version``."""
    latest: dict[str, Entity]
    """The reference fold after both waves: the table at ``latest_version``."""
    first_version: int
    latest_version: int
    old_pages: list[pb.QueryResponse]
    """The first page of ``OLD_QUERY``, read when ``first_version`` was the latest."""


def run(cfg: AppConfig, body: Callable[[pb_grpc.MapServiceStub], Awaitable[T]]) -> T:
    """``body`` against a freshly started server, through a real channel."""
    return serve_and_run(cfg, lambda channel: body(pb_grpc.MapServiceStub(channel)))


async def first_page(stub: pb_grpc.MapServiceStub, request: pb.QueryRequest) -> pb.QueryResponse:
    """One response of a query, then the call is cancelled: a client that stops reading."""
    call = stub.Query(request, timeout=DEADLINE)
    page = await call.read()
    call.cancel()
    assert isinstance(page, pb.QueryResponse)
    return page


async def all_pages(
    stub: pb_grpc.MapServiceStub, request: pb.QueryRequest
) -> list[pb.QueryResponse]:
    return [page async for page in stub.Query(request, timeout=DEADLINE)]


def build_table(
    spark: Any,
    kafka_bootstrap: str,
    redis_url: str,
    tmp: Path,
    map_name: str,
    indexes: list[Any] | None = None,
) -> Table:
    """Both waves through the pipeline into ``map_name``'s table (and its Redis map), the
    map declaring ``indexes``."""
    topic = create_topic(kafka_bootstrap, 2)
    doc = slice_config(tmp, kafka_bootstrap, redis_url, topic, map_name=map_name)
    doc["maps"][map_name]["source"]["schema"] = SCHEMA
    if indexes:
        doc["maps"][map_name]["indexes"] = indexes
    doc["maps"][NO_TABLE] = {
        "source": {"topics": [f"{topic}-later"], "schema": SCHEMA},
        "key": "id",
    }
    cfg = config(doc)
    path = table_path(cfg, map_name)
    old_query = pb.QueryRequest(map=map_name)
    old_query.MergeFrom(OLD_QUERY)

    events = []

    def write(records: Events) -> dict[str, Entity]:
        positions = produce(kafka_bootstrap, topic, records)
        events.extend((p, o, k, v) for (p, o), (k, v) in zip(positions, records, strict=True))
        queries.process_all_available()
        return fold_latest(events, "id", FIELDS)

    queries = start_map(spark, cfg, map_name)
    try:
        first = write(first_wave())
        first_version = DeltaTable(path).version()
        old_pages = [run(cfg, lambda stub: first_page(stub, old_query))]
        latest = write(second_wave())
        latest_version = DeltaTable(path).version()
    finally:
        queries.stop()
    assert latest_version > first_version
    return Table(map_name, cfg, path, first, latest, first_version, latest_version, old_pages)


def rows_of(pages: list[pb.QueryResponse]) -> list[tuple[str, Entity]]:
    return [(row.key, orjson.loads(row.entity)) for page in pages for row in page.rows]


def expected(
    reference: dict[str, Entity], keep: Callable[[Entity], bool]
) -> list[tuple[str, Entity]]:
    return [(key, entity) for key, entity in sorted(reference.items()) if keep(entity)]


def query(table: Table, **request: Any) -> list[pb.QueryResponse]:
    message = pb.QueryRequest(**{"map": table.map, **request})
    return run(table.cfg, lambda stub: all_pages(stub, message))


def query_error(table: Table, **request: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        query(table, **request)
    return info.value


def has(field: str, test: Callable[[Any], bool]) -> Callable[[Entity], bool]:
    """SQL's three-valued logic for a comparison: a missing (null) field never matches."""
    return lambda e: e.get(field) is not None and test(e[field])


Op = pb.Comparison.Operator


def cmp(field: str, op: int, value: pb.Value | None = None, **kw: Any) -> pb.Predicate:
    return pb.Predicate(comparison=pb.Comparison(field=field, op=op, value=value, **kw))


def n(number: int) -> pb.Value:
    return pb.Value(int_value=number)
