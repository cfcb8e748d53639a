"""SQL over tables the real pipeline wrote, against the reference folds of the events.

Two maps, ``users`` (a tier, a region, a DECIMAL credit, a TIMESTAMP, fields left out
or null) and ``orders`` (a user, a DECIMAL amount, a TIMESTAMP), are folded by
``start_map`` (Kafka, Spark, Redis and Delta all real) from two waves of events:
inserts, updates, fields removed, tombstones. Every statement's answer, over gRPC
(its Arrow IPC stream decoded) and over HTTP JSON, is compared with the same answer
computed in plain Python from ``reference.fold_latest`` of the events produced: joins,
GROUP BY aggregates, window functions, ORDER BY with LIMIT, NULLs, timestamps as UTC
instants and decimals exactly. Each answer names the tables it read.

The maps keep running for the module, so ``min_offsets`` (read-your-writes on the
tables) is checked on events produced while the service answers.
"""

from __future__ import annotations

import random
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import grpc
import orjson
import pytest
from deltalake import DeltaTable

from materializer.config import AppConfig
from materializer.contract.table_layout import table_path
from materializer.job import start_map
from materializer.runtime.query_group import QueryGroup
from materializer.testing import create_topic, produce
from materializer.testing.reference import Event, fold_latest
from materializer.testing.waiting import wait_until
from tests.helpers.slices import config, slice_config
from tests.helpers.sql_calls import (
    Row,
    SqlAnswer,
    SqlFront,
    grpc_code,
    grpc_sql,
    http_error,
    http_sql,
    serve,
)

USER_SCHEMA = (
    "id STRING, name STRING, tier STRING, region STRING, credit DECIMAL(10,2), joined TIMESTAMP"
)
USER_FIELDS = ["id", "name", "tier", "region", "credit", "joined"]
ORDER_SCHEMA = "id STRING, user_id STRING, amount DECIMAL(10,2), created_at TIMESTAMP"
ORDER_FIELDS = ["id", "user_id", "amount", "created_at"]
DECIMALS = {"credit", "amount"}
TIMESTAMPS = {"joined", "created_at"}
TIERS = ("gold", "silver", "bronze")
REGIONS = ("eu", "us", "ap")
WITHOUT_ORDERS = {2, 9, 17}
"""Users no order names."""
BUYERS = [i for i in range(45) if i not in WITHOUT_ORDERS]
"""The users orders name: u40…u44 never exist, u35…u39 are deleted."""
START = datetime(2026, 3, 1, tzinfo=UTC)
Records = list[tuple[bytes, bytes | None]]


def stamp(at: datetime, i: int) -> str:
    """A timestamp as the pipeline reads it (microseconds and a zone), every third one
    written in another zone than UTC: the same instant either way."""
    if i % 3 == 0:
        return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    zone = timedelta(hours=2 if i % 3 == 1 else -5, minutes=30 if i % 2 else 0)
    return at.astimezone(timezone(zone)).isoformat(timespec="microseconds")


def cents(rng: random.Random, top: int) -> Decimal:
    return Decimal(rng.randrange(1, top * 100)) / 100


def doc_bytes(doc: dict[str, Any]) -> bytes:
    """JSON with decimals as exact number literals, as producers of money write them."""
    return orjson.dumps(doc, default=lambda v: orjson.Fragment(str(v)))


def user(i: int, version: int) -> tuple[bytes, bytes]:
    rng = random.Random(i * 1000 + version)
    doc: dict[str, Any] = {"id": f"u{i:02d}", "name": f"user {i}.{version}"}
    if i % 5:
        doc["tier"] = TIERS[(i + version) % 3]
    doc["region"] = None if i % 7 == 0 else REGIONS[i % 3]
    if i % 4:
        doc["credit"] = cents(rng, 5000)
    if i % 6:
        doc["joined"] = stamp(START + timedelta(hours=i * 13, microseconds=i * 1017), i)
    return doc["id"].encode(), doc_bytes(doc)


