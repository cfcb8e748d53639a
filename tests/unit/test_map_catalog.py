"""The map catalog's records (golden, as docs/map-catalog.md writes them), the rule that
combines the file's maps with the catalog's, and the checks a change passes before it
is stored."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from materializer.catalog.changes import (
    STATE_BOUND,
    ChangeInvalid,
    ChangeRefused,
    MapExists,
    NoSuchMap,
    check_delete,
    check_put,
    state_bound_changes,
)
from materializer.catalog.rule import combine
from materializer.config import MapConfig, parse_config
from materializer.contract.map_catalog import StoredMap, decode


def section(topic: str = "orders", **extra: Any) -> dict[str, Any]:
    return {"source": {"topics": [topic], "schema": "id STRING, n INT"}, "key": "id", **extra}


FILE = parse_config({"maps": {"users": section("users")}})


def stored(name: str, version: int, config: dict[str, Any] | None, **kw: Any) -> StoredMap:
    return StoredMap(name, version, config, "ops", 1_700_000_000_000, **kw)


def test_records_are_the_contract() -> None:
    record = stored("orders", 3, {"key": "id"})
    assert record.key() == b"orders"
    assert orjson.loads(record.value() or b"") == {
        "version": 3,
        "config": {"key": "id"},
        "by": "ops",
        "at_ms": 1_700_000_000_000,
    }
    assert record.headers() == []
    rebuilt = stored("orders", 4, {"key": "id"}, rebuilt_at=4)
    assert orjson.loads(rebuilt.value() or b"")["rebuilt_at"] == 4
    assert rebuilt.rebuild and not stored("orders", 5, {}, rebuilt_at=4).rebuild
    tombstone = stored("orders", 5, None)
    assert tombstone.value() is None
    assert tombstone.headers() == [
        ("version", b"5"),
        ("by", b"ops"),
        ("at_ms", b"1700000000000"),
    ]
    # Read back as written, the offset aside.
    for written in (record, rebuilt, tombstone):
        read = decode(written.key(), written.value(), written.headers(), 7)
        assert read == written and read is not None and read.offset == 7
    # What is not a definition is skipped, never a crash.
    assert decode(None, b"{}") is None
    assert decode(b"x", b"not json") is None
    assert decode(b"x", b'{"version": 1}') is None


def test_the_file_owns_its_maps_and_the_catalog_adds_the_rest() -> None:
    maps = combine(
        FILE,
        {
            "orders": stored("orders", 2, section()),
            "users": stored("users", 1, section("elsewhere")),  # shadowed by the file
            "gone": stored("gone", 3, None),
        },
    )
    assert sorted(maps.config.maps) == ["orders", "users"]
    assert maps.origin == {"users": "file", "orders": "api"}
    assert maps.config.maps["users"].source.topics == ["users"]
    assert "users" in maps.left_out
    assert maps.version("orders") == 2
    assert maps.version("gone") == 3  # a map created again goes on counting
    assert maps.version("users") == 1


def test_a_catalog_map_that_no_longer_fits_the_file_is_left_out_alone() -> None:
    # Writes its changelog into a topic the file's map reads: left out, the others stay.
    clash = section(changelog={"topic": "users"})
    clash["source"]["topics"] = ["users"]
    maps = combine(FILE, {"bad": stored("bad", 1, clash), "orders": stored("orders", 1, section())})
    assert sorted(maps.config.maps) == ["orders", "users"]
    assert any("changelog.topic" in p for p in maps.left_out["bad"])


def test_a_change_names_each_bad_key_path_and_nothing_half_valid_passes() -> None:
    maps = combine(FILE, {})
    bad = {"source": {"topics": [], "format": "xml"}, "fold": {"mode": "fold"}, "nope": 1}
    with pytest.raises(ChangeInvalid) as caught:
        check_put(maps, "orders", bad, by="t", reachable=False)
    problems = caught.value.problems
    for path in ("maps.orders.source.topics", "maps.orders.source.format",
                 "maps.orders.fold.mode", "maps.orders.nope", "maps.orders.key"):  # fmt: skip
        assert any(p.startswith(f"{path}:") for p in problems), (path, problems)
    # The checks a whole file gets: a changelog topic another map reads.
    with pytest.raises(ChangeInvalid, match=r"maps\.orders\.changelog\.topic"):
        check_put(maps, "orders", section(changelog={"topic": "orders"}), by="t", reachable=False)
    with pytest.raises(ChangeInvalid, match=r"maps\.orders: must be a mapping"):
        check_put(maps, "orders", ["not", "a", "section"], by="t", reachable=False)


def test_creates_changes_and_deletes_get_versions() -> None:
    maps = combine(FILE, {})
    created = check_put(maps, "orders", section(), by="alice", reachable=False)
    assert created.created and not created.rebuilt
    assert created.record == StoredMap(
        "orders", 1, section(), "alice", created.record.at_ms, offset=created.record.offset
    )
    maps = combine(FILE, {"orders": created.record})
    with pytest.raises(MapExists):
        check_put(maps, "orders", section(), by="bob", create_only=True, reachable=False)
    changed = check_put(maps, "orders", section(history=True), by="bob", reachable=False)
    assert (changed.created, changed.record.version, changed.record.by) == (False, 2, "bob")
    tombstone = check_delete(maps, "orders", by="carol")
    assert (tombstone.deleted, tombstone.version) == (True, 2)
    with pytest.raises(NoSuchMap, match="known maps: orders, users"):
        check_delete(maps, "nothing", by="carol")


def test_the_api_cannot_change_or_delete_a_map_of_the_file() -> None:
    maps = combine(FILE, {})
    with pytest.raises(ChangeRefused, match=r"declared in the configuration file \(maps.users\)"):
        check_put(maps, "users", section("users"), by="t", reachable=False)
    with pytest.raises(ChangeRefused, match="remove it there"):
        check_delete(maps, "users", by="t")
    # A definition the file shadows is the catalog's own: deleting it silences its warning.
    shadowed = combine(FILE, {"users": stored("users", 4, section("elsewhere"))})
    assert check_delete(shadowed, "users", by="t").version == 5


@pytest.mark.parametrize(
    ("change", "bound"),
    [
        ({"key": "n"}, ["key"]),
        ({"fold": {"mode": "merge"}}, ["fold.mode"]),
        ({"source": {"topics": ["orders"], "schema": "id STRING, n BIGINT"}}, ["source.schema"]),
        ({"changelog": {"topic": "orders.log"}}, ["changelog"]),
        ({"transforms": [{"type": "drop", "fields": ["n"]}]}, ["transforms"]),
        ({"history": True, "ttl": {"redis": "1h"}, "on_error": "skip"}, []),
        ({"source": {"topics": ["orders", "more"], "schema": "id STRING, n INT"}}, []),
        # Fields added, nullable: the entities read them as null, nothing is folded again.
        ({"source": {"topics": ["orders"], "schema": "id STRING, n INT, note STRING"}}, []),
        ({"source": {"topics": ["orders"], "schema": "n int, tags ARRAY<STRING>, id string"}}, []),
        ({"source": {"topics": ["orders"], "schema": "id STRING"}}, ["source.schema"]),
        (
            {"source": {"topics": ["orders"], "schema": "id STRING, n INT, x INT NOT NULL"}},
            ["source.schema"],
        ),
        (
            {"source": {"topics": ["orders"], "schema": "id STRING, m INT, x INT"}},
            ["source.schema"],
        ),
    ],
)
def test_a_change_the_state_cannot_follow_is_refused_unless_rebuilt(
    change: dict[str, Any], bound: list[str]
) -> None:
    old = section()
    new = {**old, **change}
    before, after = MapConfig.model_validate(old), MapConfig.model_validate(new)
    assert state_bound_changes(before, after) == bound
    assert set(bound) <= set(STATE_BOUND)
    maps = combine(FILE, {"orders": stored("orders", 1, old)})
    if not bound:
        assert not check_put(maps, "orders", new, by="t", reachable=False).rebuilt
        return
    with pytest.raises(ChangeRefused, match=r"\?rebuild=true.*another name") as caught:
        check_put(maps, "orders", new, by="t", reachable=False)
    assert ", ".join(bound) in str(caught.value)
    rebuilt = check_put(maps, "orders", new, by="t", rebuild=True, reachable=False)
    assert rebuilt.rebuilt and rebuilt.record.rebuild and rebuilt.record.version == 2
    assert rebuilt.record.rebuilt_at == 2
    # A later change the state can follow carries the rebuild on, for a run that missed it.
    maps = combine(FILE, {"orders": rebuilt.record})
    later = check_put(maps, "orders", {**new, "history": True}, by="t", reachable=False)
    assert (later.record.version, later.record.rebuilt_at, later.rebuilt) == (3, 2, False)
