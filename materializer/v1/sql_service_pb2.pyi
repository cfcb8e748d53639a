import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from materializer.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SqlParam(_message.Message):
    __slots__ = ("null", "bool_value", "int_value", "double_value", "string_value", "bytes_value", "timestamp_value", "decimal_value")
    NULL_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_VALUE_FIELD_NUMBER: _ClassVar[int]
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    BYTES_VALUE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_VALUE_FIELD_NUMBER: _ClassVar[int]
    DECIMAL_VALUE_FIELD_NUMBER: _ClassVar[int]
    null: bool
    bool_value: bool
    int_value: int
    double_value: float
    string_value: str
    bytes_value: bytes
    timestamp_value: _timestamp_pb2.Timestamp
    decimal_value: str
    def __init__(self, null: _Optional[bool] = ..., bool_value: _Optional[bool] = ..., int_value: _Optional[int] = ..., double_value: _Optional[float] = ..., string_value: _Optional[str] = ..., bytes_value: _Optional[bytes] = ..., timestamp_value: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., decimal_value: _Optional[str] = ...) -> None: ...

class ExecuteRequest(_message.Message):
    __slots__ = ("sql", "params", "freshness", "limit")
    SQL_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    FRESHNESS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    sql: str
    params: _containers.RepeatedCompositeFieldContainer[SqlParam]
    freshness: _common_pb2.Freshness
    limit: int
    def __init__(self, sql: _Optional[str] = ..., params: _Optional[_Iterable[_Union[SqlParam, _Mapping]]] = ..., freshness: _Optional[_Union[_common_pb2.Freshness, _Mapping]] = ..., limit: _Optional[int] = ...) -> None: ...

class TableRead(_message.Message):
    __slots__ = ("map", "version", "watermark", "redis", "index")
    MAP_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_FIELD_NUMBER: _ClassVar[int]
    REDIS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    map: str
    version: int
    watermark: _common_pb2.Watermark
    redis: bool
    index: str
    def __init__(self, map: _Optional[str] = ..., version: _Optional[int] = ..., watermark: _Optional[_Union[_common_pb2.Watermark, _Mapping]] = ..., redis: _Optional[bool] = ..., index: _Optional[str] = ...) -> None: ...

class TablesRead(_message.Message):
    __slots__ = ("tables",)
    TABLES_FIELD_NUMBER: _ClassVar[int]
    tables: _containers.RepeatedCompositeFieldContainer[TableRead]
    def __init__(self, tables: _Optional[_Iterable[_Union[TableRead, _Mapping]]] = ...) -> None: ...

class ExecuteResponse(_message.Message):
    __slots__ = ("arrow_schema", "arrow_batch", "tables")
    ARROW_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    ARROW_BATCH_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    arrow_schema: bytes
    arrow_batch: bytes
    tables: TablesRead
    def __init__(self, arrow_schema: _Optional[bytes] = ..., arrow_batch: _Optional[bytes] = ..., tables: _Optional[_Union[TablesRead, _Mapping]] = ...) -> None: ...