def order(j: int, version: int) -> tuple[bytes, bytes]:
    rng = random.Random(j * 1000 + version)
    doc: dict[str, Any] = {"id": f"o{j:03d}", "user_id": f"u{BUYERS[(j * 7) % len(BUYERS)]:02d}"}
    if j % 13:
        doc["amount"] = cents(rng, 900)
    at = START + timedelta(days=j % 9, minutes=j * 37 + version, microseconds=j * 3)
    doc["created_at"] = stamp(at, j)
    return doc["id"].encode(), doc_bytes(doc)


def first_wave() -> tuple[Records, Records]:
    users: Records = [user(i, 0) for i in range(40)]
    orders: Records = [order(j, 0) for j in range(80)]
    return users, orders


def second_wave() -> tuple[Records, Records]:
    users: Records = [user(i, 1) for i in range(12)]  # updated
    users += [(f"u{i:02d}".encode(), None) for i in range(35, 40)]  # deleted
    no_credit = orjson.loads(user(3, 2)[1])
    del no_credit["credit"]
    users.append((b"u03", doc_bytes(no_credit)))  # a field removed
    orders: Records = [order(j, 1) for j in range(10)]  # new amounts
    orders += [(f"o{j:03d}".encode(), None) for j in range(70, 75)]  # deleted
    orders += [order(j, 0) for j in range(80, 90)]  # created
    return users, orders


def full(entity: dict[str, Any], fields: list[str]) -> Row:
    """A reference entity as a table row: every field (absent ones NULL), decimals and
    timestamps as the values they denote."""
    row: Row = {}
    for name in fields:
        value = entity.get(name)
        if value is not None and name in DECIMALS:
            value = Decimal(repr(value)).quantize(Decimal("0.01"))  # orjson read it as a float
        elif value is not None and name in TIMESTAMPS:
            value = datetime.fromisoformat(value).astimezone(UTC)
        row[name] = value
    return row


@dataclass
class Source:
    """One map's topic, the events produced to it, and its running queries."""

    map: str
    topic: str
    fields: list[str]
    events: list[Event] = field(default_factory=list)

    def produce(self, bootstrap: str, records: Records) -> list[tuple[int, int]]:
        positions = produce(bootstrap, self.topic, records)
        self.events += [(p, o, k, v) for (p, o), (k, v) in zip(positions, records, strict=True)]
        return positions

    def reference(self) -> dict[str, Row]:
        """The reference fold of every event produced, as table rows by key."""
        folded = fold_latest(self.events, "id", self.fields)
        return {key: full(entity, self.fields) for key, entity in sorted(folded.items())}


@dataclass
class Maps:
    cfg: AppConfig
    bootstrap: str
    users: Source
    orders: Source


def table_rows(cfg: AppConfig, source: Source) -> dict[str, Row]:
    """The map's Delta table now, read with delta-rs, as rows by key."""
    rows = DeltaTable(table_path(cfg, source.map)).to_pyarrow_table().to_pylist()
    return {
        row["_key"]: {
            name: row[name].astimezone(UTC) if name in TIMESTAMPS and row[name] else row[name]
            for name in source.fields
        }
        for row in sorted(rows, key=lambda r: r["_key"])
    }


def wait_for_tables(maps: Maps, groups: Sequence[QueryGroup] = ()) -> None:
    """Until both tables hold the reference folds of every event produced so far."""
    for group in groups:
        group.process_all_available()
    for source in (maps.users, maps.orders):
        wait_until(
            f"{source.map}'s table holding the reference fold",
            lambda s=source: table_rows(maps.cfg, s) == s.reference(),
            timeout=120,
            retry_errors=True,
        )


