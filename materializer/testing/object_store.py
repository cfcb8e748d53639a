"""An S3 API server for tests: S3Proxy over a temp folder, run from its resolved jar.

``with S3Server(buckets=["lake"]) as s3: s3.endpoint`` serves the S3 API with
signature checks on a free loopback port; each bucket is a folder of its
filesystem backend. ``s3.config()`` is the ``object_store`` block that reaches it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Self

from materializer.jvm import jars
from materializer.testing.java_server import JavaServer
from materializer.testing.ports import free_port, port_open
from materializer.testing.waiting import wait_until

ACCESS_KEY_ID = "materializer-test"
SECRET_ACCESS_KEY = "materializer-test-secret"


class S3Server(JavaServer):
    """One S3Proxy process and the folder behind it."""

    name = "S3 server"

    def __init__(self, buckets: list[str], heap: str = "256m") -> None:
        super().__init__(heap)
        self.buckets = buckets
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"

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
        return self.workdir / "data"

    def start(self, timeout: float = 60.0) -> Self:
        """Start the server and wait for its port."""
        (jar,) = jars("s3proxy")
        for bucket in self.buckets:
            (self.root / bucket).mkdir(parents=True)
        properties = self.workdir / "s3proxy.conf"
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
        proc = self._launch("-jar", str(jar), "--properties", str(properties))
        wait_until(
            "S3 server", lambda: port_open(self.port), timeout, proc.alive, retry_errors=True
        )
        return self
