"""An S3 API server for tests: S3Proxy over a temp folder, run from its resolved jar.

``with S3Server(buckets=["lake"]) as s3: s3.endpoint`` serves the S3 API with
signature checks on a free loopback port; each bucket is a folder of its
filesystem backend. ``s3.config()`` is the ``object_store`` block that reaches it.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from materializer.errors import SetupError
from materializer.jvm import jars
from materializer.testing.ports import free_port, port_open, wait_until
from materializer.testing.process import ManagedProcess

ACCESS_KEY_ID = "materializer-test"
SECRET_ACCESS_KEY = "materializer-test-secret"


class S3Server:
    """One S3Proxy process and the folder behind it."""

    def __init__(self, buckets: list[str], heap: str = "256m") -> None:
        self.buckets = buckets
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._heap = heap
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._proc: ManagedProcess | None = None

    def config(self) -> dict[str, Any]:
        """The ``object_store`` block of a config that reaches this server."""
        return {
            "endpoint": self.endpoint,
            "path_style": True,
            "access_key_id": {"value": ACCESS_KEY_ID},
            "secret_access_key": {"value": SECRET_ACCESS_KEY},
        }

    @property
    def root(self) -> Path:
        """The folder holding the buckets (what the server stores, for tests to look at)."""
        if self._tmp is None:
            raise SetupError("the S3 server is not running")
        return Path(self._tmp.name) / "data"

    def start(self, timeout: float = 60.0) -> Self:
        """Start the server and wait for its port."""
        java = shutil.which("java")
        if java is None:
            raise SetupError("java not found: Java 17 or newer runs the S3 server")
        (jar,) = jars("s3proxy")
        self._tmp = tempfile.TemporaryDirectory(prefix="materializer-s3-")
        for bucket in self.buckets:
            (self.root / bucket).mkdir(parents=True)
        properties = Path(self._tmp.name) / "s3proxy.conf"
        properties.write_text(
            "\n".join(
                [
                    f"s3proxy.endpoint={self.endpoint}",
                    "s3proxy.authorization=aws-v2-or-v4",
                    f"s3proxy.identity={ACCESS_KEY_ID}",
                    f"s3proxy.credential={SECRET_ACCESS_KEY}",
                    "jclouds.provider=filesystem",
                    f"jclouds.filesystem.basedir={self.root}",
                    "",
                ]
            )
        )
        args = [java, f"-Xmx{self._heap}", "-jar", str(jar), "--properties", str(properties)]
        self._proc = ManagedProcess(args, Path(self._tmp.name) / "s3proxy.log")
        wait_until("S3 server", lambda: port_open(self.port), timeout, self._proc.alive)
        return self

    def stop(self) -> None:
        """Stop the server and remove its folder."""
        if self._proc is not None:
            self._proc.stop(timeout=20)
            self._proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> Self:
        try:
            return self.start()
        except Exception:
            tail = self._proc.tail() if self._proc is not None else ""
            self.stop()
            raise SetupError(f"the S3 server did not start:\n{tail}") from None

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
