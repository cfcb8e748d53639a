"""A small Confluent Schema Registry for tests: the REST subset Materializer uses, over real HTTP.

Routes (JSON bodies, as Confluent's registry answers them):

- ``POST /subjects/{subject}/versions`` ``{"schema", "schemaType"?, "references"?}``
  → ``{"id": n}``; a schema already registered keeps its id (ids are global,
  one per distinct schema), and is a new version only of a subject lacking it;
- ``GET /schemas/ids/{id}`` → ``{"schema", "schemaType"?, "references"?}``
  (``schemaType`` is left out for Avro, as Confluent does);
- ``GET /subjects/{subject}/versions/{n|latest}`` → ``{"subject", "version",
  "id", "schema", "schemaType"?, "references"?}``;
- ``GET /subjects`` → the subject names.

Errors are ``{"error_code", "message"}`` with Confluent's codes (40401 subject
not found, 40402 version not found, 40403 schema not found, 42201 invalid
schema). ``?format=`` is accepted and ignored: a schema comes back as it was
registered (a real registry turns protobuf source into a serialized
descriptor when asked), which lets tests reach both kinds of answer.

It runs in a thread of the test process on a free loopback port:
``with SchemaRegistry() as registry: registry.url``.
"""

from __future__ import annotations

import base64
import threading
import urllib.parse
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

import orjson

from materializer.testing.ports import free_port

JSON = "application/vnd.schemaregistry.v1+json"


@dataclass(frozen=True)
class _Stored:
    schema_type: str
    text: str
    references: tuple[tuple[str, str, int], ...]

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema": self.text}
        if self.schema_type != "AVRO":
            out["schemaType"] = self.schema_type
        if self.references:
            out["references"] = [
                {"name": n, "subject": s, "version": v} for n, s, v in self.references
            ]
        return out


class _Store:
    """Schemas by id and subjects' versions, behind one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.schemas: list[_Stored] = []
        self.subjects: dict[str, list[int]] = {}

    def register(self, subject: str, stored: _Stored) -> int:
        with self.lock:
            if stored in self.schemas:
                schema_id = self.schemas.index(stored) + 1
            else:
                self.schemas.append(stored)
                schema_id = len(self.schemas)
            versions = self.subjects.setdefault(subject, [])
            if schema_id not in versions:
                versions.append(schema_id)
            return schema_id


class _Error(Exception):
    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read failures from responses, not from stderr."""

    def _send(self, status: int, doc: Any) -> None:
        body = orjson.dumps(doc)
        self.send_response(status)
        self.send_header("Content-Type", JSON)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _parts(self) -> list[str]:
        path = urllib.parse.urlsplit(self.path).path
        return [urllib.parse.unquote(p) for p in path.strip("/").split("/")]

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        """Answer a read."""
        try:
            self._send(200, self._get(self._parts()))
        except _Error as exc:
            self._send(exc.status, {"error_code": exc.code, "message": exc.message})

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        """Register a schema."""
        try:
            parts = self._parts()
            if len(parts) != 3 or parts[0] != "subjects" or parts[2] != "versions":
                raise _Error(404, 404, f"no route POST {self.path}")
            length = int(self.headers.get("Content-Length") or 0)
            doc = orjson.loads(self.rfile.read(length))
            if not isinstance(doc, dict) or not isinstance(doc.get("schema"), str):
                raise _Error(422, 42201, "Invalid schema: body needs a schema string")
            refs = tuple(
                (str(r["name"]), str(r["subject"]), int(r["version"]))
                for r in doc.get("references") or ()
            )
            stored = _Stored(str(doc.get("schemaType") or "AVRO"), doc["schema"], refs)
            self._send(200, {"id": self.server.store.register(parts[1], stored)})
        except _Error as exc:
            self._send(exc.status, {"error_code": exc.code, "message": exc.message})
        except (orjson.JSONDecodeError, KeyError, ValueError) as exc:
            self._send(422, {"error_code": 42201, "message": f"Invalid schema: {exc}"})

    def _get(self, parts: list[str]) -> Any:
        store = self.server.store
        with store.lock:
            if parts == ["subjects"]:
                return sorted(store.subjects)
            if len(parts) == 3 and parts[:2] == ["schemas", "ids"] and parts[2].isdigit():
                schema_id = int(parts[2])
                if not 1 <= schema_id <= len(store.schemas):
                    raise _Error(404, 40403, "Schema not found")
                return store.schemas[schema_id - 1].body()
            if len(parts) == 4 and parts[0] == "subjects" and parts[2] == "versions":
                versions = store.subjects.get(parts[1])
                if not versions:
                    raise _Error(404, 40401, f"Subject '{parts[1]}' not found.")
                wanted = parts[3]
                if wanted == "latest":
                    number = len(versions)
                elif wanted.isdigit() and 1 <= int(wanted) <= len(versions):
                    number = int(wanted)
                else:
                    raise _Error(404, 40402, f"Version {wanted} not found.")
                schema_id = versions[number - 1]
                return {
                    "subject": parts[1],
                    "version": number,
                    "id": schema_id,
                    **store.schemas[schema_id - 1].body(),
                }
        raise _Error(404, 404, f"no route GET {self.path}")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    store: _Store


class SchemaRegistry:
    """A registry server in a background thread; ``url`` once started."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> SchemaRegistry:
        """Listen and serve until ``stop``."""
        server = _Server(("127.0.0.1", self.port), _Handler)
        server.store = _Store()
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="schema-registry", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the port."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> SchemaRegistry:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


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
