from materializer.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Lookup(_message.Message):
    __slots__ = ("map", "key_field", "alias", "fields", "join", "on_miss")
    class Join(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        JOIN_UNSPECIFIED: _ClassVar[Lookup.Join]
        LEFT: _ClassVar[Lookup.Join]
        INNER: _ClassVar[Lookup.Join]
    JOIN_UNSPECIFIED: Lookup.Join
    LEFT: Lookup.Join
    INNER: Lookup.Join
    class OnMiss(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ON_MISS_UNSPECIFIED: _ClassVar[Lookup.OnMiss]
        NULL: _ClassVar[Lookup.OnMiss]
        OMIT: _ClassVar[Lookup.OnMiss]
        ERROR: _ClassVar[Lookup.OnMiss]
    ON_MISS_UNSPECIFIED: Lookup.OnMiss
    NULL: Lookup.OnMiss
    OMIT: Lookup.OnMiss
    ERROR: Lookup.OnMiss
    MAP_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_FIELD_NUMBER: _ClassVar[int]
    ALIAS_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    JOIN_FIELD_NUMBER: _ClassVar[int]
    ON_MISS_FIELD_NUMBER: _ClassVar[int]
    map: str
    key_field: str
    alias: str
    fields: _containers.RepeatedScalarFieldContainer[str]
    join: Lookup.Join
    on_miss: Lookup.OnMiss
    def __init__(self, map: _Optional[str] = ..., key_field: _Optional[str] = ..., alias: _Optional[str] = ..., fields: _Optional[_Iterable[str]] = ..., join: _Optional[_Union[Lookup.Join, str]] = ..., on_miss: _Optional[_Union[Lookup.OnMiss, str]] = ...) -> None: ...

class JoinSpec(_message.Message):
    __slots__ = ("lookups",)
    LOOKUPS_FIELD_NUMBER: _ClassVar[int]
    lookups: _containers.RepeatedCompositeFieldContainer[Lookup]
    def __init__(self, lookups: _Optional[_Iterable[_Union[Lookup, _Mapping]]] = ...) -> None: ...

class EnrichRequest(_message.Message):
    __slots__ = ("spec", "profile", "events", "request_id", "freshness")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FRESHNESS_FIELD_NUMBER: _ClassVar[int]
    spec: JoinSpec
    profile: str
    events: _containers.RepeatedScalarFieldContainer[bytes]
    request_id: str
    freshness: _common_pb2.Freshness
    def __init__(self, spec: _Optional[_Union[JoinSpec, _Mapping]] = ..., profile: _Optional[str] = ..., events: _Optional[_Iterable[bytes]] = ..., request_id: _Optional[str] = ..., freshness: _Optional[_Union[_common_pb2.Freshness, _Mapping]] = ...) -> None: ...

class EnrichedEvent(_message.Message):
    __slots__ = ("index", "event", "dropped", "error", "missed")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MISSED_FIELD_NUMBER: _ClassVar[int]
    index: int
    event: bytes
    dropped: bool
    error: str
    missed: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, index: _Optional[int] = ..., event: _Optional[bytes] = ..., dropped: _Optional[bool] = ..., error: _Optional[str] = ..., missed: _Optional[_Iterable[str]] = ...) -> None: ...

class EnrichResponse(_message.Message):
    __slots__ = ("request_id", "events", "watermarks")
    class WatermarksEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _common_pb2.Watermark
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_common_pb2.Watermark, _Mapping]] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    WATERMARKS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    events: _containers.RepeatedCompositeFieldContainer[EnrichedEvent]
    watermarks: _containers.MessageMap[str, _common_pb2.Watermark]
    def __init__(self, request_id: _Optional[str] = ..., events: _Optional[_Iterable[_Union[EnrichedEvent, _Mapping]]] = ..., watermarks: _Optional[_Mapping[str, _common_pb2.Watermark]] = ...) -> None: ...
