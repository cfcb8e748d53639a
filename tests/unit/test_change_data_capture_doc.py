"""docs/change-data-capture.md's example is a map config this version accepts, and its
connector config is JSON."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import yaml

from materializer.config import MapConfig

DOC = Path(__file__).parents[2] / "docs" / "change-data-capture.md"


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", DOC.read_text(), re.DOTALL)


def test_the_example_map_is_valid() -> None:
    (doc,) = blocks("yaml")
    maps = yaml.safe_load(doc)["maps"]
    config = MapConfig.model_validate(maps["customers"])
    assert config.source.envelope == "debezium"
    assert config.key == "$kafka_key"


def test_the_connector_config_and_the_answer_are_json() -> None:
    connector, answer = blocks("json")
    assert orjson.loads(connector)["config"]["skipped.operations"] == "none"
    assert orjson.loads(answer)["entity"]["id"] == 42
