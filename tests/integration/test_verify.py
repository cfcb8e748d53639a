"""``materializer verify``: a real map's Redis copy against its Delta table and changelog tail."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from materializer.cli import app
from materializer.contract.redis_layout import entity_key, meta_key
from materializer.testing import RedisServer, create_topic
from tests.helpers.folded_maps import FoldedMap, run_map

runner = CliRunner()


@pytest.fixture(scope="module")
def own_redis() -> Iterator[RedisServer]:
    """Redis for the map these tests change: never the session's shared server."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def folded(spark, kafka_bootstrap, own_redis, tmp_path_factory: pytest.TempPathFactory):
    """A map whose Delta table lags its changelog: verify must count the tail in."""
    return run_map(
        spark,
        kafka_bootstrap,
        own_redis.url,
        create_topic(kafka_bootstrap, 2),
        tmp_path_factory.mktemp("verify"),
        lag_delta=True,
    )


def verify(folded: FoldedMap, *extra: str) -> tuple[int, str]:
    result = runner.invoke(app, ["verify", folded.name, "-c", str(folded.config_file), *extra])
    return result.exit_code, result.output


def test_an_untouched_map_verifies_identical(folded: FoldedMap):
    code, output = verify(folded)

    assert code == 0, output
    assert "identical" in output
    assert str(len(folded.snapshot)) in output


def test_each_difference_is_reported_and_fails(folded: FoldedMap):
    client = folded.client()
    name = folded.name
    changed, gone = sorted(folded.snapshot)[:2]
    try:
        client.set(entity_key(name, changed), b'{"id":"changed"}')
        client.delete(entity_key(name, gone))
        client.set(entity_key(name, "intruder"), b"{}")

        code, output = verify(folded)

        assert code == 1, output
        lines = output.splitlines()

        def listed_under(label: str) -> list[str]:
            start = next(i for i, line in enumerate(lines) if line.startswith(label))
            assert lines[start] == f"{label}: 1", output
            return [line.strip() for line in lines[start + 1 : start + 2]]

        assert listed_under("missing in Redis") == [gone]
        assert listed_under("extra in Redis") == ["intruder"]
        assert listed_under("different value") == [changed]
        assert "watermark differs" not in output
    finally:
        runner.invoke(app, ["rehydrate", name, "-c", str(folded.config_file)])
    code, output = verify(folded)
    assert code == 0, output


def test_a_watermark_other_than_the_fold_checkpoints_fails(folded: FoldedMap):
    client = folded.client()
    key = meta_key(folded.name)
    try:
        client.hset(key, "batch_id", str(folded.meta.batch_id + 7))

        code, output = verify(folded)

        assert code == 1, output
        assert "watermark differs from the fold checkpoint's last batch" in output
        assert "missing in Redis" not in output and "different value" not in output
    finally:
        client.hset(key, "batch_id", str(folded.meta.batch_id))


def test_only_a_few_keys_are_listed_with_the_count(folded: FoldedMap):
    client = folded.client()
    extra = [f"zz{i}" for i in range(5)]
    try:
        for key in extra:
            client.set(entity_key(folded.name, key), b"{}")

        code, output = verify(folded, "--show", "2")

        assert code == 1, output
        assert "extra in Redis: 5 (first 2)" in output
        assert "  zz0" in output and "  zz1" in output and "zz2" not in output
    finally:
        client.delete(*[entity_key(folded.name, key) for key in extra])


def test_an_unknown_map_or_config_is_a_usage_error(folded: FoldedMap, tmp_path: Path):
    code, output = verify(FoldedMap(**{**folded.__dict__, "name": "nope"}))
    assert code == 2
    assert "maps.nope" in output

    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump({"maps": {"x": {"key": "id"}}}))
    result = runner.invoke(app, ["verify", "x", "-c", str(broken)])
    assert result.exit_code == 2


def test_replay_from_kafka_agrees_and_sees_a_changed_value(folded: FoldedMap):
    client = folded.client()
    name = folded.name
    code, output = verify(folded, "--replay")
    assert code == 0, output
    assert "the fold replayed from Kafka agrees with Redis" in output

    changed = sorted(folded.snapshot)[0]
    try:
        client.set(entity_key(name, changed), b'{"id":"changed"}')
        code, output = verify(folded, "--replay")
        assert code == 1, output
        lines = output.splitlines()
        start = lines.index("different value (against the replayed fold): 1")
        assert lines[start + 1].strip() == changed
    finally:
        client.set(entity_key(name, changed), folded.snapshot[changed])
    # The replay's throwaway copy is gone.
    assert list(client.scan_iter(match=f"{name}~*")) == []
