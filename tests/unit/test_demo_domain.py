"""The demo's configuration is a valid one, and keeps every file of a run in its work dir."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from materializer.cli import app
from materializer.config import load_config
from materializer.demo.domain import ORDER_AGGREGATES, USER_ORDERS, USERS, demo_config, write_config


def _write(tmp_path: Path) -> Path:
    doc = demo_config(
        workdir=tmp_path,
        bootstrap_servers="127.0.0.1:9092",
        redis_url="redis://127.0.0.1:6379/0",
        port=50051,
    )
    return write_config(tmp_path / "demo.yaml", doc)


def test_the_demo_config_passes_validate(tmp_path: Path):
    result = CliRunner().invoke(app, ["validate", "-c", str(_write(tmp_path))])
    assert result.exit_code == 0, result.output
    assert "ok (2 maps)" in result.output


def test_the_maps_fold_as_the_domain_says(tmp_path: Path):
    cfg = load_config(_write(tmp_path))
    assert cfg.maps[USERS].fold.mode == "merge"
    orders = cfg.maps[USER_ORDERS].fold
    assert orders.mode == "aggregate"
    assert {n: (a.fn, a.field) for n, a in orders.aggregates.items()} == ORDER_AGGREGATES
    assert cfg.query.host == "127.0.0.1"
    assert cfg.query.metrics_port is None


def test_every_path_of_a_run_is_inside_the_work_dir(tmp_path: Path):
    cfg = load_config(_write(tmp_path))
    paths = [cfg.delta.root, cfg.spark.checkpoint_root, *cfg.spark.conf.values()]
    for path in paths:
        assert Path(path).is_relative_to(tmp_path), path
