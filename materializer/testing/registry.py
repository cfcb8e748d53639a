"""Apicurio Registry, a real schema registry, run from its resolved jar (``make jars``).

``with ApicurioRegistry() as registry: registry.url`` starts it on a free loopback
port with in-memory storage and gives the base URL of its Confluent-compatible API,
which is what Materializer's ``schema_registry_url`` and Confluent's own
serializers talk to.
"""

from __future__ import annotations

import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Self

from materializer.errors import SetupError
from materializer.jvm import jars
from materializer.testing.ports import free_port, wait_until
from materializer.testing.process import ManagedProcess

CONFLUENT_API = "/apis/ccompat/v7"


class ApicurioRegistry:
    """One registry process; its schemas live as long as it does."""

    def __init__(self, heap: str = "256m") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}{CONFLUENT_API}"
        self._heap = heap
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._proc: ManagedProcess | None = None

    def start(self, timeout: float = 120.0) -> Self:
        """Start the registry and wait until its Confluent API answers."""
        java = shutil.which("java")
        if java is None:
            raise SetupError("java not found: Java 17 or newer runs the schema registry")
        (jar,) = jars("registry")
        self._tmp = tempfile.TemporaryDirectory(prefix="materializer-registry-")
        args = [
            java,
            f"-Xmx{self._heap}",
            f"-Dquarkus.http.port={self.port}",
            "-Dquarkus.http.host=127.0.0.1",
            # Temp files (uploads, H2) in a folder of its own, removed with it.
            f"-Djava.io.tmpdir={self._tmp.name}",
            "-jar",
            str(jar),
        ]
        self._proc = ManagedProcess(args, Path(self._tmp.name) / "registry.log")
        proc = self._proc
        wait_until("schema registry", self._answers, timeout, proc.alive)
        return self

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/subjects", timeout=2) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        """Stop the process and remove its files."""
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
            raise SetupError(f"the schema registry did not start:\n{tail}") from None

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
