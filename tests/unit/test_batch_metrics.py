"""The metrics listener's parsing, its configuration and its HTTP endpoint (no Spark needed)."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from typer.testing import CliRunner

from materializer.cli import app
from materializer.config import MetricsConfig, parse_config
from materializer.errors import ConfigError, SetupError
from materializer.runtime.metrics import (
    BatchMetrics,
    finished_at,
    partition_lags,
    serve_metrics,
    split_query_name,
)
from materializer.testing import free_port


def test_lag_per_partition_is_latest_minus_end():
    end = '{"t":{"0":5,"1":7},"u":{"0":2}}'
    latest = '{"t":{"0":9,"1":7,"2":3},"u":{"0":2}}'
    assert partition_lags(end, latest) == {
        ("t", "0"): 4,
        ("t", "1"): 0,
        ("t", "2"): 3,  # a partition the batch has not read yet
        ("u", "0"): 0,
    }


@pytest.mark.parametrize(
    ("end", "latest"),
    [
        (None, '{"t":{"0":1}}'),
        ('{"t":{"0":1}}', ""),
        ('{"t":{"0":1}}', "not json"),
        ('{"t":{"0":1}}', "[1, 2]"),
        ('{"logOffset":0}', '{"logOffset":3}'),  # a file source
    ],
)
def test_offsets_without_kafka_partitions_give_no_lag(end, latest):
    assert partition_lags(end, latest) == {}


def test_query_names_split_at_the_last_dot_since_map_names_may_hold_dots():
    assert split_query_name("users.fold") == ("users", "fold")
    assert split_query_name("eu.users.dead_letter") == ("eu.users", "dead_letter")
    assert split_query_name("users~2.fold") == ("users", "fold")
    assert split_query_name("someone-elses-query") is None
    assert split_query_name(None) is None


def test_a_batch_finishes_its_duration_after_its_trigger():
    assert finished_at("2024-05-01T10:00:00.250Z", 1500) == pytest.approx(1714557601.75)


def test_rows_out_are_counted_per_map_and_query_in_the_listeners_own_registry():
    metrics = BatchMetrics()
    metrics.rows_out("users.fold", 0, 3)
    metrics.rows_out("users.fold", 1, 2)
    metrics.rows_out("users.delta", 0, 4)
    metrics.rows_out("unnamed", 0, 9)  # not a map's query: left out
    text = generate_latest(metrics.registry).decode()
    assert 'materializer_rows_out_total{map="users",query="fold"} 5.0' in text
    assert 'materializer_rows_out_total{map="users",query="delta"} 4.0' in text
    assert "unnamed" not in text
    assert "materializer_rows_out_total" not in generate_latest().decode()  # not the global one


def test_metrics_config_defaults_and_checks():
    assert parse_config({}).metrics == MetricsConfig(host="0.0.0.0", port=9465)  # noqa: S104
    assert parse_config({"metrics": {"port": 0}}).metrics.port == 0
    with pytest.raises(ConfigError) as info:
        parse_config({"metrics": {"port": 70000, "path": "/m"}})
    assert "metrics.port: Input should be less than or equal to 65535" in info.value.problems
    assert "metrics.path: unknown key" in info.value.problems


def test_the_endpoint_serves_the_registry_and_port_zero_serves_nothing():
    metrics = BatchMetrics()
    metrics.rows_out("users.fold", 0, 7)
    assert serve_metrics(MetricsConfig(port=0), metrics.registry) is None
    port = free_port()
    server = serve_metrics(MetricsConfig(host="127.0.0.1", port=port), metrics.registry)
    assert server is not None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
        assert 'materializer_rows_out_total{map="users",query="fold"} 7.0' in text
    finally:
        server.shutdown()
        server.server_close()


def test_a_taken_port_is_a_setup_error_naming_it():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SetupError, match=f"metrics: cannot listen on 127.0.0.1:{port}"):
            serve_metrics(MetricsConfig(host="127.0.0.1", port=port), BatchMetrics().registry)


def test_run_checks_the_metrics_port_before_starting_anything(tmp_path: Path):
    cfg = tmp_path / "maps.yaml"
    cfg.write_text(
        "maps:\n  users:\n    source: {topics: [user-events], schema: 'id STRING'}\n    key: id\n"
    )
    result = CliRunner().invoke(app, ["run", "-c", str(cfg), "--metrics-port", "70000"])
    assert result.exit_code == 2
    assert "--metrics-port" in result.output
