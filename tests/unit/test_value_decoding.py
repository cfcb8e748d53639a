"""Decoding pieces that need no Spark session: registry client, wire format, type mappings."""

from __future__ import annotations

import datetime
import io
import subprocess
import sys
import uuid
from decimal import Decimal
from pathlib import Path

import fastavro
import orjson
import pyarrow as pa
import pytest
from google.protobuf import descriptor_pb2
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from materializer import record_columns as c
from materializer.config import inferred_problems, parse_config
from materializer.errors import ConfigError, SetupError
from materializer.fold.entity_types import ddl, parse_variant_schema, with_new_fields
from materializer.source.formats.arrow_decode import ArrowDecode, DecodeFailure, ValueDecoder
from materializer.source.formats.avro_types import AvroSchemaError, converter, spark_type
from materializer.source.formats.json_inferred import field_path
from materializer.source.formats.protobuf_file import ProtobufDecoder, read_descriptor_set
from materializer.source.formats.protobuf_pool import find_message
from materializer.source.formats.protobuf_registry import (
    message_at,
    read_message_indexes,
    schema_files,
)
from materializer.source.formats.protobuf_types import spark_type as proto_spark_type
from materializer.source.formats.registry import (
    RegistryUnavailable,
    SchemaNotFound,
    SchemaRegistryClient,
    WireFormatError,
    reader_schema,
    split_header,
)
from materializer.testing import free_port
from materializer.testing.registry import register, serialized_descriptor, wire_value

USER_V1 = {
    "type": "record",
    "name": "User",
    "fields": [{"name": "id", "type": "string"}, {"name": "age", "type": "int"}],
}


@pytest.fixture()
def registry(schema_registry_url: str) -> str:
    return schema_registry_url


# ------------------------------------------------------------------ registry


def test_registry_client_reads_what_the_server_registered(registry):
    subject = f"users-{uuid.uuid4().hex[:8]}-value"
    v1 = register(registry, subject, orjson.dumps(USER_V1).decode())
    assert register(registry, subject, orjson.dumps(USER_V1).decode()) == v1  # same schema, same id
    v2_schema = {
        **USER_V1,
        "fields": [*USER_V1["fields"], {"name": "x", "type": "int", "default": 0}],
    }
    v2 = register(registry, subject, orjson.dumps(v2_schema).decode())
    assert v2 != v1
    client = SchemaRegistryClient(registry)
    assert client.latest(subject).id == v2
    assert client.version(subject, 1).id == v1
    got = client.by_id(v1)
    assert (got.schema_type, orjson.loads(got.text)) == ("AVRO", USER_V1)
    with pytest.raises(SchemaNotFound, match=r"^/schemas/ids/9999: No content with id"):
        client.by_id(9999)
    with pytest.raises(SchemaNotFound, match="no-such-subject-value"):
        client.latest("no-such-subject-value")


def test_an_unreachable_registry_is_reported_and_remembered_briefly():
    client = SchemaRegistryClient(f"http://127.0.0.1:{free_port()}", timeout=2)
    with pytest.raises(RegistryUnavailable, match="unreachable"):
        client.by_id(1)
    # The failure is remembered: a second lookup does not wait for another timeout.
    with pytest.raises(RegistryUnavailable):
        client.by_id(1)


def test_reader_schema_at_start_names_the_config_key(registry):
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(SetupError, match=r"^source\.schema_registry_url: .*unreachable"):
        reader_schema(dead, "t", "AVRO")
    with pytest.raises(ConfigError) as info:
        reader_schema(registry, f"absent-{uuid.uuid4().hex}", "AVRO")
    assert info.value.problems[0].startswith("source.schema_registry_url: no schema for subject")
    topic = f"p-{uuid.uuid4().hex[:8]}"
    register(registry, f"{topic}-value", "syntax = 'proto3'; message M {}", "PROTOBUF")
    with pytest.raises(ConfigError, match="holds PROTOBUF schemas, not AVRO"):
        reader_schema(registry, topic, "AVRO")


def test_wire_format_header_and_message_indexes():
    assert split_header(wire_value(7, b"abc")) == (7, b"abc")
    with pytest.raises(WireFormatError, match="magic byte 0x7b"):
        split_header(b'{"id": 1}')
    with pytest.raises(WireFormatError, match="shorter"):
        split_header(b"\x00\x00")
    for indexes in ([0], [1], [2, 0, 5], [300]):
        _, payload = split_header(wire_value(1, b"MSG", indexes))
        found, start = read_message_indexes(payload)
        assert (list(found), payload[start:]) == (indexes, b"MSG")
    with pytest.raises(DecodeFailure, match="end before"):
        read_message_indexes(b"\x04\x80")


