"""Confluent Schema Registry: the wire format's header and the few REST calls decoding needs.

A value in Confluent's wire format is a magic byte ``0``, the writer schema's
id as a 4-byte big-endian integer, then the payload (Avro binary, or protobuf
message indexes and the message). Schemas are immutable once registered, so a
schema fetched by id is cached for the life of the process; every executor
process keeps its own cache and asks the registry once per id it meets.

A failed request is remembered for ``RETRY_AFTER_S`` seconds, so a registry
outage costs one timeout per schema id rather than one per record; records
met meanwhile are decode errors that name the cause.
"""

from __future__ import annotations

import base64
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from materializer.errors import ConfigError, MaterializerError, SetupError

if TYPE_CHECKING:
    from pyspark.sql.types import StructField, StructType

MAGIC = 0
HEADER_BYTES = 5
RETRY_AFTER_S = 5.0
TIMEOUT_S = 10.0
_ACCEPT = "application/vnd.schemaregistry.v1+json"


class RegistryError(MaterializerError):
    """A schema the registry could not give; the message says which and why."""


class RegistryUnavailable(RegistryError):
    """The registry did not answer, or answered with a server error."""


class SchemaNotFound(RegistryError):
    """The registry answered that the subject, version or id does not exist."""


class WireFormatError(ValueError):
    """A value that does not start with Confluent's wire-format header."""


@dataclass(frozen=True)
class Reference:
    """A schema's import of another subject's schema (protobuf imports, Avro named types)."""

    name: str
    subject: str
    version: int


@dataclass(frozen=True)
class RegisteredSchema:
    """One registered schema: its id, type (``AVRO``, ``PROTOBUF``, ``JSON``) and text."""

    id: int
    schema_type: str
    text: str
    references: tuple[Reference, ...] = ()


def split_header(value: bytes) -> tuple[int, bytes]:
    """The schema id and the payload of a wire-format value."""
    if len(value) < HEADER_BYTES:
        raise WireFormatError(
            f"value of {len(value)} bytes is shorter than the wire format's 5-byte header"
        )
    if value[0] != MAGIC:
        raise WireFormatError(
            f"not in Confluent's wire format: magic byte 0x{value[0]:02x}, expected 0x00"
        )
    return int.from_bytes(value[1:HEADER_BYTES], "big"), value[HEADER_BYTES:]


def _schema(doc: dict[str, Any], schema_id: int) -> RegisteredSchema:
    refs = tuple(
        Reference(str(r["name"]), str(r["subject"]), int(r["version"]))
        for r in doc.get("references") or ()
    )
    return RegisteredSchema(
        id=schema_id,
        # The registry leaves schemaType out for Avro, its original and default type.
        schema_type=str(doc.get("schemaType") or "AVRO"),
        text=str(doc["schema"]),
        references=refs,
    )


