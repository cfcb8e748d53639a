"""A single-node KRaft Apache Kafka broker run from the resolved jars.

The broker is both controller and broker, its storage formatted in a temp dir,
listening on free loopback ports. Topics get uuid names so tests never share one.
"""

from __future__ import annotations

import base64
import functools
import shutil
import socket
import tempfile
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from confluent_kafka import KafkaError, Message
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic, Producer

from materializer.errors import SetupError
from materializer.jvm import jars
from materializer.testing.ports import free_port, wait_until
from materializer.testing.process import ManagedProcess

_LOG4J2 = """\
status = error
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = file
"""


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class KafkaBroker:
    """``with KafkaBroker() as k: k.bootstrap_servers``."""

    def __init__(self, workdir: Path | None = None, heap: str = "512m") -> None:
        self.port = free_port()
        self.controller_port = free_port()
        self.bootstrap_servers = f"127.0.0.1:{self.port}"
        self._heap = heap
        self._workdir = workdir
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._proc: ManagedProcess | None = None

    def _properties(self, data_dir: Path) -> str:
        return "\n".join(
            [
                "process.roles=broker,controller",
                "node.id=1",
                f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
                f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
                f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                "controller.listener.names=CONTROLLER",
                "inter.broker.listener.name=PLAINTEXT",
                "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                f"log.dirs={data_dir}",
                "num.partitions=1",
                "offsets.topic.replication.factor=1",
                "offsets.topic.num.partitions=4",
                "transaction.state.log.replication.factor=1",
                "transaction.state.log.min.isr=1",
                "transaction.state.log.num.partitions=4",
                "share.coordinator.state.topic.replication.factor=1",
                "group.initial.rebalance.delay.ms=0",
                # As production brokers should run: Materializer creates every topic it
                # writes, and a producer still holding a dropped generation's changelog
                # topic in its metadata would make an auto-creating broker bring it back.
                "auto.create.topics.enable=false",
                "message.max.bytes=16777216",
                "log.flush.interval.messages=9223372036854775807",
                "",
            ]
        )

    def _java(self, main: str, *args: str, log: Path) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise SetupError("java not found: Java 17 or newer is needed to run the Kafka broker")
        classpath = ":".join(str(p) for p in jars("kafka"))
        return [
            java,
            f"-Xmx{self._heap}",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={log}",
            "-cp",
            classpath,
            main,
            *args,
        ]

    def start(self, timeout: float = 90.0) -> KafkaBroker:
        """Format the storage, start the broker, wait until it serves metadata."""
        if self._workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="materializer-kafka-")
            self._workdir = Path(self._tmp.name)
        work = self._workdir
        props = work / "server.properties"
        props.write_text(self._properties(work / "data"))
        log4j = work / "log4j2.properties"
        log4j.write_text(_LOG4J2.format(log=work / "broker.log"))
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        fmt = ManagedProcess(
            self._java(
                "kafka.tools.StorageTool",
                "format",
                f"--cluster-id={cluster_id}",
                "-c",
                str(props),
                log=log4j,
            ),
            work / "format.log",
        )
        if fmt.proc.wait(120) != 0:
            raise SetupError(f"formatting Kafka storage failed:\n{fmt.tail()}")
        fmt.stop()
        self._proc = ManagedProcess(
            self._java("kafka.Kafka", str(props), log=log4j), work / "stdout.log"
        )
        proc = self._proc
        try:
            # A client made before the port opens logs every refused connection: wait for it first.
            wait_until("kafka broker port", lambda: _port_open(self.port), timeout, proc.alive)
            admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
            wait_until(
                "kafka broker",
                lambda: len(admin.list_topics(timeout=2).brokers) == 1,
                timeout,
                proc.alive,
            )
        except Exception as exc:
            tail = proc.tail()
            self.stop()
            raise SetupError(f"Kafka broker did not start: {exc}\n{tail}") from exc
        return self

    def stop(self) -> None:
        """Stop the broker and remove its storage."""
        if self._proc is not None:
            self._proc.stop(timeout=20)
            self._proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def create_topic(
    bootstrap_servers: str,
    partitions: int = 1,
    name: str | None = None,
    config: Mapping[str, str] | None = None,
) -> str:
    """Create a topic (uuid-named unless ``name`` is given) and wait until it exists."""
    topic = name or f"t-{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    futures = admin.create_topics(
        [
            NewTopic(
                topic, num_partitions=partitions, replication_factor=1, config=dict(config or {})
            )
        ]
    )
    futures[topic].result(30)
    return topic


Record = tuple[bytes | None, bytes | None]


def produce(
    bootstrap_servers: str,
    topic: str,
    records: Iterable[Record],
    partition: int | None = None,
    settings: Mapping[str, Any] | None = None,
) -> list[tuple[int, int]]:
    """Produce ``(key, value)`` records in order, idempotently; (partition, offset) of each.

    ``settings`` adds producer properties (``message.max.bytes`` for big records, say).
    """
    producer = Producer(
        {
            "bootstrap.servers": bootstrap_servers,
            "enable.idempotence": True,
            "linger.ms": 5,
            "compression.type": "lz4",
            **(settings or {}),
        }
    )
    positions: list[tuple[int, int] | None] = []
    errors: list[str] = []

    def delivered(index: int, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            positions[index] = (msg.partition() or 0, msg.offset() or 0)

    for i, (key, value) in enumerate(records):
        positions.append(None)
        while True:
            try:
                producer.produce(
                    topic,
                    value=value,
                    key=key,
                    partition=-1 if partition is None else partition,
                    on_delivery=functools.partial(delivered, i),
                )
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    remaining = producer.flush(60)
    if errors or remaining:
        raise RuntimeError(f"produce to {topic} failed: {errors[:3]} ({remaining} undelivered)")
    return [p for p in positions if p is not None]
