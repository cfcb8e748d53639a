"""Throwaway ``redis-server`` processes on free loopback ports: one, or a Redis Cluster."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import redis

from materializer.errors import SetupError
from materializer.testing.ports import free_port
from materializer.testing.process import ManagedProcess
from materializer.testing.waiting import wait_until


class RedisServer:
    """``with RedisServer() as r: r.url`` — no persistence, data in memory only."""

    def __init__(self, workdir: Path | None = None, options: Sequence[str] = ()) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._workdir = workdir
        self._options = list(options)
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._proc: ManagedProcess | None = None
        self._args: list[str] = []

    def start(self) -> RedisServer:
        """Start the server and wait until it answers PING."""
        exe = shutil.which("redis-server")
        if exe is None:
            raise SetupError(
                "redis-server not found: `apt-get install redis-server` or set REDIS_URL"
            )
        if self._workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="materializer-redis-")
            self._workdir = Path(self._tmp.name)
        args = self._args = [
            exe,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self._workdir),
            *self._options,
        ]
        try:
            self._launch(args)
        except Exception:
            self.stop()
            raise
        return self

    def _launch(self, args: list[str]) -> None:
        """Start the process and wait until it answers PING (a failed one is left stopped)."""
        assert self._workdir is not None
        self._proc = ManagedProcess(args, self._workdir / "redis.log")
        client = redis.Redis.from_url(self.url, socket_timeout=1)
        try:
            wait_until(
                "redis-server", lambda: bool(client.ping()), 20, self._proc.alive, retry_errors=True
            )
        except Exception:
            self._proc.stop()
            self._proc = None
            raise
        finally:
            client.close()

    def restart_empty(self, attempts: int = 20) -> None:
        """Stop the server and start an empty one on the same port, as a restart without
        persistence does.

        While the port is closed, a client reconnecting to it may be given that
        very port as its own and connect to itself (a TCP self-connect), which
        holds the port for a moment: the start is tried again.
        """
        if self._proc is not None:
            self._proc.stop()
            self._proc = None
        args = self._args
        for attempt in range(attempts):
            try:
                self._launch(args)
                return
            except RuntimeError:
                if attempt == attempts - 1:
                    raise
                time.sleep(0.5)

    def alive(self) -> bool:
        """Whether the server process is running."""
        return self._proc is not None and self._proc.alive()

    def stop(self) -> None:
        """Stop the server and remove its folder."""
        if self._proc is not None:
            self._proc.stop()
            self._proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


CLUSTER_OPTIONS = (
    "--cluster-enabled",
    "yes",
    "--cluster-config-file",
    "nodes.conf",
    "--cluster-node-timeout",
    "5000",
)


class RedisCluster:
    """``with RedisCluster(3) as c: c.url`` — masters only, the 16384 slots split evenly.

    ``url`` names the first node; a cluster client finds the others from it.
    """

    def __init__(self, masters: int = 3) -> None:
        if masters < 3:
            raise ValueError("a Redis Cluster needs at least 3 masters")
        # The bus port is chosen too: by default it is the port plus 10000, which may be
        # taken, or past 65535.
        self.nodes = [
            RedisServer(options=[*CLUSTER_OPTIONS, "--cluster-port", str(free_port())])
            for _ in range(masters)
        ]
        self.url = f"redis://127.0.0.1:{self.nodes[0].port}"

    def start(self) -> RedisCluster:
        """Start the nodes, join them with ``redis-cli --cluster create``, wait for ``ok``."""
        cli = shutil.which("redis-cli")
        if cli is None:
            raise SetupError("redis-cli not found: `apt-get install redis-server` (it ships both)")
        try:
            for node in self.nodes:
                node.start()
            addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
            created = subprocess.run(
                [cli, "--cluster", "create", *addresses, "--cluster-replicas", "0"],
                input="yes\n",
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            if created.returncode != 0:
                raise SetupError(f"redis-cli --cluster create failed: {created.stdout[-2000:]}")
            clients = [redis.Redis.from_url(node.url, socket_timeout=1) for node in self.nodes]
            try:
                wait_until(
                    "the Redis Cluster",
                    lambda: all(c.cluster("INFO")["cluster_state"] == "ok" for c in clients),
                    30,
                    lambda: all(node.alive() for node in self.nodes),
                    retry_errors=True,
                )
            finally:
                for client in clients:
                    client.close()
        except Exception:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every node."""
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> RedisCluster:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
