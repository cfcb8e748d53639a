"""A throwaway ``redis-server`` on a free loopback port."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from types import TracebackType

import redis

from materializer.errors import SetupError
from materializer.testing.ports import free_port, wait_until
from materializer.testing.process import ManagedProcess


class RedisServer:
    """``with RedisServer() as r: r.url`` — no persistence, data in memory only."""

    def __init__(self, workdir: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._workdir = workdir
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._proc: ManagedProcess | None = None

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
        args = [
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
        ]
        self._proc = ManagedProcess(args, self._workdir / "redis.log")
        client = redis.Redis.from_url(self.url, socket_timeout=1)
        try:
            wait_until("redis-server", lambda: bool(client.ping()), 20, self._proc.alive)
        except Exception:
            self.stop()
            raise
        finally:
            client.close()
        return self

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
