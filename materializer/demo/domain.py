"""The demo's sample domain: user profiles folded into ``users``, orders into ``user_orders``.

It is the Hazelcast Jet tutorial's ``user-events`` topic materialized into a
``users`` map, with two changes that show more of the fold: profile events
carry only the fields they change, so the map merges them (``merge``) instead
of replacing the user (``latest``), and an ``orders`` topic is folded per user
into running aggregates. A user's Kafka key is their id in both topics, so a
tombstone on ``user-events`` deletes the user and a user's orders stay in one
partition, in order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

USER_EVENTS = "user-events"
ORDERS = "orders"
USERS = "users"
USER_ORDERS = "user_orders"
PARTITIONS = 2
"""Per topic: enough to show per-partition offsets, few enough for a laptop's cores."""

TOPIC_OF_MAP = {USERS: USER_EVENTS, USER_ORDERS: ORDERS}

USER_SCHEMA = (
    "id STRING, name STRING, email STRING, country STRING, plan STRING,"
    " signed_up_at TIMESTAMP, updated_at TIMESTAMP"
)
USER_FIELDS = ["id", "name", "email", "country", "plan", "signed_up_at", "updated_at"]
ORDER_SCHEMA = (
    "order_id STRING, user_id STRING, amount DECIMAL(10,2), status STRING, ordered_at TIMESTAMP"
)
ORDER_AGGREGATES: dict[str, tuple[str, str | None]] = {
    "orders": ("count", None),
    "total_amount": ("sum", "amount"),
    "max_amount": ("max", "amount"),
    "last_order_at": ("last", "ordered_at"),
    "first_status": ("first", "status"),
    "last_status": ("last", "status"),
}
"""``{name: (fn, field)}`` of the ``user_orders`` fold, in the reference fold's form."""

ENRICH_PROFILE = "orders-with-users"


def demo_config(
    *,
    workdir: Path,
    bootstrap_servers: str,
    redis_url: str,
    port: int,
    registry_url: str | None = None,
) -> dict[str, Any]:
    """The demo's configuration document; every path in it lies inside ``workdir``.

    With ``registry_url`` the topics hold Avro in Confluent's wire format (``demo.avro``),
    typed by the registry; otherwise JSON typed by the schemas above.

    The Spark cadence is shortened from the defaults so that lookups trail the
    producer by about a second, and the Delta MERGE runs less often so that it
    leaves the cores of a small machine to the folds.
    """
    return {
        "kafka": {"bootstrap_servers": bootstrap_servers},
        "redis": {"url": redis_url},
        # No fixed metrics ports: the demo must start next to anything already running.
        "metrics": {"port": 0},
        "delta": {"root": str(workdir / "warehouse"), "trigger_interval": "10 seconds"},
        "spark": {
            "master": "local[*]",
            "checkpoint_root": str(workdir / "checkpoints"),
            "shuffle_partitions": PARTITIONS,
            "conf": {
                # Spark's scratch files stay in the work dir, which the demo removes.
                "spark.local.dir": str(workdir / "spark-tmp"),
                "spark.sql.warehouse.dir": str(workdir / "spark-warehouse"),
            },
        },
        "query": {
            "host": "127.0.0.1",
            "port": port,
            "metrics_port": None,
            "enrich_profiles": {
                ENRICH_PROFILE: {
                    "lookups": [
                        {
                            "map": USERS,
                            "key_field": "user_id",
                            "alias": "user",
                            "fields": ["name", "country", "plan"],
                        }
                    ]
                }
            },
        },
        "maps": {
            USERS: {
                "source": _source(USER_EVENTS, USER_SCHEMA, registry_url),
                "key": "id",
                # Profile events carry only the fields they change.
                "fold": {"mode": "merge"},
            },
            USER_ORDERS: {
                "source": _source(ORDERS, ORDER_SCHEMA, registry_url),
                "key": "user_id",
                "fold": {
                    "mode": "aggregate",
                    "aggregates": {
                        name: {"fn": fn} if field is None else {"fn": fn, "field": field}
                        for name, (fn, field) in ORDER_AGGREGATES.items()
                    },
                },
            },
        },
    }


def _source(topic: str, schema: str, registry_url: str | None) -> dict[str, Any]:
    if registry_url is None:
        return {"topics": [topic], "format": "json", "schema": schema}
    return {"topics": [topic], "format": "avro", "schema_registry_url": registry_url}


HEADER = """\
# Written by `materializer demo`: user profiles merged into `users`, orders
# aggregated per user into `user_orders`, on the broker and Redis the demo
# started. With your own, change `kafka` and `redis` and run it with
# `materializer run -c` and `query-service serve -c`.
"""


def write_config(path: Path, doc: dict[str, Any]) -> Path:
    """Write ``doc`` as YAML in the order it was built, which reads top-down."""
    text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=1000)
    path.write_text(HEADER + text)
    return path
