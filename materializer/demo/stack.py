"""The services of one demo run, started in order and stopped in reverse, whatever happens.

Each start registers its stop before it begins, on one ``ExitStack``, so a
failure or a Ctrl-C half way through startup stops exactly what was started.
The children run in sessions of their own (``ManagedProcess``): a Ctrl-C in
the terminal reaches the demo alone, which then stops them in order — the
producer flushes, the query service drains, the pipeline finishes its batch
while Kafka and Redis are still up, and only then do the broker and Redis go.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType

import grpc
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from materializer.config import ENV_OVERRIDES
from materializer.demo.avro import AvroValues
from materializer.demo.domain import ORDERS, PARTITIONS, USER_EVENTS, USER_ORDERS, USERS
from materializer.demo.producer import EventProducer
from materializer.demo.steps import Steps
from materializer.demo.workdir import PIPELINE_LOG, QUERY_LOG, WorkDir
from materializer.errors import MaterializerError, SetupError
from materializer.testing import KafkaBroker, RedisServer, create_topic, free_port
from materializer.testing.process import ManagedProcess
from materializer.testing.registry import ApicurioRegistry

HOST = "127.0.0.1"
QUERY_READY_TIMEOUT = 120.0
PIPELINE_STOP_TIMEOUT = 90.0
"""The run finishes its batch in flight and stops Spark; a cold JVM on two cores is slow."""


class ChildExited(MaterializerError):
    """A child process ended while the demo still needed it."""

    def __init__(self, what: str, proc: ManagedProcess) -> None:
        self.what = what
        super().__init__(
            f"{what} exited with code {proc.proc.returncode}; the end of {proc.log_path.name}:\n"
            f"{proc.tail()}"
        )


def child_env() -> dict[str, str]:
    """The demo's environment without the config overrides, which would point its children
    at other services than the ones the demo started."""
    return {k: v for k, v in os.environ.items() if k not in ENV_OVERRIDES}


def port_is_free(port: int) -> bool:
    """Whether a server could listen on ``port`` of the loopback interface now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
        return True


def query_serving(address: str) -> bool:
    """One health check: SERVING once the service listens and reaches Redis."""
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=1.0
        )
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def clear_maps(url: str, names: list[str]) -> int:
    """Delete every key of the named maps (entities, watermark, status, control); how many.

    A map left by an earlier demo would show another broker's offsets, or
    stay paused, in a run whose topics start from offset 0 again.
    """
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        client.ping()
        deleted = 0
        for name in names:
            batch: list[bytes] = []
            for key in client.scan_iter(match=f"{name}:*", count=1000):
                batch.append(key)
                if len(batch) == 1000:
                    deleted += int(client.unlink(*batch))
                    batch.clear()
            if batch:
                deleted += int(client.unlink(*batch))
        return deleted
    except redis.RedisError as exc:
        raise SetupError(f"Redis at {url}: {exc}") from None
    finally:
        client.close()