# ------------------------------------------------------------------ avro


RICH = {
    "type": "record",
    "name": "Rich",
    "namespace": "t",
    "fields": [
        {"name": "color", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "BLUE"]}},
        {"name": "other", "type": ["null", "Color"], "default": None},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "tod", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
        {
            "name": "amount",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
        },
        {"name": "counts", "type": {"type": "map", "values": "long"}},
        {"name": "either", "type": ["null", "string", "long", "Color"]},
        {"name": "num", "type": ["int", "long"]},
        {"name": "raw", "type": {"type": "fixed", "name": "Four", "size": 4}},
        {
            "name": "items",
            "type": {
                "type": "array",
                "items": {
                    "type": "record",
                    "name": "Item",
                    "fields": [{"name": "u", "type": {"type": "string", "logicalType": "uuid"}}],
                },
            },
        },
    ],
}


def test_avro_types_follow_spark_from_avro():
    schema = fastavro.parse_schema(RICH)
    assert spark_type(schema) == T.StructType(
        [
            T.StructField("color", T.StringType(), False),
            T.StructField("other", T.StringType(), True),
            T.StructField("at", T.TimestampType(), False),
            T.StructField("local", T.TimestampNTZType(), False),
            T.StructField("day", T.DateType(), False),
            T.StructField("tod", T.IntegerType(), False),
            T.StructField("uid", T.StringType(), False),
            T.StructField("amount", T.DecimalType(9, 2), False),
            T.StructField("counts", T.MapType(T.StringType(), T.LongType(), False), False),
            T.StructField(
                "either",
                T.StructType(
                    [
                        T.StructField("member0", T.StringType(), True),
                        T.StructField("member1", T.LongType(), True),
                        T.StructField("member2", T.StringType(), True),
                    ]
                ),
                True,
            ),
            T.StructField("num", T.LongType(), False),
            T.StructField("raw", T.BinaryType(), False),
            T.StructField(
                "items",
                T.ArrayType(T.StructType([T.StructField("u", T.StringType(), False)]), False),
                False,
            ),
        ]
    )


def test_avro_values_convert_to_what_arrow_takes():
    schema = fastavro.parse_schema(RICH)
    uid = uuid.uuid4()
    value = {
        "color": "RED",
        "other": None,
        "at": datetime.datetime(2024, 5, 1, 12, 0, 0, 123000, tzinfo=datetime.UTC),
        "local": datetime.datetime(2024, 5, 1, 12, 0, 0, 123456),
        "day": datetime.date(2024, 5, 1),
        "tod": datetime.time(1, 2, 3, 4000),
        "uid": str(uid),
        "amount": Decimal("12.34"),
        "counts": {"a": 1},
        "either": 42,
        "num": 7,
        "raw": b"abcd",
        "items": [{"u": str(uid)}],
    }
    out = io.BytesIO()
    fastavro.schemaless_writer(out, schema, value)
    out.seek(0)
    read = converter(schema)(fastavro.schemaless_reader(out, schema, None))  # type: ignore[misc]
    assert read["uid"] == str(uid) and read["items"] == [{"u": str(uid)}]
    assert read["tod"] == 3723004
    assert read["either"] == {"member1": 42}
    arrow_type = pa.struct(list(to_arrow_schema(spark_type(schema), timezone="UTC")))
    assert pa.array([read], type=arrow_type).to_pylist()[0]["either"] == {
        "member0": None,
        "member1": 42,
        "member2": None,
    }


def test_recursive_avro_records_are_refused():
    node = {
        "type": "record",
        "name": "Node",
        "fields": [{"name": "next", "type": ["null", "Node"]}],
    }
    with pytest.raises(AvroSchemaError, match="recursive"):
        spark_type(fastavro.parse_schema(node))


# ------------------------------------------------------------------ inferred json


def test_variant_schemas_become_normalised_spark_types():
    text = (
        "OBJECT<`a b`: BIGINT, ```q`: BOOLEAN, big: DECIMAL(24,0), e: ARRAY<VOID>, "
        "m: VARIANT, o: OBJECT<>, x: OBJECT<y: ARRAY<VOID>, z: STRING>, n: VOID>"
    )
    assert parse_variant_schema(text) == T.StructType(
        [
            T.StructField("a b", T.LongType()),
            T.StructField("`q", T.BooleanType()),
            T.StructField("big", T.DoubleType()),
            T.StructField("m", T.StringType()),
            T.StructField("x", T.StructType([T.StructField("z", T.StringType())])),
        ]
    )
    assert parse_variant_schema("VARIANT") == T.StringType()


