"""A registry subject that gains a field while ``materializer run`` folds it: the map takes
the new version without a restart of the run or a rebuild (``source.formats.schema_moves``).

One run folds two maps through a real registry: Avro written by Confluent's own
serializer, which registers its new version as it first writes with it, and protobuf
registered as confluent-kafka registers it. Each gets records of its first version,
then records of a version with one more field; the entities and the Delta table end as
a fold in plain Python of every record with the wider field list says (the entities
folded before read the new field as absent), and the map never fails. Then the query
service says what changed and when, each way a client asks (``GetSchema`` over gRPC and
HTTP, the console's map page, Flight SQL's table metadata), as the table's history
records it.
"""

from __future__ import annotations

import asyncio
import datetime
import random
import uuid
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.flight as fl
import redis
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from deltalake import DeltaTable
from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, json_format, message_factory

from materializer.testing import produce
from materializer.testing.reference import fold_latest
from materializer.testing.registry import register, serialized_descriptor, wire_value
from materializer.testing.waiting import wait_until
from materializer.v1 import map_service_pb2 as map_pb
from materializer.v1 import map_service_pb2_grpc as map_grpc
from query_service.sql.flightsql import FlightSql_pb2 as fsql
from tests.helpers.query_redis import Front, serve_http
from tests.helpers.runs import config_file, materializer_run
from tests.helpers.slices import config, delta_map_rs, redis_map, slice_config

FIELDS = ["id", "name", "age"]
WIDER = [*FIELDS, "note"]
Event = tuple[int, int, bytes | None, bytes | None]


def _avro_schema(fields: list[str]) -> str:
    types = {"id": "string", "name": ["null", "string"], "age": "int", "note": ["null", "string"]}
    doc = {
        "type": "record",
        "name": "User",
        "namespace": "shop",
        "fields": [
            {"name": f, "type": types[f], **({"default": None} if f in ("name", "note") else {})}
            for f in fields
        ],
    }
    return orjson.dumps(doc).decode()


def _proto_file(fields: list[str]) -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(
        name=f"users_{len(fields)}.proto", package="shop.v1", syntax="proto3"
    )
    message = file.message_type.add(name="User")
    kinds = descriptor_pb2.FieldDescriptorProto
    for number, name in enumerate(fields, 1):
        message.field.add(
            name=name,
            number=number,
            label=kinds.LABEL_OPTIONAL,
            type=kinds.TYPE_INT32 if name == "age" else kinds.TYPE_STRING,
        )
    return file


def _users(rng: random.Random, count: int, start: int, wider: bool) -> list[dict[str, Any]]:
    """Users u0 to u11 at first; the wider ones are u6 to u17, so u0 to u5 keep no note."""
    docs = []
    for i in range(start, start + count):
        uid = f"u{rng.randrange(6, 18) if wider else rng.randrange(12)}"
        doc: dict[str, Any] = {"id": uid, "name": f"n{i}", "age": i}
        if wider:
            doc["note"] = f"note {i}"
        docs.append(doc)
    return docs


def _as_events(positions: list[tuple[int, int]], docs: list[dict[str, Any]]) -> list[Event]:
    return [
        (p, o, d["id"].encode(), orjson.dumps(d)) for (p, o), d in zip(positions, docs, strict=True)
    ]


class AvroWriter:
    """Confluent's AvroSerializer: it registers its schema as the subject's next version
    the first time it writes with it."""

    def __init__(self, url: str, kafka: str, topic: str) -> None:
        self.registry = SchemaRegistryClient({"url": url})
        self.kafka, self.topic = kafka, topic

    def write(self, docs: list[dict[str, Any]], fields: list[str]) -> list[Event]:
        serialize = AvroSerializer(self.registry, _avro_schema(fields))
        context = SerializationContext(self.topic, MessageField.VALUE)
        records = [(d["id"].encode(), serialize(d, context)) for d in docs]
        return _as_events(produce(self.kafka, self.topic, records), docs)


class ProtobufWriter:
    """The schema registered as confluent-kafka registers it (a serialized descriptor),
    then messages in the wire format."""

    def __init__(self, url: str, kafka: str, topic: str) -> None:
        self.url, self.kafka, self.topic = url, kafka, topic

    def write(self, docs: list[dict[str, Any]], fields: list[str]) -> list[Event]:
        file = _proto_file(fields)
        schema_id = register(
            self.url,
            f"{self.topic}-value",
            serialized_descriptor(file.SerializeToString()),
            "PROTOBUF",
        )
        pool = descriptor_pool.DescriptorPool()
        pool.Add(file)
        user = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.v1.User"))
        records = [
            (d["id"].encode(), wire_value(schema_id, user(**d).SerializeToString(), [0]))
            for d in docs
        ]
        return _as_events(produce(self.kafka, self.topic, records), docs)


