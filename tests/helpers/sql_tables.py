"""Two maps' Delta tables for the SQL tests, written with delta-rs as the materializer
leaves them (each version's commit names the source offsets it reflects), the
configuration that serves them, and the answers expected of them, computed here."""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml
from deltalake import CommitProperties, write_deltalake

from materializer.config import AppConfig, parse_config
from materializer.contract.table_marks import encode
from materializer.contract.watermark import Watermark

User = tuple[str, str, float]
"""(key, tier, spend)"""
USERS: list[User] = [(f"u{i}", ["gold", "silver", "bronze"][i % 3], 10.0 * i) for i in range(9)]
ORDERS = [(f"o{i}", f"u{i % 9}", 1.5 * i) for i in range(30)]
"""(key, user, amount)"""
BATCH_ID = 7
OFFSETS = {0: 40, 1: 12}
"""The source offsets each table's version reflects, by partition of ``<map>-events``."""


class SqlMaps:
    """A users map and an orders map under ``root``, named for one test (bare SQL
    identifiers: lower case, no hyphen)."""

    def __init__(self, root: Path) -> None:
        suffix = uuid.uuid4().hex[:8]
        self.users, self.orders = f"users_{suffix}", f"orders_{suffix}"
        self.root = root

    def group_by(self) -> str:
        """Orders and their total per tier of their user: a join and an aggregate."""
        return (
            "SELECT u.tier, count(*) AS orders, sum(o.amount) AS total "
            f"FROM {self.orders} o JOIN {self.users} u ON o.user_id = u._key "
            "GROUP BY u.tier ORDER BY u.tier"
        )

    def write(self, users: Sequence[User] = USERS) -> None:
        """Each table in two versions: a first commit, then the whole table in one whose
        userMetadata names the offsets (version 1)."""
        tables = {
            self.users: pa.table(
                {
                    "_key": [k for k, _, _ in users],
                    "id": [k for k, _, _ in users],
                    "tier": [t for _, t, _ in users],
                    "spend": [s for _, _, s in users],
                }
            ),
            self.orders: pa.table(
                {
                    "_key": [k for k, _, _ in ORDERS],
                    "id": [k for k, _, _ in ORDERS],
                    "user_id": [u for _, u, _ in ORDERS],
                    "amount": [a for _, _, a in ORDERS],
                }
            ),
        }
        for name, rows in tables.items():
            path = self.root / name
            write_deltalake(path, rows.slice(0, 1))
            mark = Watermark(batch_id=BATCH_ID, offsets={f"{name}-events": OFFSETS}, app_id="t")
            write_deltalake(
                path,
                rows,
                mode="overwrite",
                commit_properties=CommitProperties(custom_metadata={"userMetadata": encode(mark)}),
            )

    def doc(
        self, redis_url: str, auth: dict[str, Any], kafka: str | None = None, **query: Any
    ) -> dict[str, Any]:
        """The configuration document serving both maps with ``query.auth`` = ``auth``,
        and no catalog: the file's maps are all there is. ``kafka``: a broker for the
        console's overview to read log ends from (without one it waits for none)."""

        def section(name: str, schema: str) -> dict[str, Any]:
            return {"source": {"topics": [f"{name}-events"], "schema": schema}, "key": "id"}

        return {
            **({"kafka": {"bootstrap_servers": kafka}} if kafka else {}),
            "redis": {"url": redis_url},
            "delta": {"root": str(self.root)},
            "catalog": {"enabled": False},
            "query": {"auth": auth, **query},
            "maps": {
                self.users: section(self.users, "id STRING, tier STRING, spend DOUBLE"),
                self.orders: section(self.orders, "id STRING, user_id STRING, amount DOUBLE"),
            },
        }

    def config(
        self,
        redis_url: str,
        tokens: list[dict[str, Any]],
        tokens_env: str,
        environ: Any,
        kafka: str | None = None,
        **query: Any,
    ) -> AppConfig:
        """``doc``'s configuration, its ``tokens`` in the environment variable
        ``tokens_env`` (set through ``environ``, a ``monkeypatch``)."""
        environ.setenv(tokens_env, yaml.safe_dump({"tokens": tokens}))
        return parse_config(self.doc(redis_url, {"tokens_env": tokens_env}, kafka, **query))


def expected_groups(users: Sequence[User] = USERS) -> list[dict[str, Any]]:
    """``SqlMaps.group_by``'s answer, row by row."""
    tier = {key: t for key, t, _ in users}
    count: dict[str, int] = defaultdict(int)
    total: dict[str, float] = defaultdict(float)
    for _, user, amount in ORDERS:
        count[tier[user]] += 1
        total[tier[user]] += amount
    return [{"tier": t, "orders": count[t], "total": total[t]} for t in sorted(count)]