def test_known_fields_keep_their_types_and_ddl_quotes_every_name():
    known = T.StructType([T.StructField("age", T.LongType())])
    found = T.StructType(
        [T.StructField("age", T.StringType()), T.StructField("it`s", T.DoubleType())]
    )
    merged = with_new_fields(known, found)
    assert merged.simpleString() == "struct<age:bigint,it`s:double>"
    assert ddl(merged) == "struct<`age`:bigint,`it``s`:double>"
    assert [field_path(n) for n in ("id", "a b", "it's")] == ["$.id", "$['a b']", '$["it\'s"]']


def test_schemaless_json_accepts_no_schema_and_refuses_what_needs_types():
    base = {"source": {"topics": ["t"], "format": "json"}, "key": "id"}
    cfg = parse_config({"maps": {"m": base}})
    assert cfg.maps["m"].source.schema_ is None
    assert inferred_problems(cfg.maps["m"]) == []
    doc = {
        **base,
        "transforms": [{"type": "drop", "fields": ["x"]}],
        "fold": {
            "mode": "aggregate",
            "aggregates": {"n": {"fn": "count"}},
            "delete_when": "x = 1",
        },
    }
    problems = inferred_problems(parse_config({"maps": {"m": doc}}).maps["m"])
    assert [p.split(":")[0] for p in problems] == ["transforms", "fold.mode", "fold.delete_when"]
    assert problems[1].startswith("fold.mode: aggregate needs source.schema")
    merge = parse_config({"maps": {"m": {**base, "fold": {"mode": "merge"}}}}).maps["m"]
    assert inferred_problems(merge)[0].startswith("fold.mode: merge needs source.schema")


def test_registry_url_is_checked():
    def problems(source):
        with pytest.raises(ConfigError) as info:
            parse_config({"maps": {"m": {"source": {"topics": ["t"], **source}, "key": "id"}}})
        return info.value.problems

    assert problems({"format": "avro", "schema_registry_url": "localhost:8081"}) == [
        "maps.m.source: schema_registry_url must be an http:// or https:// URL"
    ]
    both = {
        "format": "protobuf",
        "schema_registry_url": "http://r",
        "descriptor_file": "x.desc",
        "message": "M",
    }
    assert problems(both) == [
        "maps.m.source: format protobuf takes descriptor_file or schema_registry_url, not both"
    ]


# ------------------------------------------------------------------ arrow decoding


class _Digits(ValueDecoder):
    """Decodes b"<n>" to {"n": n}; anything else fails."""

    def decode(self, value: bytes) -> dict[str, object]:
        if not value.isdigit():
            raise DecodeFailure(f"not digits: {value!r}")
        return {"n": int(value)}


def test_arrow_decode_keeps_every_row_and_isolates_misfits():
    fields = T.StructType([T.StructField("n", T.IntegerType())])
    batch = pa.RecordBatch.from_arrays(
        [pa.array([b"1", None, b"x", b"99999999999", b"5"], pa.binary()), pa.array(range(5))],
        names=[c.VALUE, c.OFFSET],
    )
    (out,) = list(ArrowDecode(_Digits(), fields)([batch]))
    rows = out.to_pylist()
    assert [r["n"] for r in rows] == [1, None, None, None, 5]
    assert [r[c.OFFSET] for r in rows] == [0, 1, 2, 3, 4]
    assert [r[c.ERROR_STAGE] for r in rows] == [None, None, "decode", "decode", None]
    assert rows[2][c.ERROR_MESSAGE] == "not digits: b'x'"
    assert rows[3][c.ERROR_MESSAGE].startswith("decoded value does not fit the map's schema")


# ------------------------------------------------------------------ protobuf

PROTO = """
syntax = "proto3";
package shop.v1;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";

enum Status { STATUS_UNKNOWN = 0; ACTIVE = 1; }
message Order {
  string id = 1;
  int64 total = 2;
  optional int32 qty = 3;
  uint64 big = 4;
  Status status = 5;
  repeated string tags = 6;
  map<string, Line> lines = 7;
  google.protobuf.Timestamp at = 8;
  google.protobuf.Int64Value maybe = 9;
  oneof pay { string card = 10; string iban = 11; }
  message Line { string sku = 1; uint32 n = 2; }
  Line first = 12;
}
"""