def test_a_field_added_to_a_registry_subject_reaches_the_running_maps(
    kafka_bootstrap,
    redis_url,
    redis_client: redis.Redis,
    schema_registry_url: str,
    new_topic,
    tmp_path: Path,
):
    suffix = uuid.uuid4().hex[:6]
    writers = {
        f"avro{suffix}": AvroWriter(schema_registry_url, kafka_bootstrap, new_topic(2)),
        f"proto{suffix}": ProtobufWriter(schema_registry_url, kafka_bootstrap, new_topic(2)),
    }
    (first, second) = writers
    doc = slice_config(tmp_path, kafka_bootstrap, redis_url, "unused", first)
    source = {"schema_registry_url": schema_registry_url}
    doc["maps"][first]["source"] = {
        "topics": [writers[first].topic],
        "format": "avro",
        **source,
    }
    doc["maps"][second] = {
        "source": {"topics": [writers[second].topic], "format": "protobuf", **source},
        "key": "id",
        "changelog": {"topic": f"{second}.changelog"},
    }
    rng = random.Random(5)
    events: dict[str, list[Event]] = {}
    for name, writer in writers.items():  # the first versions exist before the run starts
        events[name] = writer.write(_users(rng, 40, 0, wider=False), FIELDS)

    with materializer_run(config_file(doc, tmp_path)) as run:
        for name in writers:
            reference = fold_latest(events[name], "id", FIELDS)
            wait_until(
                f"map {name} to fold",
                lambda name=name, reference=reference: redis_map(redis_client, name) == reference,
                alive=run.alive,
            )
            # Past its opening batch: the queries that go on have read their reader.
            wait_until(f"map {name} running", lambda name=name: f"map {name} running" in run.log())
        wider_from = datetime.datetime.now(datetime.UTC)
        for name, writer in writers.items():
            events[name] += writer.write(_users(rng, 30, 100, wider=True), WIDER)
        for name in writers:
            expected = fold_latest(events[name], "id", WIDER)
            assert any("note" not in e for e in expected.values()), "an entity folded before"
            assert any("note" in e for e in expected.values())
            wait_until(
                f"the new field in map {name}",
                lambda name=name, expected=expected: redis_map(redis_client, name) == expected,
                alive=run.alive,
            )
            wait_until(
                f"the new column in map {name}'s table",
                lambda name=name, expected=expected: (
                    delta_map_rs(tmp_path / "warehouse" / name) == expected
                ),
                alive=run.alive,
                retry_errors=True,
            )
        log = run.log()
    for name in writers:
        assert f"map {name}: subject {writers[name].topic}-value moved from schema id" in log
        assert "which adds note" in log
        assert f"map {name} failed" not in log

    described = serve_http(config(doc), lambda front: _described(front, list(writers)), True)
    for name in writers:
        history = DeltaTable(str(tmp_path / "warehouse" / name)).history()
        (added,) = [c for c in history if c["operation"] == "ADD COLUMN"]
        committed = datetime.datetime.fromtimestamp(added["timestamp"] / 1000, datetime.UTC)
        answers = described[name]
        assert answers["http"] == answers["grpc"]
        assert answers["http"]["map"] == name
        columns = {c["name"]: c for c in answers["http"]["columns"]}
        assert list(columns) == WIDER
        assert [c["added_in_version"] for c in columns.values()] == ["0", "0", "0"] + [
            str(added["version"])
        ]
        assert "added_at" not in columns["id"]
        at = datetime.datetime.fromisoformat(columns["note"]["added_at"])
        assert wider_from <= at <= committed
        when = at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        assert answers["flight"] == {"note": f"added at table version {added['version']}, {when}"}
        assert answers["console"].count(f"added at version {added['version']}, ") == 1


async def _described(front: Front, names: list[str]) -> dict[str, dict[str, Any]]:
    """What the query service says of each map's columns: GetSchema over HTTP and gRPC,
    the remarks of Flight SQL's table metadata, the console's map page."""
    maps = map_grpc.MapServiceStub(front.channel)
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        answer = await maps.GetSchema(map_pb.GetSchemaRequest(map=name))
        async with front.http.get(f"{front.base}/ui/maps/{name}") as page:
            assert page.status == 200
            console = await page.text()
        out[name] = {
            "http": await front.json("GET", f"/v1/maps/{name}/schema"),
            "grpc": json_format.MessageToDict(
                answer,
                preserving_proto_field_name=True,
                always_print_fields_with_no_presence=True,
            ),
            "console": console,
        }
    remarks = await asyncio.to_thread(_flight_remarks, front.flight_port or 0)
    for name in names:
        out[name]["flight"] = remarks[name]
    return out


def _flight_remarks(port: int) -> dict[str, dict[str, str]]:
    """Each table's columns that have remarks (``ARROW:FLIGHT:SQL:REMARKS``) in the table
    schemas Flight SQL's ``CommandGetTables`` answers, as a Flight client asks for them."""
    remarks = b"ARROW:FLIGHT:SQL:REMARKS"
    command = any_pb2.Any()
    command.Pack(fsql.CommandGetTables(include_schema=True))
    client = fl.FlightClient(f"grpc://127.0.0.1:{port}")
    try:
        info = client.get_flight_info(fl.FlightDescriptor.for_command(command.SerializeToString()))
        tables = client.do_get(info.endpoints[0].ticket).read_all().to_pylist()
    finally:
        client.close()
    out = {}
    for table in tables:
        schema = pa.ipc.read_schema(pa.py_buffer(table["table_schema"]))
        out[table["table_name"]] = {
            f.name: f.metadata[remarks].decode()
            for f in schema
            if f.metadata and remarks in f.metadata
        }
    return out
