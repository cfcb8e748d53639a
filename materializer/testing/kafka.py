"""Apache Kafka in KRaft mode run from the resolved jars: a single broker or a small cluster.

Every node is both broker and controller, its storage formatted in a temp dir,
listening on free loopback ports. Topics get uuid names so tests never share one.
"""

from __future__ import annotations

import base64
import json
import shutil
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from materializer.errors import SetupError
from materializer.jvm import jars
from materializer.testing.ports import free_port, port_open
from materializer.testing.process import ManagedProcess
from materializer.testing.waiting import wait_until

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

MIN_IN_SYNC = 2
"""Replicas an ``acks=all`` write needs in a cluster: one node of three may be down."""


def _java(heap: str, main: str, *args: str, log: Path) -> list[str]:
    java = shutil.which("java")
    if java is None:
        raise SetupError("java not found: Java 17 or newer is needed to run the Kafka broker")
    classpath = ":".join(str(p) for p in jars("kafka"))
    return [
        java,
        f"-Xmx{heap}",
        "-XX:+UseG1GC",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log}",
        "-cp",
        classpath,
        main,
        *args,
    ]


@dataclass(frozen=True)
class SecureListeners:
    """Two listeners a broker serves beside PLAINTEXT, as a secured production cluster
    would: SASL_SSL (PLAIN and SCRAM users) and SSL requiring a client certificate."""

    keystore: Path
    """PEM: the broker's PKCS#8 private key and its certificate chain."""
    ca: Path
    """PEM: the authority client certificates must chain to."""
    plain_users: Mapping[str, str] = field(default_factory=dict)
    """PLAIN users and their passwords (SCRAM users are added through the admin API)."""
    sasl_port: int = field(default_factory=free_port)
    mtls_port: int = field(default_factory=free_port)

    def properties(self) -> list[str]:
        """The broker settings of both listeners (``listeners`` itself is the node's)."""
        plain = " ".join(f'user_{u}="{p}"' for u, p in self.plain_users.items())
        scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        return [
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={self.keystore}",
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={self.ca}",
            "listener.name.ssl.ssl.client.auth=required",
            "sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
            "listener.name.sasl_ssl.plain.sasl.jaas.config="
            f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain};",
            f"listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config={scram}",
            f"listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config={scram}",
        ]


