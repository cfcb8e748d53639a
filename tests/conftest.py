"""Session-wide real services: one Kafka broker, one redis-server, one SparkSession,
one schema registry.

Set KAFKA_BOOTSTRAP_SERVERS, REDIS_URL or SCHEMA_REGISTRY_URL to use running
services instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis

from materializer.config import SparkConfig
from materializer.testing import KafkaBroker, RedisServer, create_topic
from materializer.testing.registry import ApicurioRegistry

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    existing = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if existing:
        yield existing
        return
    with KafkaBroker() as broker:
        yield broker.bootstrap_servers


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    existing = os.environ.get("REDIS_URL")
    if existing:
        yield existing
        return
    with RedisServer() as server:
        yield server.url


@pytest.fixture(scope="session")
def schema_registry_url() -> Iterator[str]:
    """A real schema registry's Confluent API (Apicurio Registry), one per test worker."""
    existing = os.environ.get("SCHEMA_REGISTRY_URL")
    if existing:
        yield existing
        return
    with ApicurioRegistry() as registry:
        yield registry.url


@pytest.fixture()
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture()
def new_topic(kafka_bootstrap: str) -> Callable[..., str]:
    def make(partitions: int = 1) -> str:
        return create_topic(kafka_bootstrap, partitions)

    return make


@pytest.fixture(scope="session")
def spark_config(tmp_path_factory: pytest.TempPathFactory) -> SparkConfig:
    root = tmp_path_factory.mktemp("spark")
    return SparkConfig(
        master="local[2]",
        checkpoint_root=str(root / "checkpoints"),
        shuffle_partitions=2,
        conf={
            "spark.sql.warehouse.dir": str(root / "spark-warehouse"),
            "spark.driver.memory": "2g",
        },
    )


@pytest.fixture(scope="session")
def spark(spark_config: SparkConfig) -> Iterator[SparkSession]:
    from materializer.spark.session import build_spark_session

    session = build_spark_session(spark_config, app_name="materializer-tests")
    yield session
    session.stop()


@pytest.fixture()
def warehouse(tmp_path: Path) -> Path:
    path = tmp_path / "warehouse"
    path.mkdir()
    return path


RUNS = (
    "test_exactly_once.py",  # three crashes of a run with two maps and two enrichments
    "test_operations.py",  # one run walked through pause, rehydrate, rebuild and restart
    "test_demo.py",
    "test_run.py",
    "test_source_loss.py",  # a run whose maps lost source records, and their way out
)
"""Test files that start ``materializer run`` (a JVM of its own, many queries): the longest.

With two workers (``make test``) they run one after the other on one worker,
first, while the other worker takes every other file: two such runs at once
on two cores would starve each other's micro-batches."""


CLUSTERS = ("test_scale_kafka.py", "test_scale_spark.py")
"""The next longest: a three-node Kafka cluster, and a Spark standalone cluster with a run
of its own. They start first on the other worker."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        return 0 if item.path.name in RUNS else 1 if item.path.name in CLUSTERS else 2

    items.sort(key=rank)  # stable: the rest keep their order


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    from xdist.scheduler import LoadFileScheduling

    class RunsTogether(LoadFileScheduling):
        """Files as units of work, the ``RUNS`` files together as one."""

        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "materializer-runs" if scope.rsplit("/", 1)[-1] in RUNS else scope

    return RunsTogether(config, log)