@pytest.fixture(scope="module")
def maps(
    spark: Any, kafka_bootstrap: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Maps]:
    """Both waves folded into both maps' tables; the maps go on running for the module."""
    tag = uuid.uuid4().hex[:8]
    users = Source(f"users{tag}", create_topic(kafka_bootstrap, 2), USER_FIELDS)
    orders = Source(f"orders{tag}", create_topic(kafka_bootstrap, 2), ORDER_FIELDS)
    doc = slice_config(
        tmp_path_factory.mktemp("sql"), kafka_bootstrap, redis_url, users.topic, map_name=users.map
    )
    doc["maps"][users.map]["source"]["schema"] = USER_SCHEMA
    doc["maps"][orders.map] = {
        "source": {"topics": [orders.topic], "schema": ORDER_SCHEMA},
        "key": "id",
        "changelog": {"topic": f"{orders.map}.changelog.{tag}"},
    }
    found = Maps(config(doc), kafka_bootstrap, users, orders)
    groups = [start_map(spark, found.cfg, users.map), start_map(spark, found.cfg, orders.map)]
    try:
        for wave in (first_wave(), second_wave()):
            users.produce(kafka_bootstrap, wave[0])
            orders.produce(kafka_bootstrap, wave[1])
            wait_for_tables(found, groups)
        yield found
    finally:
        for group in groups:
            group.stop()


# --- the expected answers, in plain Python ---


def by_tier(users: dict[str, Row], orders: dict[str, Row]) -> list[Row]:
    groups: dict[str | None, list[tuple[Row, Row]]] = defaultdict(list)
    for o in orders.values():
        u = users.get(o["user_id"])
        if u is not None:
            groups[u["tier"]].append((u, o))
    out = []
    for tier in sorted(groups, key=lambda t: (t is not None, t or "")):  # NULLS FIRST
        pairs = groups[tier]
        amounts = [o["amount"] for _, o in pairs if o["amount"] is not None]
        out.append(
            {
                "tier": tier,
                "orders": len(pairs),
                "priced": len(amounts),
                "buyers": len({u["id"] for u, _ in pairs}),
                "total": sum(amounts, Decimal(0)) if amounts else None,
                "low": min(amounts, default=None),
                "high": max(amounts, default=None),
                "mean": sum(amounts, Decimal(0)) / len(amounts) if amounts else None,
                "first_at": min(o["created_at"] for _, o in pairs),
                "last_at": max(o["created_at"] for _, o in pairs),
            }
        )
    return out


def top_two_per_user(orders: dict[str, Row]) -> list[Row]:
    per_user: dict[str, list[Row]] = defaultdict(list)
    for o in orders.values():
        per_user[o["user_id"]].append(o)
    out = []
    for user_id in sorted(per_user):
        mine = per_user[user_id]
        # ORDER BY amount DESC NULLS LAST, id
        ranked = sorted(mine, key=lambda o: (o["amount"] is None, -(o["amount"] or 0), o["id"]))
        amounts = [o["amount"] for o in mine if o["amount"] is not None]
        total = sum(amounts, Decimal(0)) if amounts else None
        for n, o in enumerate(ranked[:2], start=1):
            out.append(
                {
                    "user_id": user_id,
                    "id": o["id"],
                    "amount": o["amount"],
                    "rn": n,
                    "user_total": total,
                    "user_orders": len(mine),
                }
            )
    return out


def top_spenders(users: dict[str, Row], orders: dict[str, Row], n: int) -> list[Row]:
    spend: dict[str, list[Decimal | None]] = defaultdict(list)
    for o in orders.values():
        if o["user_id"] in users:
            spend[o["user_id"]].append(o["amount"])
    rows = []
    for user_id, amounts in spend.items():
        known = [a for a in amounts if a is not None]
        if known:
            total = sum(known, Decimal(0))
            name = users[user_id]["name"]
            rows.append({"id": user_id, "name": name, "spend": total, "orders": len(amounts)})
    rows.sort(key=lambda r: (-r["spend"], r["id"]))
    return rows[:n]


