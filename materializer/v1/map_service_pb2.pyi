import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from materializer.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetRequest(_message.Message):
    __slots__ = ("map", "key", "freshness")
    MAP_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    FRESHNESS_FIELD_NUMBER: _ClassVar[int]
    map: str
    key: str
    freshness: _common_pb2.Freshness
    def __init__(self, map: _Optional[str] = ..., key: _Optional[str] = ..., freshness: _Optional[_Union[_common_pb2.Freshness, _Mapping]] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("found", "entity", "watermark", "from_table", "table_version")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    ENTITY_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_FIELD_NUMBER: _ClassVar[int]
    FROM_TABLE_FIELD_NUMBER: _ClassVar[int]
    TABLE_VERSION_FIELD_NUMBER: _ClassVar[int]
    found: bool
    entity: bytes
    watermark: _common_pb2.Watermark
    from_table: bool
    table_version: int
    def __init__(self, found: _Optional[bool] = ..., entity: _Optional[bytes] = ..., watermark: _Optional[_Union[_common_pb2.Watermark, _Mapping]] = ..., from_table: _Optional[bool] = ..., table_version: _Optional[int] = ...) -> None: ...

class BatchGetRequest(_message.Message):
    __slots__ = ("map", "keys", "freshness")
    MAP_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    FRESHNESS_FIELD_NUMBER: _ClassVar[int]
    map: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    freshness: _common_pb2.Freshness
    def __init__(self, map: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., freshness: _Optional[_Union[_common_pb2.Freshness, _Mapping]] = ...) -> None: ...

class BatchGetEntry(_message.Message):
    __slots__ = ("key", "found", "entity")
    KEY_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    ENTITY_FIELD_NUMBER: _ClassVar[int]
    key: str
    found: bool
    entity: bytes
    def __init__(self, key: _Optional[str] = ..., found: _Optional[bool] = ..., entity: _Optional[bytes] = ...) -> None: ...

class BatchGetResponse(_message.Message):
    __slots__ = ("entries", "watermark", "from_table", "table_version")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_FIELD_NUMBER: _ClassVar[int]
    FROM_TABLE_FIELD_NUMBER: _ClassVar[int]
    TABLE_VERSION_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[BatchGetEntry]
    watermark: _common_pb2.Watermark
    from_table: bool
    table_version: int
    def __init__(self, entries: _Optional[_Iterable[_Union[BatchGetEntry, _Mapping]]] = ..., watermark: _Optional[_Union[_common_pb2.Watermark, _Mapping]] = ..., from_table: _Optional[bool] = ..., table_version: _Optional[int] = ...) -> None: ...

class Value(_message.Message):
    __slots__ = ("string_value", "int_value", "double_value", "bool_value", "timestamp_value")
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_VALUE_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_VALUE_FIELD_NUMBER: _ClassVar[int]
    string_value: str
    int_value: int
    double_value: float
    bool_value: bool
    timestamp_value: _timestamp_pb2.Timestamp
    def __init__(self, string_value: _Optional[str] = ..., int_value: _Optional[int] = ..., double_value: _Optional[float] = ..., bool_value: _Optional[bool] = ..., timestamp_value: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Comparison(_message.Message):
    __slots__ = ("field", "op", "value", "values")
    class Operator(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OPERATOR_UNSPECIFIED: _ClassVar[Comparison.Operator]
        EQ: _ClassVar[Comparison.Operator]
        NE: _ClassVar[Comparison.Operator]
        LT: _ClassVar[Comparison.Operator]
        LE: _ClassVar[Comparison.Operator]
        GT: _ClassVar[Comparison.Operator]
        GE: _ClassVar[Comparison.Operator]
        IN: _ClassVar[Comparison.Operator]
        IS_NULL: _ClassVar[Comparison.Operator]
        IS_NOT_NULL: _ClassVar[Comparison.Operator]
        LIKE: _ClassVar[Comparison.Operator]
    OPERATOR_UNSPECIFIED: Comparison.Operator
    EQ: Comparison.Operator
    NE: Comparison.Operator
    LT: Comparison.Operator
    LE: Comparison.Operator
    GT: Comparison.Operator
    GE: Comparison.Operator
    IN: Comparison.Operator
    IS_NULL: Comparison.Operator
    IS_NOT_NULL: Comparison.Operator
    LIKE: Comparison.Operator
    FIELD_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    field: str
    op: Comparison.Operator
    value: Value
    values: _containers.RepeatedCompositeFieldContainer[Value]
    def __init__(self, field: _Optional[str] = ..., op: _Optional[_Union[Comparison.Operator, str]] = ..., value: _Optional[_Union[Value, _Mapping]] = ..., values: _Optional[_Iterable[_Union[Value, _Mapping]]] = ...) -> None: ...

class Predicate(_message.Message):
    __slots__ = ("comparison",)
    class And(_message.Message):
        __slots__ = ("all",)
        ALL_FIELD_NUMBER: _ClassVar[int]
        all: _containers.RepeatedCompositeFieldContainer[Predicate]
        def __init__(self, all: _Optional[_Iterable[_Union[Predicate, _Mapping]]] = ...) -> None: ...
    class Or(_message.Message):
        __slots__ = ("any",)
        ANY_FIELD_NUMBER: _ClassVar[int]
        any: _containers.RepeatedCompositeFieldContainer[Predicate]
        def __init__(self, any: _Optional[_Iterable[_Union[Predicate, _Mapping]]] = ...) -> None: ...
    COMPARISON_FIELD_NUMBER: _ClassVar[int]
    AND_FIELD_NUMBER: _ClassVar[int]
    OR_FIELD_NUMBER: _ClassVar[int]
    NOT_FIELD_NUMBER: _ClassVar[int]
    comparison: Comparison
    def __init__(self, comparison: _Optional[_Union[Comparison, _Mapping]] = ..., **kwargs) -> None: ...

class QueryRequest(_message.Message):
    __slots__ = ("map", "predicate", "where", "fields", "limit", "page_size", "page_token", "freshness")
    MAP_FIELD_NUMBER: _ClassVar[int]
    PREDICATE_FIELD_NUMBER: _ClassVar[int]
    WHERE_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    FRESHNESS_FIELD_NUMBER: _ClassVar[int]
    map: str
    predicate: Predicate
    where: str
    fields: _containers.RepeatedScalarFieldContainer[str]
    limit: int
    page_size: int
    page_token: str
    freshness: _common_pb2.Freshness
    def __init__(self, map: _Optional[str] = ..., predicate: _Optional[_Union[Predicate, _Mapping]] = ..., where: _Optional[str] = ..., fields: _Optional[_Iterable[str]] = ..., limit: _Optional[int] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., freshness: _Optional[_Union[_common_pb2.Freshness, _Mapping]] = ...) -> None: ...

class Row(_message.Message):
    __slots__ = ("key", "entity")
    KEY_FIELD_NUMBER: _ClassVar[int]
    ENTITY_FIELD_NUMBER: _ClassVar[int]
    key: str
    entity: bytes
    def __init__(self, key: _Optional[str] = ..., entity: _Optional[bytes] = ...) -> None: ...

class QueryResponse(_message.Message):
    __slots__ = ("rows", "page_token", "table_version", "watermark", "source", "index")
    class Source(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        SOURCE_UNSPECIFIED: _ClassVar[QueryResponse.Source]
        TABLE: _ClassVar[QueryResponse.Source]
        REDIS_INDEX: _ClassVar[QueryResponse.Source]
    SOURCE_UNSPECIFIED: QueryResponse.Source
    TABLE: QueryResponse.Source
    REDIS_INDEX: QueryResponse.Source
    ROWS_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TABLE_VERSION_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[Row]
    page_token: str
    table_version: int
    watermark: _common_pb2.Watermark
    source: QueryResponse.Source
    index: str
    def __init__(self, rows: _Optional[_Iterable[_Union[Row, _Mapping]]] = ..., page_token: _Optional[str] = ..., table_version: _Optional[int] = ..., watermark: _Optional[_Union[_common_pb2.Watermark, _Mapping]] = ..., source: _Optional[_Union[QueryResponse.Source, str]] = ..., index: _Optional[str] = ...) -> None: ...

class GetAsOfRequest(_message.Message):
    __slots__ = ("map", "key", "version", "timestamp", "freshness")
    MAP_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    FRESHNESS_FIELD_NUMBER: _ClassVar[int]
    map: str
    key: str
    version: int
    timestamp: _timestamp_pb2.Timestamp
    freshness: _common_pb2.Freshness
    def __init__(self, map: _Optional[str] = ..., key: _Optional[str] = ..., version: _Optional[int] = ..., timestamp: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., freshness: _Optional[_Union[_common_pb2.Freshness, _Mapping]] = ...) -> None: ...

class GetAsOfResponse(_message.Message):
    __slots__ = ("found", "entity", "table_version", "committed_at", "watermark")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    ENTITY_FIELD_NUMBER: _ClassVar[int]
    TABLE_VERSION_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_FIELD_NUMBER: _ClassVar[int]
    found: bool
    entity: bytes
    table_version: int
    committed_at: _timestamp_pb2.Timestamp
    watermark: _common_pb2.Watermark
    def __init__(self, found: _Optional[bool] = ..., entity: _Optional[bytes] = ..., table_version: _Optional[int] = ..., committed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., watermark: _Optional[_Union[_common_pb2.Watermark, _Mapping]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("map", "after_change_id", "include_entities", "keys", "predicate", "where", "include_left")
    MAP_FIELD_NUMBER: _ClassVar[int]
    AFTER_CHANGE_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_ENTITIES_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PREDICATE_FIELD_NUMBER: _ClassVar[int]
    WHERE_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_LEFT_FIELD_NUMBER: _ClassVar[int]
    map: str
    after_change_id: str
    include_entities: bool
    keys: _containers.RepeatedScalarFieldContainer[str]
    predicate: Predicate
    where: str
    include_left: bool
    def __init__(self, map: _Optional[str] = ..., after_change_id: _Optional[str] = ..., include_entities: _Optional[bool] = ..., keys: _Optional[_Iterable[str]] = ..., predicate: _Optional[_Union[Predicate, _Mapping]] = ..., where: _Optional[str] = ..., include_left: _Optional[bool] = ...) -> None: ...

class Change(_message.Message):
    __slots__ = ("change_id", "key", "op", "batch_id", "entity", "left")
    class Operation(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OPERATION_UNSPECIFIED: _ClassVar[Change.Operation]
        UPSERT: _ClassVar[Change.Operation]
        DELETE: _ClassVar[Change.Operation]
        EXPIRE: _ClassVar[Change.Operation]
    OPERATION_UNSPECIFIED: Change.Operation
    UPSERT: Change.Operation
    DELETE: Change.Operation
    EXPIRE: Change.Operation
    CHANGE_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ENTITY_FIELD_NUMBER: _ClassVar[int]
    LEFT_FIELD_NUMBER: _ClassVar[int]
    change_id: str
    key: str
    op: Change.Operation
    batch_id: int
    entity: bytes
    left: bool
    def __init__(self, change_id: _Optional[str] = ..., key: _Optional[str] = ..., op: _Optional[_Union[Change.Operation, str]] = ..., batch_id: _Optional[int] = ..., entity: _Optional[bytes] = ..., left: _Optional[bool] = ...) -> None: ...

class WatchResponse(_message.Message):
    __slots__ = ("changes",)
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    changes: _containers.RepeatedCompositeFieldContainer[Change]
    def __init__(self, changes: _Optional[_Iterable[_Union[Change, _Mapping]]] = ...) -> None: ...

class GetSchemaRequest(_message.Message):
    __slots__ = ("map",)
    MAP_FIELD_NUMBER: _ClassVar[int]
    map: str
    def __init__(self, map: _Optional[str] = ...) -> None: ...

class Column(_message.Message):
    __slots__ = ("name", "type", "added_in_version", "added_at")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    ADDED_IN_VERSION_FIELD_NUMBER: _ClassVar[int]
    ADDED_AT_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    added_in_version: int
    added_at: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., added_in_version: _Optional[int] = ..., added_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetSchemaResponse(_message.Message):
    __slots__ = ("map", "table_version", "columns")
    MAP_FIELD_NUMBER: _ClassVar[int]
    TABLE_VERSION_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    map: str
    table_version: int
    columns: _containers.RepeatedCompositeFieldContainer[Column]
    def __init__(self, map: _Optional[str] = ..., table_version: _Optional[int] = ..., columns: _Optional[_Iterable[_Union[Column, _Mapping]]] = ...) -> None: ...