class SchemaRegistryClient:
    """GETs against one registry; by-id and by-version answers are cached (they never change).

    Safe to share between threads. Credentials in the URL (``http://user:pass@host``)
    are sent as HTTP basic auth.
    """

    def __init__(self, url: str, timeout: float = TIMEOUT_S) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self._auth: str | None = None
        if parts.username is not None:
            user = urllib.parse.unquote(parts.username)
            password = urllib.parse.unquote(parts.password or "")
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            self._auth = f"Basic {token}"
            netloc = parts.hostname + (f":{parts.port}" if parts.port else "")
            parts = parts._replace(netloc=netloc)
        self.url = urllib.parse.urlunsplit(parts).rstrip("/")
        self.timeout = timeout
        self._cache: dict[str, RegisteredSchema] = {}
        self._failed: dict[str, tuple[float, RegistryError]] = {}
        self._lock = threading.Lock()

    def by_id(self, schema_id: int, fmt: str | None = None) -> RegisteredSchema:
        """``GET /schemas/ids/{id}`` (``?format=`` when given), cached."""
        path = f"/schemas/ids/{schema_id}"
        if fmt:
            path += f"?format={urllib.parse.quote(fmt)}"
        return self._cached(path, lambda doc: _schema(doc, schema_id))

    def version(self, subject: str, version: int, fmt: str | None = None) -> RegisteredSchema:
        """``GET /subjects/{subject}/versions/{version}``, cached."""
        path = f"/subjects/{urllib.parse.quote(subject, safe='')}/versions/{version}"
        if fmt:
            path += f"?format={urllib.parse.quote(fmt)}"
        return self._cached(path, lambda doc: _schema(doc, int(doc["id"])))

    def latest(self, subject: str, fmt: str | None = None) -> RegisteredSchema:
        """``GET /subjects/{subject}/versions/latest``: never cached, it moves (a failure is
        remembered as any other)."""
        path = f"/subjects/{urllib.parse.quote(subject, safe='')}/versions/latest"
        if fmt:
            path += f"?format={urllib.parse.quote(fmt)}"
        return self._cached(path, lambda doc: _schema(doc, int(doc["id"])), keep=False)

    def _cached(
        self, path: str, parse: Callable[[dict[str, Any]], RegisteredSchema], keep: bool = True
    ) -> RegisteredSchema:
        """``path``'s schema, kept when ``keep``; a failure remembered for ``RETRY_AFTER_S``."""
        with self._lock:
            hit = self._cache.get(path)
            failed = self._failed.get(path)
        if hit is not None:
            return hit
        if failed is not None and time.monotonic() - failed[0] < RETRY_AFTER_S:
            raise failed[1]
        try:
            schema = parse(self._get(path))
        except RegistryError as exc:
            with self._lock:
                self._failed[path] = (time.monotonic(), exc)
            raise
        with self._lock:
            if keep:
                self._cache[path] = schema
            self._failed.pop(path, None)
        return schema

    def _get(self, path: str) -> dict[str, Any]:
        request = urllib.request.Request(self.url + path, headers={"Accept": _ACCEPT})  # noqa: S310 - scheme checked in __init__
        if self._auth:
            request.add_header("Authorization", self._auth)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                body = response.read()
        except urllib.error.HTTPError as exc:
            detail = _error_message(exc)
            if exc.code == 404:
                raise SchemaNotFound(f"{path}: {detail}") from None
            raise RegistryUnavailable(
                f"schema registry {self.url} answered {exc.code} to {path}: {detail}"
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RegistryUnavailable(f"schema registry {self.url} unreachable: {reason}") from None
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise RegistryUnavailable(
                f"schema registry {self.url} sent a body that is not JSON for {path}"
            ) from None
        if not isinstance(doc, dict) or "schema" not in doc:
            raise RegistryUnavailable(
                f"schema registry {self.url} sent no schema for {path}: {body[:200]!r}"
            )
        return doc


def _error_message(exc: urllib.error.HTTPError) -> str:
    """The registry's own error message when its body has one."""
    try:
        doc = orjson.loads(exc.read())
    except (orjson.JSONDecodeError, OSError):
        return exc.reason if isinstance(exc.reason, str) else str(exc.code)
    if isinstance(doc, dict) and "message" in doc:
        return str(doc["message"])
    return str(doc)


_clients: dict[str, SchemaRegistryClient] = {}
_clients_lock = threading.Lock()


def client_for(url: str) -> SchemaRegistryClient:
    """One client (and cache) per process and registry URL."""
    with _clients_lock:
        client = _clients.get(url)
        if client is None:
            client = SchemaRegistryClient(url)
            _clients[url] = client
        return client


def value_subject(topic: str) -> str:
    """The subject of a topic's values under the default TopicNameStrategy."""
    return f"{topic}-value"


def subject_name(strategy: str, topic: str, record_type: str | None = None) -> str:
    """A subject as Confluent's serializers name it: TopicNameStrategy (``topic``),
    RecordNameStrategy (``record``) or TopicRecordNameStrategy (``topic_record``)."""
    if strategy == "topic" or record_type is None:
        return value_subject(topic)
    return record_type if strategy == "record" else f"{topic}-{record_type}"


def union_fields(parts: Sequence[tuple[str, StructType]]) -> StructType:
    """The fields of several record types as one struct, in first-seen order, for a topic
    that carries them all (``record_types``).

    A field name means one thing in a map: two types that give it two types are a
    ConfigError naming both, rather than a column whose type depends on the record.
    Nullability does not count (every decoded field is nullable at every depth), and
    names differing only in case are one name, as Spark resolves them.
    """
    from pyspark.sql.types import StructType

    from materializer.source.formats.arrow_decode import nullable

    merged: dict[str, tuple[StructField, str]] = {}
    for owner, fields in parts:
        for field in fields.fields:
            seen = merged.get(field.name.lower())
            if seen is None:
                merged[field.name.lower()] = (field, owner)
            elif seen[0].name != field.name:
                raise ConfigError(
                    "",
                    [
                        f"source.record_types: field {seen[0].name} of {seen[1]} and field "
                        f"{field.name} of {owner} differ only in case: Spark takes them for one"
                    ],
                )
            elif nullable(seen[0].dataType) != nullable(field.dataType):
                raise ConfigError(
                    "",
                    [
                        f"source.record_types: field {field.name} is "
                        f"{seen[0].dataType.simpleString()} in {seen[1]} and "
                        f"{field.dataType.simpleString()} in {owner}"
                    ],
                )
    return StructType([field for field, _ in merged.values()])


def reader_schema(
    url: str, topic: str, schema_type: str, fmt: str | None = None, subject: str | None = None
) -> RegisteredSchema:
    """Driver side, at start: the latest schema of ``subject`` (default: the topic's value
    subject).

    Raises ConfigError or SetupError naming ``source.schema_registry_url``: a
    map whose registry cannot be reached when it starts does not start.
    """
    subject = subject or value_subject(topic)
    try:
        latest = client_for(url).latest(subject, fmt)
    except ValueError as exc:
        raise ConfigError("", [f"source.schema_registry_url: {exc}"]) from None
    except SchemaNotFound as exc:
        raise ConfigError(
            "",
            [
                f"source.schema_registry_url: no schema for subject {subject} "
                f"(the reader schema is its latest version): {exc}"
            ],
        ) from None
    except RegistryError as exc:
        raise SetupError(f"source.schema_registry_url: {exc}") from None
    if latest.schema_type != schema_type:
        raise ConfigError(
            "",
            [
                f"source.format: subject {subject} holds {latest.schema_type} schemas, "
                f"not {schema_type}"
            ],
        )
    return latest