def nulls(users: dict[str, Row]) -> list[Row]:
    rows = list(users.values())
    return [
        {
            "all_users": len(rows),
            "tiered": sum(r["tier"] is not None for r in rows),
            "regioned": sum(r["region"] is not None for r in rows),
            "credited": sum(r["credit"] is not None for r in rows),
            "dated": sum(r["joined"] is not None for r in rows),
            "no_region": sum(r["region"] is None for r in rows),
            "not_gold": sum(r["tier"] is not None and r["tier"] != "gold" for r in rows),
            "total_credit": sum((r["credit"] for r in rows if r["credit"] is not None), Decimal(0)),
        }
    ]


# --- the statements ---

Expect = Callable[[dict[str, Row], dict[str, Row]], list[Row]]


@dataclass(frozen=True)
class Case:
    sql: str
    expect: Expect
    reads: tuple[str, ...] = ("users", "orders")
    params: tuple[Any, ...] = ()
    http_params: tuple[Any, ...] | None = None
    """The parameters as JSON has them (timestamps and decimals as text), when not ``params``."""
    tolerance: dict[str, Decimal] = field(default_factory=dict)
    """Columns compared within a bound: an average's last digit is the engine's rounding."""


CUTOFF = START + timedelta(days=4, hours=3, microseconds=5)
CREDIT_FLOOR = Decimal("1234.56")


