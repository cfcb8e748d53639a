import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PartitionOffset(_message.Message):
    __slots__ = ("topic", "partition", "offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    offset: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class Watermark(_message.Message):
    __slots__ = ("batch_id", "offsets", "updated_at")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    offsets: _containers.RepeatedCompositeFieldContainer[PartitionOffset]
    updated_at: _timestamp_pb2.Timestamp
    def __init__(self, batch_id: _Optional[int] = ..., offsets: _Optional[_Iterable[_Union[PartitionOffset, _Mapping]]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Freshness(_message.Message):
    __slots__ = ("min_offsets",)
    MIN_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    min_offsets: _containers.RepeatedCompositeFieldContainer[PartitionOffset]
    def __init__(self, min_offsets: _Optional[_Iterable[_Union[PartitionOffset, _Mapping]]] = ...) -> None: ...