class DemoStack:
    """Starts the demo's services one by one; closing it stops them in reverse order."""

    def __init__(self, workdir: WorkDir, steps: Steps) -> None:
        self._workdir = workdir
        self._steps = steps
        self._exit = ExitStack()

    def __enter__(self) -> DemoStack:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._exit.close()

    def _on_close(self, what: str, stop: Callable[[], None]) -> None:
        def stopping() -> None:
            with self._steps.step(f"stopping {what}", interruptible=False):
                stop()

        self._exit.callback(stopping)

    def kafka(self) -> str:
        """A single-node KRaft broker; its bootstrap servers."""
        broker = KafkaBroker(workdir=self._workdir.folder("kafka"))
        with self._steps.step("starting Kafka broker"):
            self._on_close("Kafka broker", broker.stop)
            broker.start()
        return broker.bootstrap_servers

    def redis(self, url: str | None) -> str:
        """``url``'s Redis with the demo's maps cleared, or a redis-server of our own; its URL."""
        if url is not None:
            with self._steps.step(f"using Redis at {url}") as notes:
                cleared = clear_maps(url, [USERS, USER_ORDERS])
                notes.append(f"cleared {cleared:,} keys of maps {USERS}, {USER_ORDERS}")
            return url
        server = RedisServer(workdir=self._workdir.folder("redis"))
        with self._steps.step("starting redis-server"):
            self._on_close("redis-server", server.stop)
            server.start()
        return server.url

    def registry(self) -> AvroValues:
        """A schema registry (Apicurio) with the topics' Avro schemas registered; the encoder
        that writes through it."""
        registry = ApicurioRegistry()
        with self._steps.step("starting the schema registry (Apicurio)"):
            self._on_close("the schema registry", registry.stop)
            registry.started()
        with self._steps.step(f"registering the Avro schemas of {USER_EVENTS}, {ORDERS}") as notes:
            values = AvroValues(registry.url)
            try:
                ids = values.register()
            except Exception as exc:  # the registry client raises its own and httpx's errors
                raise SetupError(
                    f"the schema registry at {registry.url} did not take the demo's schemas: {exc}"
                ) from None
            notes.append(", ".join(f"{topic}-value id {i}" for topic, i in ids.items()))
        return values

    def topics(self, bootstrap_servers: str) -> None:
        """The two source topics, with the demo's partitions."""
        with self._steps.step(f"creating topics {USER_EVENTS}, {ORDERS}"):
            for topic in (USER_EVENTS, ORDERS):
                create_topic(bootstrap_servers, PARTITIONS, name=topic)

    def pipeline(self, config: Path) -> ManagedProcess:
        """``materializer run``, not waited for: Spark takes a while, and the view shows it."""
        log = self._workdir.path / PIPELINE_LOG
        with self._steps.step(f"starting the pipeline (materializer run, log {log.name})"):
            proc = ManagedProcess(
                [sys.executable, "-m", "materializer", "run", "-c", str(config)],
                log,
                env=child_env(),
            )
            self._on_close("the pipeline", lambda: proc.stop(timeout=PIPELINE_STOP_TIMEOUT))
        return proc

    def query_service(self, config: Path, port: int) -> ManagedProcess:
        """``query-service serve`` on the loopback interface, once its health says SERVING."""
        log = self._workdir.path / QUERY_LOG
        address = f"{HOST}:{port}"
        with self._steps.step(f"starting the query service (log {log.name})"):
            proc = ManagedProcess(
                [
                    sys.executable,
                    "-c",
                    "from query_service.cli import app; app(prog_name='query-service')",
                    "serve",
                    "-c",
                    str(config),
                    "--host",
                    HOST,
                    "--port",
                    str(port),
                    # The HTTP/JSON front on 8080 when it is free, as a user would find it.
                    "--http-port",
                    str(choose_port(8080)),
                    "--log-format",
                    "text",
                ],
                log,
                env=child_env(),
            )
            self._on_close("the query service", proc.stop)
            deadline = time.monotonic() + QUERY_READY_TIMEOUT
            while True:
                self._steps.check()
                if not proc.alive():
                    raise ChildExited("the query service", proc)
                try:
                    if query_serving(address):
                        break
                except grpc.RpcError:
                    pass  # not listening yet
                if time.monotonic() > deadline:
                    raise SetupError(
                        f"the query service did not serve within {QUERY_READY_TIMEOUT:.0f} s:\n"
                        f"{proc.tail()}"
                    )
                self._steps.stop.wait(0.25)
        return proc

    def producer(self, producer: EventProducer) -> EventProducer:
        """Start the producer; it flushes before anything else stops."""
        self._on_close("the producer", producer.stop)
        producer.start()
        return producer


def choose_port(wanted: int) -> int:
    """``wanted`` if it is free, else any free port."""
    return wanted if port_is_free(wanted) else free_port()
