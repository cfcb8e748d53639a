"""Golden tests of the Redis layout: the contract the query service reads."""

from __future__ import annotations

import orjson

from materializer.clients.redis import key_slot, slot_tag
from materializer.contract.control import Control
from materializer.contract.operations import Operation, report_args
from materializer.contract.redis_layout import (
    EXPIRE_OP,
    RESERVED_KEYS,
    change_entry,
    changes_key,
    control_key,
    definition_key,
    entity_key,
    epoch_key,
    expired_key,
    expiry_index_key,
    generation_key,
    live_freshness_key,
    logical_name,
    marker_key,
    meta_key,
    operation_key,
    owner_key,
    parse_generation,
    physical_name,
    slots_key,
    state_key,
    state_keys_pattern,
    status_key,
    table_marks_key,
    table_marks_pattern,
)
from materializer.contract.status import MapReport, PartitionCatchUp
from materializer.contract.table_marks import TableMark
from materializer.contract.watermark import Watermark


def test_key_names_are_the_contract():
    assert entity_key("users", "u-1") == "users:u-1"
    assert entity_key("users", "a:b") == "users:a:b"
    assert meta_key("users") == "users:__meta__"


def test_fold_state_keys_are_the_contract():
    # Beside its entity, in its hash slot: the whole entity key as the hash tag...
    assert state_key("users", "u-1") == b"users\x00o:{users:u-1}"
    assert key_slot(state_key("users", "u-1")) == key_slot(entity_key("users", "u-1"))
    # ...or the entity key's own tag, which decides its slot already.
    assert state_key("users", "{eu}u-1") == b"users\x00o:{eu}u-1"
    assert key_slot(state_key("users", "{eu}u-1")) == key_slot(entity_key("users", "{eu}u-1"))
    # A scan of the map's entities (users:*) never sees them; a scan of states does.
    assert not state_key("users", "u-1").startswith(b"users:")
    assert state_keys_pattern("users~2") == b"users~2\x00o:*"


def test_owner_epochs_and_slots_are_the_contract():
    assert owner_key("users") == "users\x00w:"
    assert owner_key("users", slot_tag(0)) == "users\x00w:{3560}"
    assert key_slot(owner_key("users", slot_tag(9)).encode()) == 9
    assert epoch_key("users") == "users\x00W:"
    assert slots_key("workers") == "workers\x00g:"
    # A generation's writes are fenced by its map's owner.
    assert logical_name(physical_name("users", 3)) == "users"
    assert logical_name("users") == "users"


def test_markers_are_the_contract():
    from redis.crc import key_slot

    assert marker_key("users") == "users\x00m:"
    assert marker_key("users~2") == "users~2\x00m:"
    # On a cluster each master's marker is tagged with a slot it owns.
    assert marker_key("users", slot_tag(0)) == "users\x00m:{3560}"
    for slot in (0, 1, 5461, 10923, 16383):
        assert key_slot(marker_key("users", slot_tag(slot)).encode()) == slot
    assert not marker_key("users").startswith("users:")


def test_key_slot_is_the_cluster_specifications():
    """Every hash-tag case the specification names, against redis-py's own ``key_slot``."""
    import random

    from redis.crc import key_slot as reference

    keys = ["users:u-1", "{user1000}.following", "foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}"]
    keys += ["{", "}", "{}", "a{b", "ü{é}x", ""]
    rng = random.Random(7)
    keys += ["".join(rng.choice("ab{}é") for _ in range(rng.randrange(9))) for _ in range(5000)]
    for key in keys:
        assert key_slot(key) == key_slot(key.encode()) == reference(key.encode()), key


def test_the_real_time_paths_figures_key_is_the_contract():
    assert live_freshness_key("users") == "users\x00f:"
    assert not live_freshness_key("users").startswith("users:")  # never an entity


def test_expiry_keys_are_the_contract():
    from redis.crc import key_slot

    assert expiry_index_key("users") == "users\x00e:"
    assert expired_key("users") == "users\x00x:"
    assert expiry_index_key("users", slot_tag(0)) == "users\x00e:{3560}"
    assert key_slot(expired_key("users", slot_tag(5461)).encode()) == 5461
    assert EXPIRE_OP == "expire"


def test_watermark_hash_fields_are_the_contract():
    mark = Watermark(
        batch_id=12, offsets={"user-events": {1: 40, 0: 7}}, updated_at_ms=1700, app_id="q:users"
    )
    assert mark.to_hash() == {
        "batch_id": "12",
        "offsets": '{"user-events":{"0":7,"1":40}}',
        "updated_at_ms": "1700",
        "app_id": "q:users",
    }


def test_change_entries_are_the_contract():
    assert changes_key("users") == "users:__changes__"
    assert change_entry("u1", False, 4) == {"key": "u1", "op": "upsert", "batch_id": "4"}
    assert change_entry("u1", True, 5) == {"key": "u1", "op": "delete", "batch_id": "5"}


