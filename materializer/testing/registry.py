"""Apicurio Registry, a real schema registry, run from its resolved jar (``make jars``).

``with ApicurioRegistry() as registry: registry.url`` starts it on a free loopback
port with in-memory storage and gives the base URL of its Confluent-compatible API,
which is what Materializer's ``schema_registry_url`` and Confluent's own
serializers talk to.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Self

from materializer.jvm import jars
from materializer.testing.java_server import JavaServer
from materializer.testing.ports import free_port, wait_until

CONFLUENT_API = "/apis/ccompat/v7"


class ApicurioRegistry(JavaServer):
    """One registry process; its schemas live as long as it does."""

    name = "schema registry"

    def __init__(self, heap: str = "256m") -> None:
        super().__init__(heap)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}{CONFLUENT_API}"

    def start(self, timeout: float = 120.0) -> Self:
        """Start the registry and wait until its Confluent API answers."""
        (jar,) = jars("registry")
        proc = self._launch(
            f"-Dquarkus.http.port={self.port}",
            "-Dquarkus.http.host=127.0.0.1",
            # Temp files (uploads, H2) in the server's folder, removed with it.
            f"-Djava.io.tmpdir={self.workdir}",
            "-jar",
            str(jar),
        )
        wait_until("schema registry", self._answers, timeout, proc.alive)
        return self

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/subjects", timeout=2) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, OSError):
            return False
