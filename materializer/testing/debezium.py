"""Debezium capturing a real PostgreSQL into the tests' Kafka: the change events a
``source.envelope: debezium`` map folds, written as Kafka Connect writes them.

``with DebeziumCapture(pg, bootstrap, tables=["public.items"], converter="avro",
registry_url=registry) as capture: capture.topic("public.items")`` starts
``io.materializer.capture.Capture`` (jvm/debezium, resolved into ``jvm/lib/debezium`` by
``make jars``): Debezium's embedded engine and PostgreSQL connector (pgoutput, a
replication slot and publication of its own, offsets in memory), each key and value
converted by

- ``json``: Kafka Connect's JsonConverter with ``schemas.enable=true`` (``{"schema", "payload"}``);
- ``json-plain``: the same with ``schemas.enable=false`` (the payload alone);
- ``avro``: Apicurio's AvroConverter, in Confluent's wire format (magic byte 0, a 4-byte id
  that the registry's Confluent API resolves), the schemas registered as
  ``<topic>-key`` and ``<topic>-value``;

and produced (``acks=all``, idempotent) to Debezium's topics, ``<prefix>.<schema>.<table>``,
tombstones and truncates included. The included tables are snapshotted first (op ``r``);
the context is entered once the snapshot is done and changes stream, and left with
SIGTERM: the engine closed, every event acknowledged by Kafka, the replication slot and
the publication dropped.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from typing import Literal, Self

from materializer.errors import MaterializerError, SetupError
from materializer.jvm import jars
from materializer.testing.java_server import JavaServer
from materializer.testing.postgres import Postgres
from materializer.testing.waiting import wait_until

Converter = Literal["json", "json-plain", "avro"]

MAIN = "io.materializer.capture.Capture"
STREAMING = "capture: streaming"
"""The line the capture prints once its snapshot is done and its replication stream open."""


class DebeziumCapture(JavaServer):
    """One capture process: the included ``tables`` of ``postgres`` to ``bootstrap_servers``.

    ``topic_prefix`` (a fresh ``cdc_<hex>`` by default, so tests never share a topic, a
    slot or a publication) must be a valid Avro name for ``avro``. ``properties`` are
    Debezium's own (``decimal.handling.mode``, ``time.precision.mode``...), given as a
    connector's config would give them; ``converter_properties`` go to both converters.
    """

    name = "debezium capture"

    def __init__(
        self,
        postgres: Postgres,
        bootstrap_servers: str,
        *,
        tables: Sequence[str],
        converter: Converter = "json",
        registry_url: str | None = None,
        topic_prefix: str | None = None,
        properties: Mapping[str, str] | None = None,
        converter_properties: Mapping[str, str] | None = None,
        heap: str = "256m",
    ) -> None:
        super().__init__(heap)
        if converter == "avro" and not registry_url:
            raise ValueError("the avro converter needs registry_url")
        self.postgres = postgres
        self.bootstrap_servers = bootstrap_servers
        self.tables = list(tables)
        self.converter = converter
        self.registry_url = registry_url
        self.topic_prefix = topic_prefix or f"cdc_{uuid.uuid4().hex[:12]}"
        self.slot = re.sub(r"[^a-z0-9_]", "_", f"capture_{self.topic_prefix}".lower())[:63]
        """The replication slot, and the publication of the same name."""
        self.properties = dict(properties or {})
        self.converter_properties = dict(converter_properties or {})
        self.final_log = ""
        """The capture's whole log, kept by ``stop`` (its folder goes)."""

    def topic(self, table: str) -> str:
        """The topic of ``table`` (``schema.table``), as Debezium names it."""
        return f"{self.topic_prefix}.{table}"

    def settings(self) -> dict[str, str]:
        """The capture's settings (``CaptureConfig`` in jvm/debezium), as its file holds them."""
        pg = self.postgres
        out = {
            "postgres.host": pg.host,
            "postgres.port": str(pg.port),
            "postgres.db": pg.database,
            "postgres.user": pg.user,
            "postgres.password": pg.password,
            "tables": ",".join(self.tables),
            "topic.prefix": self.topic_prefix,
            "bootstrap.servers": self.bootstrap_servers,
            "converter": self.converter,
            "slot": self.slot,
            "publication": self.slot,
        }
        if self.registry_url:
            out["registry.url"] = self.registry_url
        out.update({f"debezium.{k}": v for k, v in self.properties.items()})
        out.update({f"converter.{k}": v for k, v in self.converter_properties.items()})
        return out

    def launch(self) -> Self:
        """Start the process and return at once (``wait_streaming`` waits for it)."""
        settings = self.workdir / "capture.properties"
        # Java's properties format: backslashes and line ends escaped; the password stays
        # off the command line.
        settings.write_text(
            "".join(f"{k}={_escape(v)}\n" for k, v in self.settings().items()), encoding="utf-8"
        )
        settings.chmod(0o600)
        classpath = ":".join(str(p) for p in jars("debezium"))
        self._launch("-XX:+UseSerialGC", "-cp", classpath, MAIN, f"@{settings}")
        return self

    def wait_streaming(self, timeout: float = 120.0) -> None:
        """Wait until the capture says it streams; ``SetupError`` with the end of its log
        when it exits or times out first."""
        proc = self._proc
        if proc is None:
            raise RuntimeError("the capture is not launched")
        try:
            wait_until(
                f"the Debezium capture of {self.topic_prefix}",
                lambda: STREAMING in proc.log(),
                timeout,
                proc.alive,
            )
        except (TimeoutError, RuntimeError) as exc:
            raise SetupError(f"{exc}:\n{proc.tail(60)}") from None

    def start(self, timeout: float = 120.0) -> Self:
        """Start the capture and wait until its snapshot is done and changes stream."""
        self.launch()
        self.wait_streaming(timeout)
        return self

    def started(self) -> Self:
        """``start``; a capture that does not stream is stopped (its ``SetupError`` carries
        the end of its log)."""
        try:
            return self.start()
        except Exception:
            self.stop()
            raise

    def log(self) -> str:
        """The capture's whole log so far (after ``stop``, ``final_log``)."""
        return self._proc.log() if self._proc is not None else self.final_log

    def stop(self) -> None:
        """SIGTERM (the engine closed, every event acknowledged by Kafka, the slot
        dropped), SIGKILL after 20 s; then the slot, if a kill left it, and the
        publication are dropped while the server is there to take it."""
        if self._proc is not None:
            self._proc.stop(timeout=20)
            self.final_log = self._proc.log()
            with contextlib.suppress(MaterializerError, OSError, subprocess.SubprocessError):
                self.postgres.execute(
                    f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    f"WHERE slot_name = '{self.slot}' AND NOT active;\n"
                    f'DROP PUBLICATION IF EXISTS "{self.slot}";',
                    timeout=10,
                )
        super().stop()


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