def cases() -> dict[str, Case]:
    return {
        "whole users table": Case(
            "SELECT * FROM {users} ORDER BY _key",
            lambda u, o: [{"_key": k, **row} for k, row in u.items()],
            reads=("users",),
        ),
        "whole orders table": Case(
            "SELECT * FROM {orders} ORDER BY _key DESC",
            lambda u, o: [{"_key": k, **row} for k, row in sorted(o.items(), reverse=True)],
            reads=("orders",),
        ),
        "join and group by with aggregates": Case(
            "SELECT u.tier AS tier, count(*) AS orders, count(o.amount) AS priced, "
            "count(DISTINCT u.id) AS buyers, sum(o.amount) AS total, min(o.amount) AS low, "
            "max(o.amount) AS high, avg(o.amount) AS mean, "
            "min(o.created_at) AS first_at, max(o.created_at) AS last_at "
            "FROM {orders} o JOIN {users} u ON o.user_id = u.id "
            "GROUP BY u.tier ORDER BY u.tier NULLS FIRST",
            by_tier,
            tolerance={"mean": Decimal("0.000001")},
        ),
        "window functions over a partition": Case(
            "SELECT user_id, id, amount, rn, user_total, user_orders FROM ("
            "  SELECT user_id, id, amount,"
            "    row_number() OVER (PARTITION BY user_id ORDER BY amount DESC NULLS LAST, id)"
            "      AS rn,"
            "    sum(amount) OVER (PARTITION BY user_id) AS user_total,"
            "    count(*) OVER (PARTITION BY user_id) AS user_orders"
            "  FROM {orders}"
            ") AS ranked WHERE rn <= 2 ORDER BY user_id, rn",
            lambda u, o: top_two_per_user(o),
            reads=("orders",),
        ),
        "top spenders: order by and limit": Case(
            "SELECT u.id AS id, u.name AS name, sum(o.amount) AS spend, count(*) AS orders "
            "FROM {users} u JOIN {orders} o ON o.user_id = u.id "
            "GROUP BY u.id, u.name HAVING sum(o.amount) IS NOT NULL "
            "ORDER BY spend DESC, u.id LIMIT 5",
            lambda u, o: top_spenders(u, o, 5),
        ),
        "count(col) against count(*), and other NULLs": Case(
            "SELECT count(*) AS all_users, count(tier) AS tiered, count(region) AS regioned, "
            "count(credit) AS credited, count(joined) AS dated, "
            "sum(CASE WHEN region IS NULL THEN 1 ELSE 0 END) AS no_region, "
            "count(*) FILTER (WHERE tier <> 'gold') AS not_gold, sum(credit) AS total_credit "
            "FROM {users}",
            lambda u, o: nulls(u),
            reads=("users",),
        ),
        "IS NULL": Case(
            "SELECT id FROM {users} WHERE tier IS NULL OR credit IS NULL ORDER BY id",
            lambda u, o: [
                {"id": k} for k, r in u.items() if r["tier"] is None or r["credit"] is None
            ],
            reads=("users",),
        ),
        "users without orders": Case(
            "SELECT u.id AS id FROM {users} u LEFT JOIN {orders} o ON o.user_id = u.id "
            "WHERE o.id IS NULL ORDER BY u.id",
            lambda u, o: [{"id": k} for k in u if not any(r["user_id"] == k for r in o.values())],
        ),
        "orders of no user": Case(
            "SELECT o.id AS id, o.user_id AS user_id, u.name AS name FROM {orders} o "
            "LEFT JOIN {users} u ON u.id = o.user_id WHERE u.id IS NULL ORDER BY o.id",
            lambda u, o: [
                {"id": k, "user_id": r["user_id"], "name": None}
                for k, r in o.items()
                if r["user_id"] not in u
            ],
        ),
        "timestamps as UTC instants, and a timestamp parameter": Case(
            "SELECT id, joined FROM {users} WHERE joined >= CAST($1 AS TIMESTAMP) "
            "ORDER BY joined, id",
            lambda u, o: sorted(
                (
                    {"id": k, "joined": r["joined"]}
                    for k, r in u.items()
                    if r["joined"] is not None and r["joined"] >= CUTOFF
                ),
                key=lambda r: (r["joined"], r["id"]),
            ),
            reads=("users",),
            params=(CUTOFF,),
            http_params=(CUTOFF.isoformat(),),
        ),
        "orders per UTC day": Case(
            "SELECT date_trunc('day', created_at) AS day, count(*) AS n, sum(amount) AS total "
            "FROM {orders} GROUP BY 1 ORDER BY 1",
            lambda u, o: per_day(o),
            reads=("orders",),
        ),
        "decimals exactly, and a decimal parameter": Case(
            "SELECT id, credit, credit * 3 AS tripled, credit - 0.01 AS less "
            "FROM {users} WHERE credit > CAST($1 AS DECIMAL(10, 2)) ORDER BY credit DESC, id",
            lambda u, o: [
                {
                    "id": k,
                    "credit": r["credit"],
                    "tripled": r["credit"] * 3,
                    "less": r["credit"] - Decimal("0.01"),
                }
                for k, r in sorted(u.items(), key=lambda kr: (-(kr[1]["credit"] or 0), kr[0]))
                if r["credit"] is not None and r["credit"] > CREDIT_FLOOR
            ],
            reads=("users",),
            params=(CREDIT_FLOOR,),
            http_params=(str(CREDIT_FLOOR),),
        ),
        "a WITH over both maps": Case(
            "WITH spend AS (SELECT user_id, sum(amount) AS total FROM {orders} GROUP BY user_id) "
            "SELECT u.region AS region, sum(s.total) AS total FROM {users} u "
            "JOIN spend s ON s.user_id = u.id WHERE u.region IS NOT NULL "
            "GROUP BY u.region ORDER BY total DESC",
            lambda u, o: per_region(u, o),
        ),
    }


def per_day(orders: dict[str, Row]) -> list[Row]:
    days: dict[datetime, list[Row]] = defaultdict(list)
    for o in orders.values():
        at = o["created_at"]
        days[datetime(at.year, at.month, at.day, tzinfo=UTC)].append(o)
    return [
        {
            "day": day,
            "n": len(rows),
            "total": sum((r["amount"] for r in rows if r["amount"] is not None), Decimal(0)),
        }
        for day, rows in sorted(days.items())
    ]


def per_region(users: dict[str, Row], orders: dict[str, Row]) -> list[Row]:
    totals: dict[str, Decimal] = defaultdict(Decimal)
    for o in orders.values():
        u = users.get(o["user_id"])
        if u is not None and u["region"] is not None and o["amount"] is not None:
            totals[u["region"]] += o["amount"]
    return [{"region": r, "total": t} for r, t in sorted(totals.items(), key=lambda rt: -rt[1])]