def test_table_marks_are_the_contract():
    # In the watermark's slot, so one transaction appends a mark with its watermark.
    assert table_marks_key("users") == b"users\x00t:{users:__meta__}"
    assert key_slot(table_marks_key("users")) == key_slot(meta_key("users").encode())
    assert key_slot(table_marks_key("{eu}users")) == key_slot(meta_key("{eu}users").encode())
    assert not table_marks_key("users").startswith(b"users:")
    assert table_marks_pattern("users~2") == b"users~2\x00t:*"
    mark = TableMark(
        Watermark(
            batch_id=12, offsets={"user-events": {1: 40, 0: 7}}, updated_at_ms=1700, app_id="q"
        ),
        changelog={2: 90, 0: 31, 1: 0},
    )
    assert mark.to_entry() == {
        "batch_id": "12",
        "offsets": '{"user-events":{"0":7,"1":40}}',
        "updated_at_ms": "1700",
        "app_id": "q",
        "changelog": '{"0":31,"1":0,"2":90}',
    }
    raw = {k.encode(): v.encode() for k, v in mark.to_entry().items()}
    assert TableMark.from_entry(raw) == mark
    assert TableMark.from_entry({}) is None
    # Reached once a reader of the changelog is at or past each partition's end.
    assert mark.reached_by({0: 31, 1: 0, 2: 90})
    assert mark.reached_by({0: 40, 2: 91})
    assert not mark.reached_by({0: 31, 1: 5, 2: 89})
    assert not mark.reached_by({0: 31})


def test_watermark_round_trips_through_redis_bytes():
    mark = Watermark(batch_id=3, offsets={"a": {0: 1}, "b": {2: 9}}, updated_at_ms=5)
    raw = {k.encode(): v.encode() for k, v in mark.to_hash().items()}
    assert Watermark.from_hash(raw) == mark
    assert Watermark.from_hash({}) is None


def test_status_and_control_hashes_are_the_contract():
    assert status_key("users") == "users:__status__"
    assert control_key("users") == "users:__control__"
    assert {
        "__meta__",
        "__changes__",
        "__status__",
        "__control__",
        "__generation__",
        "__definition__",
        "__operation__",
        "__history__",
    } == RESERVED_KEYS
    report = MapReport("failed", "boom", 1700, 12.5, 3.0, 42, 4096, "worker-1")
    assert report.to_hash() == {
        "state": "failed",
        "error": "boom",
        "reported_at_ms": "1700",
        "input_rows_per_second": "12.5",
        "processed_rows_per_second": "3.0",
        "state_keys": "42",
        "state_bytes": "4096",
        "worker": "worker-1",
        "records_left": "-1",
        "catch_up_rate": "0.0",
        "input_rate": "0.0",
        "eta_seconds": "-1.0",
        "catch_up_partitions": "[]",
        "fold_path": "",
    }
    raw = {k.encode(): v.encode() for k, v in report.to_hash().items()}
    assert MapReport.from_hash(raw) == report
    # A report from before the state was measured, or from an older materializer.
    older = {b"state": b"running", b"reported_at_ms": b"1"}
    assert MapReport.from_hash(older) == MapReport("running", "", 1, state_keys=-1, state_bytes=-1)
    assert MapReport.from_hash(older) == MapReport(
        "running", reported_at_ms=1, records_left=-1, eta_seconds=-1.0, catch_up_partitions=()
    )


def test_a_report_carries_the_catch_up_figures_per_map_and_partition():
    report = MapReport(
        "catching_up",
        reported_at_ms=1700,
        records_left=1500,
        catch_up_rate=250.5,
        input_rate=50.0,
        eta_seconds=7.5,
        catch_up_partitions=(
            PartitionCatchUp("t", 0, 1500, 250.5, 50.0, 7.5),
            PartitionCatchUp("t", 1, 0, 0.0, 0.0, 0.0),
        ),
    )
    fields = report.to_hash()
    assert {k: fields[k] for k in ("state", "records_left", "eta_seconds")} == {
        "state": "catching_up",
        "records_left": "1500",
        "eta_seconds": "7.5",
    }
    assert orjson.loads(fields["catch_up_partitions"])[0] == {
        "topic": "t",
        "partition": 0,
        "records_left": 1500,
        "catch_up_rate": 250.5,
        "input_rate": 50.0,
        "eta_seconds": 7.5,
    }
    assert MapReport.from_hash({k.encode(): v.encode() for k, v in fields.items()}) == report
    assert MapReport.from_hash({}) is None
    assert Control("paused", "r1").to_hash() == {"desired": "paused", "restart_id": "r1"}
    assert Control.from_hash({}) == Control("running", "")
    assert Control.from_hash({b"desired": b"bogus"}).desired == "running"


