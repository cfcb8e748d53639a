from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from materializer.cli import app

runner = CliRunner()


def test_validate_accepts_a_good_file(tmp_path: Path):
    good = tmp_path / "maps.yaml"
    good.write_text(
        "maps:\n  users:\n    source: {topics: [user-events], schema: 'id STRING'}\n    key: id\n"
    )
    result = runner.invoke(app, ["validate", "-c", str(good)])
    assert result.exit_code == 0, result.output
    assert "ok (1 map)" in result.output


def test_validate_names_each_bad_key_and_exits_non_zero(tmp_path: Path):
    bad = tmp_path / "maps.yaml"
    bad.write_text(
        "maps:\n  users:\n    source: {topics: [user-events]}\n    key: id\n    fold: {mode: x}\n"
    )
    result = runner.invoke(app, ["validate", "-c", str(bad)])
    assert result.exit_code == 2
    assert "maps.users.fold.mode: must be one of latest, merge, aggregate" in result.output


def test_validate_refuses_what_schemaless_json_cannot_do(tmp_path: Path):
    bad = tmp_path / "maps.yaml"
    bad.write_text(
        "maps:\n  users:\n    source: {topics: [user-events]}\n    key: id\n"
        "    transforms: [{type: drop, fields: [ssn]}]\n    fold: {mode: merge}\n"
    )
    result = runner.invoke(app, ["validate", "-c", str(bad)])
    assert result.exit_code == 2
    assert "maps.users.transforms: needs source.schema" in result.output
    assert "maps.users.fold.mode: merge needs source.schema" in result.output


def test_run_rejects_an_unknown_map_before_starting_spark(tmp_path: Path):
    cfg = tmp_path / "maps.yaml"
    cfg.write_text(
        "maps:\n  users:\n    source: {topics: [user-events], schema: 'id STRING'}\n    key: id\n"
    )
    result = runner.invoke(app, ["run", "-c", str(cfg), "--map", "orders"])
    assert result.exit_code == 2
    assert "maps.orders: no such map" in result.output