class KafkaNode:
    """One combined broker and controller of a cluster: its ports, storage and process."""

    def __init__(self, node_id: int, heap: str, secure: SecureListeners | None = None) -> None:
        self.node_id = node_id
        self.port = free_port()
        self.controller_port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.secure = secure
        self.voter = f"{node_id}@127.0.0.1:{self.controller_port}"
        self._heap = heap
        self.workdir: Path | None = None
        self.proc: ManagedProcess | None = None

    def properties(self, data_dir: Path, voters: str, replicas: int) -> str:
        """The node's ``server.properties``; topics get ``replicas`` replicas by default."""
        min_isr = min(MIN_IN_SYNC, replicas)
        served = [f"PLAINTEXT://{self.address}"]
        protocols = "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
        if self.secure is not None:
            served += [
                f"SASL_SSL://127.0.0.1:{self.secure.sasl_port}",
                f"SSL://127.0.0.1:{self.secure.mtls_port}",
            ]
            protocols += ",SASL_SSL:SASL_SSL,SSL:SSL"
        return "\n".join(
            [
                "process.roles=broker,controller",
                f"node.id={self.node_id}",
                f"controller.quorum.voters={voters}",
                f"listeners={','.join(served)},CONTROLLER://127.0.0.1:{self.controller_port}",
                f"advertised.listeners={','.join(served)}",
                "controller.listener.names=CONTROLLER",
                "inter.broker.listener.name=PLAINTEXT",
                f"listener.security.protocol.map={protocols}",
                *(self.secure.properties() if self.secure is not None else []),
                f"log.dirs={data_dir}",
                "num.partitions=1",
                f"default.replication.factor={replicas}",
                f"min.insync.replicas={min_isr}",
                f"offsets.topic.replication.factor={replicas}",
                "offsets.topic.num.partitions=4",
                f"transaction.state.log.replication.factor={replicas}",
                f"transaction.state.log.min.isr={min_isr}",
                "transaction.state.log.num.partitions=4",
                f"share.coordinator.state.topic.replication.factor={replicas}",
                f"share.coordinator.state.topic.min.isr={min_isr}",
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

    def launch(self, workdir: Path, cluster_id: str, voters: str, replicas: int) -> None:
        """Format the node's storage into ``workdir`` for ``cluster_id``, then start it."""
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        props = workdir / "server.properties"
        props.write_text(self.properties(workdir / "data", voters, replicas))
        log4j = workdir / "log4j2.properties"
        log4j.write_text(_LOG4J2.format(log=workdir / "broker.log"))
        # Twice at most: a child forked from a test process whose gRPC threads are busy has
        # once exited before running java. A second format of a formatted node is a no-op.
        for attempt in (1, 2):
            fmt = ManagedProcess(
                _java(
                    self._heap,
                    "kafka.tools.StorageTool",
                    "format",
                    "--ignore-formatted",
                    f"--cluster-id={cluster_id}",
                    "-c",
                    str(props),
                    log=log4j,
                ),
                workdir / "format.log",
            )
            code = fmt.proc.wait(120)
            fmt.stop()
            if code == 0:
                break
            if attempt == 2:
                raise SetupError(f"formatting Kafka storage failed (exit {code}):\n{fmt.tail()}")
        self.proc = ManagedProcess(
            _java(self._heap, "kafka.Kafka", str(props), log=log4j), workdir / "stdout.log"
        )

    def alive(self) -> bool:
        """Whether the node's process runs."""
        return self.proc is not None and self.proc.alive()

    def quorum_leader(self) -> tuple[int, int] | None:
        """(epoch, node id) of the active controller as this node last recorded it, if any.

        Brokers answer clients' metadata requests with a random broker as the
        "controller" under KRaft, so the quorum's own state file is where the
        active controller is known.
        """
        if self.workdir is None:
            return None
        path = self.workdir / "data" / "__cluster_metadata-0" / "quorum-state"
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        leader = int(state.get("leaderId", -1))
        return None if leader < 0 else (int(state.get("leaderEpoch", -1)), leader)

    def kill(self) -> None:
        """SIGKILL the node: a crash, no controlled shutdown."""
        if self.proc is not None:
            self.proc.kill()

    def pause(self) -> None:
        """SIGSTOP the node: its connections stay open but it answers nothing until
        ``resume``, as a broker in a long GC pause or on a frozen machine."""
        if self.proc is not None:
            self.proc.pause()

    def resume(self) -> None:
        """SIGCONT the node after ``pause``: it answers what it was sent meanwhile."""
        if self.proc is not None:
            self.proc.resume()

    def restart(self) -> None:
        """Stop the node and start it again on the same ports and storage."""
        if self.workdir is None:
            raise SetupError("the node was never launched")
        self.stop()
        log4j = self.workdir / "log4j2.properties"
        props = self.workdir / "server.properties"
        self.proc = ManagedProcess(
            _java(self._heap, "kafka.Kafka", str(props), log=log4j), self.workdir / "stdout.log"
        )

    def stop(self) -> None:
        """Stop the node's process (its storage is its cluster's to remove)."""
        if self.proc is not None:
            self.proc.stop(timeout=20)
            self.proc = None

    def tail(self) -> str:
        """The end of the node's log, for error messages."""
        return "" if self.proc is None else f"node {self.node_id}:\n{self.proc.tail()}"


class KafkaCluster:
    """``with KafkaCluster(size=3) as c: c.bootstrap_servers; c.kill(node_id)``.

    Every node is a voter of the controller quorum and a broker. Topics (the
    internal ones too) get a replica on every node, and an ``acks=all`` write
    needs two in sync, so three nodes keep serving reads and writes with any
    one of them gone.
    """

    def __init__(
        self,
        size: int = 3,
        workdir: Path | None = None,
        heap: str = "384m",
        secure: SecureListeners | None = None,
    ) -> None:
        if secure is not None and size != 1:
            raise SetupError("secure listeners are for a single broker")
        self.nodes = {i: KafkaNode(i, heap, secure) for i in range(1, size + 1)}
        self.bootstrap_servers = ",".join(n.address for n in self.nodes.values())
        self._workdir = workdir
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    def start(self, timeout: float = 90.0) -> Self:
        """Format every node's storage, start them all, wait until every broker is registered."""
        if self._workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="materializer-kafka-")
            self._workdir = Path(self._tmp.name)
        work = self._workdir
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        voters = ",".join(n.voter for n in self.nodes.values())
        try:
            for node in self.nodes.values():
                node.launch(self._node_dir(work, node), cluster_id, voters, len(self.nodes))
            self._wait_ready(timeout)
        except Exception as exc:
            tails = "\n".join(n.tail() for n in self.nodes.values())
            self.stop()
            if isinstance(exc, SetupError):
                raise
            raise SetupError(f"Kafka did not start: {exc}\n{tails}") from exc
        return self

    def _node_dir(self, work: Path, node: KafkaNode) -> Path:
        """A lone node keeps its files at the top of the workdir; a cluster's, one folder each."""
        return work if len(self.nodes) == 1 else work / f"node-{node.node_id}"

    def _wait_ready(self, timeout: float) -> None:
        def alive() -> bool:
            return all(n.alive() for n in self.nodes.values())

        # A client made before the ports open logs every refused connection: wait for them first.
        wait_until(
            "kafka broker port",
            lambda: all(port_open(n.port) for n in self.nodes.values()),
            timeout,
            alive,
            retry_errors=True,
        )
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        wait_until(
            "kafka broker",
            lambda: len(admin.list_topics(timeout=2).brokers) == len(self.nodes),
            timeout,
            alive,
            retry_errors=True,
        )

    def kill(self, node_id: int) -> None:
        """SIGKILL one node, as a crash of its machine would stop it."""
        self.nodes[node_id].kill()

    def alive_bootstrap_servers(self) -> str:
        """The addresses of the nodes still running."""
        return ",".join(n.address for n in self.nodes.values() if n.alive())

    def active_controller(self) -> int:
        """The node id of the quorum's leader, as the running nodes last recorded it."""
        known = [s for n in self.nodes.values() if n.alive() and (s := n.quorum_leader())]
        if not known:
            raise RuntimeError("no running node knows the active controller")
        return max(known)[1]

    def stop(self) -> None:
        """Stop every node and remove their storage.

        Nodes of a cluster are killed: a controlled shutdown would wait on
        peers already gone, for storage about to be removed.
        """
        for node in self.nodes.values():
            if len(self.nodes) > 1:
                node.kill()
            node.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class KafkaBroker(KafkaCluster):
    """``with KafkaBroker() as k: k.bootstrap_servers``: a cluster of one node."""

    def __init__(
        self, workdir: Path | None = None, heap: str = "512m", secure: SecureListeners | None = None
    ) -> None:
        super().__init__(1, workdir, heap, secure)
        self._node = self.nodes[1]
        self.port = self._node.port
        self.controller_port = self._node.controller_port

    @property
    def _proc(self) -> ManagedProcess | None:
        return self._node.proc

    def restart(self, timeout: float = 90.0) -> None:
        """Stop the broker and start it again on the same port and data, then wait for it."""
        self._node.restart()
        self._wait_ready(timeout)

    def pause(self) -> None:
        """Freeze the broker (SIGSTOP) until ``resume``: clients see no refusal, only silence."""
        self._node.pause()

    def resume(self) -> None:
        """Let the paused broker run again."""
        self._node.resume()


def create_topic(
    bootstrap_servers: str,
    partitions: int = 1,
    name: str | None = None,
    config: Mapping[str, str] | None = None,
    replication_factor: int = 1,
) -> str:
    """Create a topic (uuid-named unless ``name`` is given) and wait until it exists.

    ``replication_factor`` is how many brokers hold each partition (-1: the broker's default).
    """
    topic = name or f"t-{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    futures = admin.create_topics(
        [
            NewTopic(
                topic,
                num_partitions=partitions,
                replication_factor=replication_factor,
                config=dict(config or {}),
            )
        ]
    )
    futures[topic].result(30)
    # The controller has made the topic; every broker learns it a little later.
    wait_until(
        "topic " + topic,
        lambda: _led(admin, topic, partitions),
        30,
        retry_errors=True,
    )
    return topic


def _led(admin: AdminClient, topic: str, partitions: int) -> bool:
    """Whether the metadata shows every partition of ``topic`` with a leader."""
    found = admin.list_topics(topic, timeout=5).topics.get(topic)
    return (
        found is not None
        and found.error is None
        and len(found.partitions) == partitions
        and all(p.leader >= 0 for p in found.partitions.values())
    )