def same(got: list[Row], want: list[Row], tolerance: dict[str, Decimal]) -> bool:
    if len(got) != len(want):
        return False
    for g, w in zip(got, want, strict=True):
        if set(g) != set(w):
            return False
        for name, value in w.items():
            bound = tolerance.get(name)
            if bound is not None and value is not None and g[name] is not None:
                if abs(Decimal(g[name]) - value) > bound:
                    return False
            elif g[name] != value or type(g[name]) is not type(value):
                return False
    return True


CASES = cases()


@pytest.mark.parametrize("name", list(CASES))
def test_answers_match_the_reference_folds(maps: Maps, name: str) -> None:
    case = CASES[name]
    names = {"users": maps.users.map, "orders": maps.orders.map}
    sql = case.sql.format(**names)
    wait_for_tables(maps)  # the module's other tests produce more
    want = case.expect(maps.users.reference(), maps.orders.reference())
    assert want, "a case whose answer is empty checks little"
    http_params = case.params if case.http_params is None else case.http_params

    async def body(front: SqlFront) -> tuple[SqlAnswer, SqlAnswer]:
        return (
            await grpc_sql(front.stub, sql, case.params),
            await http_sql(front, sql, http_params),
        )

    for front_name, answer in zip(("gRPC", "HTTP"), serve(maps.cfg, body), strict=True):
        assert same(answer.rows, want, case.tolerance), (front_name, answer.rows, want)
        assert set(answer.tables) == {names[m] for m in case.reads}, answer.tables
        assert all(t.version >= 0 for t in answer.tables.values()), answer.tables


def test_min_offsets_waits_for_the_tables(maps: Maps) -> None:
    """An event produced now is in the answer of a statement asking for its offset; the
    tables read say they reflect it."""
    users = maps.users
    sql = f"SELECT id, name, tier FROM {users.map} WHERE id IN ('u60', 'u61') ORDER BY id"

    async def body(front: SqlFront) -> None:
        for i, ask in ((60, grpc_sql), (61, http_sql)):
            ((partition, offset),) = users.produce(maps.bootstrap, [user(i, 0)])
            wanted = {users.topic: {partition: offset + 1}}
            if ask is grpc_sql:
                answer = await grpc_sql(front.stub, sql, min_offsets=wanted, timeout=60)
            else:
                answer = await http_sql(front, sql, min_offsets=wanted, timeout_ms=60_000)
            assert answer.rows[-1]["id"] == f"u{i}", answer.rows
            assert answer.rows[-1]["name"] == f"user {i}.0"
            read = answer.tables[users.map]
            assert read.offsets is not None, "the table's version records no offsets"
            assert read.offsets[users.topic][partition] >= offset + 1, read

    serve(maps.cfg, body)


def test_min_offsets_never_reached_is_deadline_exceeded(maps: Maps) -> None:
    users = maps.users
    sql = f"SELECT count(*) AS n FROM {users.map}"
    far = {users.topic: {0: 10**9}}

    async def body(front: SqlFront) -> None:
        code, details = await grpc_code(front.stub, sql, min_offsets=far, timeout=1.5)
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert users.topic in details and str(10**9) in details, details
        status, name, message = await http_error(
            front, {"sql": sql, "min_offsets": far, "timeout_ms": 1500}
        )
        assert (status, name) == (504, "DEADLINE_EXCEEDED"), message
        assert users.topic in message and str(10**9) in message, message
        # The service answers the next call, and a topic no table read follows is refused.
        assert (await grpc_sql(front.stub, sql)).rows[0]["n"] > 0
        code, details = await grpc_code(front.stub, sql, min_offsets={maps.orders.topic: {0: 1}})
        assert code == grpc.StatusCode.INVALID_ARGUMENT, details

    serve(maps.cfg, body)
