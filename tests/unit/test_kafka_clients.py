"""``kafka.security`` as each client family names it, and its config errors by key path."""

from __future__ import annotations

from pathlib import Path

import pytest

from materializer.clients.kafka import java, librdkafka
from materializer.config import KafkaConfig, parse_config
from materializer.errors import ConfigError


def kafka(tmp_path: Path, **security: object) -> KafkaConfig:
    return KafkaConfig.model_validate({"bootstrap_servers": "b:9093", "security": security})


def pem(tmp_path: Path, name: str) -> str:
    path = tmp_path / name
    path.write_text(f"-----BEGIN {name}-----\n")
    return str(path)


def test_sasl_over_tls_maps_to_both_families(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("KAFKA_PW", 'p"w\\d')
    config = kafka(
        tmp_path,
        ca_file=pem(tmp_path, "ca"),
        sasl={"mechanism": "SCRAM-SHA-512", "username": "bob", "password": {"env": "KAFKA_PW"}},
    )
    assert librdkafka(config) == {
        "bootstrap.servers": "b:9093",
        "security.protocol": "SASL_SSL",
        "ssl.ca.pem": "-----BEGIN ca-----\n",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "bob",
        "sasl.password": 'p"w\\d',
    }
    props = java(config)
    assert props["security.protocol"] == "SASL_SSL"
    assert props["ssl.truststore.type"] == "PEM"
    assert props["ssl.truststore.certificates"] == "-----BEGIN ca-----\n"
    assert props["sasl.jaas.config"] == (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="bob" password="p\\"w\\\\d";'
    )


def test_mutual_tls_passes_the_client_certificate(tmp_path: Path):
    config = kafka(
        tmp_path, cert_file=pem(tmp_path, "cert"), key_file=pem(tmp_path, "key"), key_password="k"
    )
    assert librdkafka(config)["security.protocol"] == "SSL"
    assert librdkafka(config)["ssl.key.pem"] == "-----BEGIN key-----\n"
    props = java(config)
    assert props["ssl.keystore.certificate.chain"] == "-----BEGIN cert-----\n"
    assert props["ssl.keystore.key"] == "-----BEGIN key-----\n"
    assert props["ssl.key.password"] == "k"


def test_properties_come_last_and_settings_before_them():
    config = KafkaConfig(bootstrap_servers="b:1", properties={"linger.ms": "50"})
    assert librdkafka(config, **{"linger.ms": "5", "acks": "all"}) == {
        "bootstrap.servers": "b:1",
        "linger.ms": "50",
        "acks": "all",
    }
    assert "security.protocol" not in java(config)


def test_a_secret_never_shows_in_the_configs_repr(tmp_path: Path):
    config = kafka(tmp_path, sasl={"mechanism": "PLAIN", "username": "u", "password": "hunter2"})
    assert "hunter2" not in repr(config) and "hunter2" not in str(config.model_dump())


@pytest.mark.parametrize(
    ("security", "problem"),
    [
        (
            {"sasl": {"mechanism": "GSSAPI", "username": "u", "password": "p"}},
            "kafka.security.sasl.mechanism",
        ),
        (
            {
                "sasl": {
                    "mechanism": "PLAIN",
                    "username": "u",
                    "password": {"env": "A", "file": "B"},
                }
            },
            "kafka.security.sasl.password: give exactly one of env, file or value",
        ),
        ({"cert_file": "c.pem"}, "kafka.security: cert_file and key_file go together"),
    ],
)
def test_bad_security_names_its_key_path(security: dict[str, object], problem: str):
    with pytest.raises(ConfigError) as bad:
        parse_config({"kafka": {"security": security}})
    assert problem in str(bad.value)


@pytest.mark.parametrize("client", [java, librdkafka])
def test_a_secret_or_file_missing_where_the_client_starts_names_its_key_path(
    tmp_path: Path, client: object
):
    """``validate`` runs where secrets are not mounted; the clients need them."""
    sasl = {"mechanism": "PLAIN", "username": "u", "password": {"env": "NOPE_X"}}
    with pytest.raises(ConfigError, match="kafka.security.sasl.password: environment variable"):
        client(kafka(tmp_path, sasl=sasl))  # type: ignore[operator]
    file_secret = {**sasl, "password": {"file": str(tmp_path / "none")}}
    with pytest.raises(ConfigError, match="kafka.security.sasl.password: cannot read"):
        client(kafka(tmp_path, sasl=file_secret))  # type: ignore[operator]
    if client is java:
        with pytest.raises(ConfigError, match="kafka.security.ca_file: cannot read /no/ca.pem"):
            java(kafka(tmp_path, ca_file="/no/ca.pem"))


def test_spark_readers_never_wait_out_kafkas_fetch_wait_the_live_ones_do_and_properties_win():
    from materializer.config import AppConfig
    from materializer.source.kafka import (
        FETCH_MAX_WAIT_MS,
        LIVE_FETCH_MAX_WAIT_MS,
        kafka_options,
    )

    plain = AppConfig(kafka=KafkaConfig(bootstrap_servers="b:9092"))
    options = kafka_options(plain, ["t"], "earliest")
    assert options["kafka.fetch.max.wait.ms"] == str(FETCH_MAX_WAIT_MS)
    assert FETCH_MAX_WAIT_MS < 500  # Kafka's own default, which held tasks in the broker
    own = KafkaConfig(bootstrap_servers="b:9092", properties={"fetch.max.wait.ms": "250"})
    options = kafka_options(AppConfig(kafka=own), ["t"], "earliest")
    assert options["kafka.fetch.max.wait.ms"] == "250"
    # The real-time path's readers wait for records to come: the broker holds their fetches.
    live = kafka_options(plain, ["t"], "earliest", fetch_max_wait_ms=LIVE_FETCH_MAX_WAIT_MS)
    assert live["kafka.fetch.max.wait.ms"] == str(LIVE_FETCH_MAX_WAIT_MS)
    assert LIVE_FETCH_MAX_WAIT_MS >= 500
    live = kafka_options(AppConfig(kafka=own), ["t"], "earliest", fetch_max_wait_ms=500)
    assert live["kafka.fetch.max.wait.ms"] == "250"
