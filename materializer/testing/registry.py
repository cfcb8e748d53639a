"""Apicurio Registry, a real schema registry, run from its resolved jar (``make jars``),
and the wire format's framing for records no serializer would write.

``with ApicurioRegistry() as registry: registry.url`` starts it on a free loopback
port with in-memory storage and gives the base URL of its Confluent-compatible API,
which is what Materializer's ``schema_registry_url`` and Confluent's own
serializers talk to. Well-formed records come from Confluent's serializers;
``wire_value`` frames the ones a test needs to be wrong (an unknown id, another
message's indexes) and ``register`` registers what a serializer would not
(protobuf as ``.proto`` source).
"""

from __future__ import annotations

import base64
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Self

import orjson

from materializer.jvm import jars
from materializer.testing.java_server import JavaServer
from materializer.testing.ports import free_port
from materializer.testing.waiting import wait_until

CONFLUENT_API = "/apis/ccompat/v7"
JSON = "application/vnd.schemaregistry.v1+json"


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
        wait_until("schema registry", self._answers, timeout, proc.alive, retry_errors=True)
        return self

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/subjects", timeout=2) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, OSError):
            return False


def register(
    url: str,
    subject: str,
    schema: str,
    schema_type: str = "AVRO",
    references: list[dict[str, Any]] | None = None,
) -> int:
    """Register a schema with any Confluent-compatible registry over HTTP; its id."""
    doc: dict[str, Any] = {"schema": schema}
    if schema_type != "AVRO":
        doc["schemaType"] = schema_type
    if references:
        doc["references"] = references
    request = urllib.request.Request(
        f"{url.rstrip('/')}/subjects/{urllib.parse.quote(subject, safe='')}/versions",
        data=orjson.dumps(doc),
        headers={"Content-Type": JSON, "Accept": JSON},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(orjson.loads(response.read())["id"])


def _zigzag_varint(value: int) -> bytes:
    raw = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        byte = raw & 0x7F
        raw >>= 7
        if raw:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def wire_value(schema_id: int, payload: bytes, message_indexes: list[int] | None = None) -> bytes:
    """A value in Confluent's wire format: magic byte, schema id, (protobuf) indexes, payload.

    ``message_indexes`` is for protobuf only: ``[0]`` (the first message) is
    written as the single byte 0, as Confluent's serializers do.
    """
    header = b"\x00" + schema_id.to_bytes(4, "big")
    if message_indexes is None:
        return header + payload
    if message_indexes == [0]:
        return header + b"\x00" + payload
    indexes = _zigzag_varint(len(message_indexes)) + b"".join(
        _zigzag_varint(i) for i in message_indexes
    )
    return header + indexes + payload


def serialized_descriptor(file_descriptor_proto: bytes) -> str:
    """A protobuf schema as confluent-kafka's serializer registers it: base64 descriptor bytes."""
    return base64.b64encode(file_descriptor_proto).decode("ascii")
