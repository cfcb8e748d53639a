"""``kafka.security`` against a broker that serves SASL_SSL (PLAIN, SCRAM) and mutual TLS.

Every client the product runs takes its settings from ``materializer.clients.kafka``:
librdkafka (admin, dead letters, changelog, group commits, status reads) and Kafka's
Java client (Spark's source and writers). The tests' own set-up uses the broker's
PLAINTEXT listener, so what they check was written or read through the secured one.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from confluent_kafka import Consumer, Producer

from materializer.clients.kafka import librdkafka
from materializer.clients.kafka_offsets import KafkaAccessError, check_access
from materializer.config import AppConfig, KafkaConfig
from materializer.source.kafka import kafka_options
from materializer.testing import produce
from materializer.testing.kafka import create_topic
from materializer.testing.kafka_security import PLAIN_USERS, SCRAM_USERS, SecuredBroker
from materializer.testing.process import ManagedProcess
from materializer.testing.reference import fold_latest
from materializer.testing.waiting import wait_until
from tests.helpers.slices import FIELDS, delta_map_rs, group_offsets, redis_map, slice_config


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    with SecuredBroker(tmp_path_factory.mktemp("secured-kafka")) as broker:
        yield broker


def security(broker: SecuredBroker, kind: str, password: Any = None) -> dict[str, Any]:
    """The ``kafka`` block of a config for one way in."""
    if kind == "mtls":
        return {
            "bootstrap_servers": broker.mtls_bootstrap,
            "security": {
                "ca_file": str(broker.ca),
                "cert_file": str(broker.client_cert),
                "key_file": str(broker.client_key),
            },
        }
    if kind == "PLAIN":
        user, secret = next(iter(PLAIN_USERS.items()))
    else:
        user, secret = next((u, p) for u, (m, p) in SCRAM_USERS.items() if m == kind)
    sasl = {"mechanism": kind, "username": user, "password": password or secret}
    return {
        "bootstrap_servers": broker.sasl_bootstrap,
        "security": {"ca_file": str(broker.ca), "sasl": sasl},
    }


WAYS_IN = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "mtls"]


@pytest.mark.parametrize("kind", WAYS_IN)
def test_librdkafka_clients_produce_and_consume_through_each_way_in(
    secured: SecuredBroker, kind: str
):
    kafka = KafkaConfig.model_validate(security(secured, kind))
    check_access(kafka)
    topic = create_topic(secured.bootstrap_servers, 1)
    producer = Producer(librdkafka(kafka, **{"enable.idempotence": True}))
    producer.produce(topic, key=b"k", value=kind.encode())
    assert producer.flush(30) == 0
    consumer = Consumer(
        librdkafka(kafka, **{"group.id": f"g-{kind}", "auto.offset.reset": "earliest"})
    )
    consumer.subscribe([topic])
    try:
        message = None
        for _ in range(60):
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                break
        assert message is not None and message.value() == kind.encode()
    finally:
        consumer.close()


@pytest.mark.parametrize("kind", ["PLAIN", "SCRAM-SHA-512", "mtls"])
def test_sparks_kafka_source_reads_through_each_way_in(secured: SecuredBroker, spark, kind: str):
    """The Java client's settings: a JAAS line, PEM certificates and keys inline."""
    topic = create_topic(secured.bootstrap_servers, 2)
    records = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(20)]
    produce(secured.bootstrap_servers, topic, records)
    kafka = KafkaConfig.model_validate(security(secured, kind))
    options = kafka_options(AppConfig(kafka=kafka), [topic], "earliest")
    options.pop("includeHeaders")
    rows = spark.read.format("kafka").options(**options).load().select("value").collect()
    assert sorted(bytes(r.value) for r in rows) == sorted(v for _, v in records)


def test_a_wrong_password_is_one_error_naming_user_and_mechanism(secured: SecuredBroker):
    kafka = KafkaConfig.model_validate(security(secured, "SCRAM-SHA-256", password="wrong"))
    with pytest.raises(KafkaAccessError) as refused:
        check_access(kafka)
    message = str(refused.value)
    assert "SCRAM-SHA-256, user 'bob'" in message and secured.sasl_bootstrap in message
    assert "wrong" not in message