def compile_proto(tmp: Path, text: str, name: str = "shop.proto") -> bytes:
    """A FileDescriptorSet of ``text``, built by grpc_tools' protoc."""
    (tmp / name).write_text(text)
    out = tmp / "set.pb"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{tmp}",
            f"-I{Path(__import__('grpc_tools').__file__).parent / '_proto'}",
            "--include_imports",
            f"--descriptor_set_out={out}",
            name,
        ],
        check=True,
    )
    return out.read_bytes()


def test_protobuf_types_and_presence(tmp_path: Path):
    data = compile_proto(tmp_path, PROTO)
    order = find_message(data, "shop.v1.Order")
    line = T.StructType([T.StructField("sku", T.StringType()), T.StructField("n", T.LongType())])
    assert proto_spark_type(order) == T.StructType(
        [
            T.StructField("id", T.StringType()),
            T.StructField("total", T.LongType()),
            T.StructField("qty", T.IntegerType()),
            T.StructField("big", T.DecimalType(20, 0)),
            T.StructField("status", T.StringType()),
            T.StructField("tags", T.ArrayType(T.StringType())),
            T.StructField("lines", T.MapType(T.StringType(), line)),
            T.StructField("at", T.TimestampType()),
            T.StructField("maybe", T.LongType()),
            T.StructField("card", T.StringType()),
            T.StructField("iban", T.StringType()),
            T.StructField("first", line),
        ]
    )
    from google.protobuf import message_factory

    cls = message_factory.GetMessageClass(order)
    msg = cls(id="o1", big=2**64 - 1, status=1, tags=["a"], card="4111")
    msg.lines["l1"].sku = "s"
    msg.at.seconds, msg.at.nanos = 1_700_000_000, 5_000
    msg.maybe.SetInParent()  # a wrapper holding 0 is set, unlike a bare int64 of 0
    decoded = ProtobufDecoder(data, "shop.v1.Order").decode(msg.SerializeToString())
    assert decoded == {
        "id": "o1",
        "total": 0,  # no presence in proto3: the default
        "qty": None,  # optional: unset is null
        "big": Decimal(2**64 - 1),
        "status": "ACTIVE",
        "tags": ["a"],
        "lines": {"l1": {"sku": "s", "n": 0}},
        "at": datetime.datetime(2023, 11, 14, 22, 13, 20, 5, tzinfo=datetime.UTC),
        "maybe": 0,
        "card": "4111",
        "iban": None,
        "first": None,
    }
    with pytest.raises(DecodeFailure, match="not a protobuf shop.v1.Order"):
        ProtobufDecoder(data, "shop.v1.Order").decode(b"\xff\xff\xff")


def test_descriptor_file_problems_name_their_key(tmp_path: Path):
    data = compile_proto(tmp_path, PROTO)
    desc = tmp_path / "shop.desc"
    desc.write_bytes(data)

    def source(**extra):
        doc = {"topics": ["t"], "format": "protobuf", **extra}
        return parse_config({"maps": {"m": {"source": doc, "key": "id"}}}).maps["m"]

    with pytest.raises(ConfigError, match=r"source\.message: no message 'shop\.v1\.Nope'.*Order"):
        read_descriptor_set(source(descriptor_file=str(desc), message="shop.v1.Nope"))
    with pytest.raises(ConfigError, match=r"source\.descriptor_file: cannot read"):
        read_descriptor_set(source(descriptor_file=str(tmp_path / "no.desc"), message="M"))
    (tmp_path / "bad.desc").write_bytes(b"\xff\xff not a set")
    with pytest.raises(ConfigError, match="not a serialized FileDescriptorSet"):
        read_descriptor_set(source(descriptor_file=str(tmp_path / "bad.desc"), message="M"))


def test_registry_protobuf_schemas_as_descriptors_or_source(registry, tmp_path: Path):
    data = compile_proto(tmp_path, PROTO)
    files = descriptor_pb2.FileDescriptorSet.FromString(data).file
    shop = next(f for f in files if f.name == "shop.proto")
    subject = f"orders-{uuid.uuid4().hex[:8]}-value"
    as_descriptor = register(
        registry, subject, serialized_descriptor(shop.SerializeToString()), "PROTOBUF"
    )
    as_source = register(registry, subject, PROTO, "PROTOBUF")
    client = SchemaRegistryClient(registry)
    for schema_id in (as_descriptor, as_source):
        main = schema_files(client, client.by_id(schema_id, "serialized"), "x.proto")[-1]
        assert message_at(main, (0,)) == "shop.v1.Order"
        # Nested types count map entries too, as protoc and Confluent's serializers order them.
        assert message_at(main, (0, 1)) == "shop.v1.Order.Line"
        with pytest.raises(DecodeFailure, match="point past"):
            message_at(main, (3,))
