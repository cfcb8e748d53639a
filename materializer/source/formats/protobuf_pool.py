"""Descriptor pools built from serialized FileDescriptorSets, once per process.

A set must hold every file its messages import, dependencies in any order
(``protoc --include_imports`` writes them all); imports of Google's
well-known types (``google/protobuf/*.proto``) are taken from the protobuf
runtime when the set leaves them out.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

# The well-known types register their files in the default pool on import.
from google.protobuf import (  # noqa: F401
    any_pb2,
    descriptor_pb2,
    descriptor_pool,
    duration_pb2,
    empty_pb2,
    field_mask_pb2,
    message_factory,
    struct_pb2,
    timestamp_pb2,
    wrappers_pb2,
)
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import Message

from materializer.source.formats.protobuf_types import ProtobufSchemaError

_pools: dict[str, descriptor_pool.DescriptorPool] = {}


def set_key(descriptor_set: bytes) -> str:
    """A short name for a serialized set's content."""
    return hashlib.sha256(descriptor_set).hexdigest()


def _well_known(name: str) -> descriptor_pb2.FileDescriptorProto:
    try:
        found = descriptor_pool.Default().FindFileByName(name)
    except KeyError:
        raise ProtobufSchemaError(
            f"imports {name}, which is neither in the descriptor set nor a well-known type "
            "(build the set with protoc --include_imports)"
        ) from None
    proto = descriptor_pb2.FileDescriptorProto()
    found.CopyToProto(proto)
    return proto


def add_files(
    pool: descriptor_pool.DescriptorPool, files: Iterable[descriptor_pb2.FileDescriptorProto]
) -> None:
    """Add files to a pool, each after the files it imports."""
    by_name = {f.name: f for f in files}
    added: set[str] = set()

    def add(proto: descriptor_pb2.FileDescriptorProto) -> None:
        if proto.name in added:
            return
        added.add(proto.name)
        for dependency in proto.dependency:
            add(by_name.get(dependency) or _well_known(dependency))
        try:
            pool.AddSerializedFile(proto.SerializeToString())
        except (TypeError, ValueError) as exc:
            raise ProtobufSchemaError(f"file {proto.name} does not load: {exc}") from None

    for proto in by_name.values():
        add(proto)


def pool_for(descriptor_set: bytes) -> descriptor_pool.DescriptorPool:
    """The pool of a serialized FileDescriptorSet, built on first use in this process."""
    key = set_key(descriptor_set)
    pool = _pools.get(key)
    if pool is None:
        files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set).file
        pool = descriptor_pool.DescriptorPool()
        add_files(pool, files)
        _pools[key] = pool
    return pool


def message_names(descriptor_set: bytes) -> list[str]:
    """Every message a set declares, nested ones included, by full name."""
    names: list[str] = []

    def walk(prefix: str, messages: Iterable[descriptor_pb2.DescriptorProto]) -> None:
        for message in messages:
            name = f"{prefix}{message.name}"
            if not message.options.map_entry:
                names.append(name)
            walk(f"{name}.", message.nested_type)

    for proto in descriptor_pb2.FileDescriptorSet.FromString(descriptor_set).file:
        walk(f"{proto.package}." if proto.package else "", proto.message_type)
    return names


def find_message(descriptor_set: bytes, name: str) -> Descriptor:
    """A message of the set by full name; KeyError when it holds none of that name."""
    return pool_for(descriptor_set).FindMessageTypeByName(name)


def message_class(descriptor: Descriptor) -> type[Message]:
    """The generated class of a message descriptor."""
    return message_factory.GetMessageClass(descriptor)