def test_a_run_over_sasl_ssl_folds_exactly_with_every_client_secured(
    secured: SecuredBroker, redis_url, redis_client, tmp_path: Path
):
    """Source, dead letters, changelog (to Delta), group commits and status: SCRAM over TLS,
    the password from the environment."""
    topic = create_topic(secured.bootstrap_servers, 2)
    doc = slice_config(tmp_path, secured.bootstrap_servers, redis_url, topic, map_name="secure")
    doc["kafka"] = security(secured, "SCRAM-SHA-256", password={"env": "TEST_KAFKA_PASSWORD"})
    doc["maps"]["secure"]["dead_letter"] = {"topic": f"{topic}.dlq"}
    config_file = tmp_path / "maps.yaml"
    config_file.write_text(yaml.safe_dump(doc))
    rng = random.Random(3)
    records: list[tuple[bytes, bytes | None]] = []
    for i in range(200):
        key = f"u{rng.randrange(30)}"
        records.append((key.encode(), orjson.dumps({"id": key, "age": i})))
    records.append((b"bad", b"{not json"))
    positions = produce(secured.bootstrap_servers, topic, records)
    events = [(p, o, k, v) for (p, o), (k, v) in zip(positions, records[:-1], strict=False)]
    reference = fold_latest(events, "id", FIELDS)

    env = {**os.environ, "TEST_KAFKA_PASSWORD": SCRAM_USERS["bob"][1]}
    args = [sys.executable, "-m", "materializer", "run", "-c", str(config_file)]
    proc = ManagedProcess(args, tmp_path / "run.log", env=env)
    try:
        wait_until(
            "Redis to hold every entity", lambda: redis_map(redis_client, "secure") == reference
        )
        wait_until(
            "Delta to hold every entity",
            lambda: delta_map_rs(tmp_path / "warehouse" / "secure") == reference,
            retry_errors=True,  # the table is made by the Delta query, after the opening batch
        )
        ends = {p: o + 1 for p, o in positions}
        wait_until(
            "the group's commit of the last batch",
            lambda: (
                group_offsets(secured.bootstrap_servers, "materializer.secure", topic)
                .get(topic, {})
                .get(positions[-1][0])
                == ends[positions[-1][0]]
            ),
        )
        status = subprocess.run(
            [sys.executable, "-m", "materializer", "status", "-c", str(config_file), "--json"],
            capture_output=True,
            env=env,
            timeout=120,
            check=True,
        )
        view = orjson.loads(status.stdout.splitlines()[0])
        assert (view["map"], view["total_lag"]) == ("secure", 0), view
        proc.proc.send_signal(signal.SIGTERM)
        proc.proc.wait(150)
    finally:
        proc.stop()
    log = proc.log_path.read_text()
    assert proc.proc.returncode == 0, log[-3000:]
    assert SCRAM_USERS["bob"][1] not in log
    letters = _read_all(secured.bootstrap_servers, f"{topic}.dlq")
    assert [value for _, value in letters] == [b"{not json"]


def test_a_run_with_a_wrong_password_fails_its_map_with_one_clear_error(
    secured: SecuredBroker, redis_url, tmp_path: Path
):
    topic = create_topic(secured.bootstrap_servers, 1)
    doc = slice_config(tmp_path, secured.bootstrap_servers, redis_url, topic, map_name="locked")
    doc["kafka"] = security(secured, "SCRAM-SHA-512", password="not-carols")
    config_file = tmp_path / "maps.yaml"
    config_file.write_text(yaml.safe_dump(doc))
    args = [sys.executable, "-m", "materializer", "run", "-c", str(config_file)]
    proc = ManagedProcess(args, tmp_path / "run.log")
    try:
        assert proc.proc.wait(300) == 1
    finally:
        proc.stop()
    log = proc.log_path.read_text()
    assert "map locked cannot reach its topics: Kafka at" in log, log[-3000:]
    assert "SCRAM-SHA-512, user 'carol'" in log
    assert "failed: locked" in log
    assert "not-carols" not in log


def _read_all(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "dlq-reader", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    out: list[tuple[bytes | None, bytes | None]] = []
    try:
        for _ in range(30):
            message = consumer.poll(1.0)
            if message is None:
                if out:
                    break
                continue
            if message.error() is None:
                out.append((message.key(), message.value()))
    finally:
        consumer.close()
    return out