def test_generations_are_the_contract():
    assert generation_key("users") == "users:__generation__"
    assert definition_key("users") == "users:__definition__"
    assert physical_name("users", 0) == "users"
    assert physical_name("users", 3) == "users~3"
    assert entity_key(physical_name("users", 3), "u-1") == "users~3:u-1"
    assert parse_generation(None) == 0
    assert parse_generation(b"4") == 4


def test_the_operation_hash_is_the_contract():
    assert operation_key("users") == "users:__operation__"
    asked = Operation("op1", "verify", "ops-console", 1700)
    assert asked.to_hash() == {
        "id": "op1",
        "kind": "verify",
        "requested_by": "ops-console",
        "requested_at_ms": "1700",
        "state": "requested",
        "phase": "",
        "done": "0",
        "total": "0",
        "started_at_ms": "0",
        "finished_at_ms": "0",
        "worker": "",
        "error": "",
        "result": "",
    }
    # The request writes its own fields only; the run's report adds the rest.
    assert asked.request_args() == [
        "id", "op1", "kind", "verify", "requested_by", "ops-console",
        "requested_at_ms", "1700", "state", "requested",
    ]  # fmt: skip
    missing = {"count": 2, "first": ["u1", "u2"]}
    done = Operation(
        "op1", "verify", "ops-console", 1700, state="done", phase="done", done=60, total=60,
        started_at_ms=1800, finished_at_ms=1900, worker="host-12",
        result={"identical": False, "expected": 60, "actual": 58, "missing": missing},
    )  # fmt: skip
    fields = done.to_hash()
    assert orjson.loads(fields["result"]) == {
        "identical": False,
        "expected": 60,
        "actual": 58,
        "missing": {"count": 2, "first": ["u1", "u2"]},
    }
    raw = {k.encode(): v.encode() for k, v in fields.items()}
    assert Operation.from_hash(raw) == done
    assert Operation.from_hash({}) is None
    assert Operation.from_reply([b"id", b"op1", b"kind", b"rebuild"]) == Operation(
        "op1", "rebuild", "", 0
    )
    assert report_args("op1", state="failed", done=3, result={"generation": 2}) == [
        "op1", "state", "failed", "done", "3", "result", '{"generation":2}',
    ]  # fmt: skip


def test_history_samples_are_the_contract():
    from materializer.contract.history import FIELDS, HistorySample
    from materializer.contract.redis_layout import history_key

    assert history_key("users") == "users:__history__"
    # Every entry has these fields in this order (Redis stores the names once per node).
    assert FIELDS == (
        "state",
        "input_rate",
        "fold_rate",
        "batches",
        "batch_ms",
        "add_batch_ms",
        "get_batch_ms",
        "latest_offset_ms",
        "query_planning_ms",
        "wal_commit_ms",
        "commit_offsets_ms",
        "freshness_p50_ms",
        "freshness_p99_ms",
        "freshness_max_ms",
        "lag_records",
        "lag_ms",
        "dead_letters",
        "state_keys",
        "state_bytes",
        "delta_lag_ms",
        "delta_lag_records",
        "catch_up_rate",
        "eta_seconds",
    )
    sample = HistorySample(
        1700, "running", input_rate=5012.34, fold_rate=12.34, batches=9, batch_ms=410,
        add_batch_ms=320, freshness_p50_ms=380, freshness_p99_ms=990, freshness_max_ms=1204,
        lag_records=0, lag_ms=0, dead_letters=2, state_keys=100, state_bytes=24576,
        catch_up_rate=0.0, eta_seconds=0.0,
    )  # fmt: skip
    fields = sample.to_fields()
    assert list(fields) == list(FIELDS)
    assert fields == {
        "state": "running",
        "input_rate": "5012",
        "fold_rate": "12.3",
        "batches": "9",
        "batch_ms": "410",
        "add_batch_ms": "320",
        "get_batch_ms": "",
        "latest_offset_ms": "",
        "query_planning_ms": "",
        "wal_commit_ms": "",
        "commit_offsets_ms": "",
        "freshness_p50_ms": "380",
        "freshness_p99_ms": "990",
        "freshness_max_ms": "1204",
        "lag_records": "0",
        "lag_ms": "0",
        "dead_letters": "2",
        "state_keys": "100",
        "state_bytes": "24576",
        "delta_lag_ms": "",
        "delta_lag_records": "",
        "catch_up_rate": "0",
        "eta_seconds": "0",
    }


def test_a_state_keys_name_is_its_entitys() -> None:
    from materializer.contract.redis_layout import state_key, state_key_name

    for key in ["k", "user:1", "{tag}rest", "a{b}c", "{}", "x}", "ü nicode"]:
        assert state_key_name("m", state_key("m", key)) == key
