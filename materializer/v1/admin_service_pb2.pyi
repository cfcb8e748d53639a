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

class ListMapsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MapInfo(_message.Message):
    __slots__ = ("name", "topics", "format", "key", "fold_mode", "table_path", "origin", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    FOLD_MODE_FIELD_NUMBER: _ClassVar[int]
    TABLE_PATH_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    topics: _containers.RepeatedScalarFieldContainer[str]
    format: str
    key: str
    fold_mode: str
    table_path: str
    origin: str
    version: int
    def __init__(self, name: _Optional[str] = ..., topics: _Optional[_Iterable[str]] = ..., format: _Optional[str] = ..., key: _Optional[str] = ..., fold_mode: _Optional[str] = ..., table_path: _Optional[str] = ..., origin: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class ListMapsResponse(_message.Message):
    __slots__ = ("maps",)
    MAPS_FIELD_NUMBER: _ClassVar[int]
    maps: _containers.RepeatedCompositeFieldContainer[MapInfo]
    def __init__(self, maps: _Optional[_Iterable[_Union[MapInfo, _Mapping]]] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ("map",)
    MAP_FIELD_NUMBER: _ClassVar[int]
    map: str
    def __init__(self, map: _Optional[str] = ...) -> None: ...

class PartitionLag(_message.Message):
    __slots__ = ("topic", "partition", "materialized_offset", "log_end_offset", "lag", "catch_up_rate", "input_rate", "eta_seconds")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    MATERIALIZED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOG_END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_RATE_FIELD_NUMBER: _ClassVar[int]
    INPUT_RATE_FIELD_NUMBER: _ClassVar[int]
    ETA_SECONDS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    materialized_offset: int
    log_end_offset: int
    lag: int
    catch_up_rate: float
    input_rate: float
    eta_seconds: float
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., materialized_offset: _Optional[int] = ..., log_end_offset: _Optional[int] = ..., lag: _Optional[int] = ..., catch_up_rate: _Optional[float] = ..., input_rate: _Optional[float] = ..., eta_seconds: _Optional[float] = ...) -> None: ...

class MapStatus(_message.Message):
    __slots__ = ("map", "state", "error", "last_batch_id", "last_batch_at", "watermark", "partitions", "total_lag", "input_rows_per_second", "output_rows_per_second", "reported_at", "state_keys", "state_bytes", "worker_id", "catch_up_rate", "input_rate", "eta_seconds", "serves_from_table")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[MapStatus.State]
        NOT_STARTED: _ClassVar[MapStatus.State]
        RUNNING: _ClassVar[MapStatus.State]
        PAUSED: _ClassVar[MapStatus.State]
        FAILED: _ClassVar[MapStatus.State]
        STOPPED: _ClassVar[MapStatus.State]
        RESTORING: _ClassVar[MapStatus.State]
        REBUILDING: _ClassVar[MapStatus.State]
        CATCHING_UP: _ClassVar[MapStatus.State]
    STATE_UNSPECIFIED: MapStatus.State
    NOT_STARTED: MapStatus.State
    RUNNING: MapStatus.State
    PAUSED: MapStatus.State
    FAILED: MapStatus.State
    STOPPED: MapStatus.State
    RESTORING: MapStatus.State
    REBUILDING: MapStatus.State
    CATCHING_UP: MapStatus.State
    MAP_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LAST_BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_BATCH_AT_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_LAG_FIELD_NUMBER: _ClassVar[int]
    INPUT_ROWS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_ROWS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    REPORTED_AT_FIELD_NUMBER: _ClassVar[int]
    STATE_KEYS_FIELD_NUMBER: _ClassVar[int]
    STATE_BYTES_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_RATE_FIELD_NUMBER: _ClassVar[int]
    INPUT_RATE_FIELD_NUMBER: _ClassVar[int]
    ETA_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SERVES_FROM_TABLE_FIELD_NUMBER: _ClassVar[int]
    map: str
    state: MapStatus.State
    error: str
    last_batch_id: int
    last_batch_at: _timestamp_pb2.Timestamp
    watermark: _common_pb2.Watermark
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionLag]
    total_lag: int
    input_rows_per_second: float
    output_rows_per_second: float
    reported_at: _timestamp_pb2.Timestamp
    state_keys: int
    state_bytes: int
    worker_id: str
    catch_up_rate: float
    input_rate: float
    eta_seconds: float
    serves_from_table: bool
    def __init__(self, map: _Optional[str] = ..., state: _Optional[_Union[MapStatus.State, str]] = ..., error: _Optional[str] = ..., last_batch_id: _Optional[int] = ..., last_batch_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., watermark: _Optional[_Union[_common_pb2.Watermark, _Mapping]] = ..., partitions: _Optional[_Iterable[_Union[PartitionLag, _Mapping]]] = ..., total_lag: _Optional[int] = ..., input_rows_per_second: _Optional[float] = ..., output_rows_per_second: _Optional[float] = ..., reported_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., state_keys: _Optional[int] = ..., state_bytes: _Optional[int] = ..., worker_id: _Optional[str] = ..., catch_up_rate: _Optional[float] = ..., input_rate: _Optional[float] = ..., eta_seconds: _Optional[float] = ..., serves_from_table: _Optional[bool] = ...) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("maps",)
    MAPS_FIELD_NUMBER: _ClassVar[int]
    maps: _containers.RepeatedCompositeFieldContainer[MapStatus]
    def __init__(self, maps: _Optional[_Iterable[_Union[MapStatus, _Mapping]]] = ...) -> None: ...

class ControlRequest(_message.Message):
    __slots__ = ("map",)
    MAP_FIELD_NUMBER: _ClassVar[int]
    map: str
    def __init__(self, map: _Optional[str] = ...) -> None: ...

class ControlResponse(_message.Message):
    __slots__ = ("map", "requested_state")
    MAP_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_STATE_FIELD_NUMBER: _ClassVar[int]
    map: str
    requested_state: MapStatus.State
    def __init__(self, map: _Optional[str] = ..., requested_state: _Optional[_Union[MapStatus.State, str]] = ...) -> None: ...

class ValidateConfigRequest(_message.Message):
    __slots__ = ("config",)
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    config: str
    def __init__(self, config: _Optional[str] = ...) -> None: ...

class ValidateConfigResponse(_message.Message):
    __slots__ = ("valid", "problems")
    VALID_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    valid: bool
    problems: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, valid: _Optional[bool] = ..., problems: _Optional[_Iterable[str]] = ...) -> None: ...

class PutMapRequest(_message.Message):
    __slots__ = ("map", "config_json", "rebuild")
    MAP_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    REBUILD_FIELD_NUMBER: _ClassVar[int]
    map: str
    config_json: str
    rebuild: bool
    def __init__(self, map: _Optional[str] = ..., config_json: _Optional[str] = ..., rebuild: _Optional[bool] = ...) -> None: ...

class GetMapConfigRequest(_message.Message):
    __slots__ = ("map",)
    MAP_FIELD_NUMBER: _ClassVar[int]
    map: str
    def __init__(self, map: _Optional[str] = ...) -> None: ...

class MapDefinition(_message.Message):
    __slots__ = ("map", "config_json", "origin", "version", "changed_by", "changed_at", "created", "rebuilding")
    MAP_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHANGED_BY_FIELD_NUMBER: _ClassVar[int]
    CHANGED_AT_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    REBUILDING_FIELD_NUMBER: _ClassVar[int]
    map: str
    config_json: str
    origin: str
    version: int
    changed_by: str
    changed_at: _timestamp_pb2.Timestamp
    created: bool
    rebuilding: bool
    def __init__(self, map: _Optional[str] = ..., config_json: _Optional[str] = ..., origin: _Optional[str] = ..., version: _Optional[int] = ..., changed_by: _Optional[str] = ..., changed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created: _Optional[bool] = ..., rebuilding: _Optional[bool] = ...) -> None: ...

class DeleteMapRequest(_message.Message):
    __slots__ = ("map", "purge")
    MAP_FIELD_NUMBER: _ClassVar[int]
    PURGE_FIELD_NUMBER: _ClassVar[int]
    map: str
    purge: bool
    def __init__(self, map: _Optional[str] = ..., purge: _Optional[bool] = ...) -> None: ...

class DeleteMapResponse(_message.Message):
    __slots__ = ("map", "version", "purged")
    MAP_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PURGED_FIELD_NUMBER: _ClassVar[int]
    map: str
    version: int
    purged: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, map: _Optional[str] = ..., version: _Optional[int] = ..., purged: _Optional[_Iterable[str]] = ...) -> None: ...

class OperationRequest(_message.Message):
    __slots__ = ("map", "kind")
    MAP_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    map: str
    kind: str
    def __init__(self, map: _Optional[str] = ..., kind: _Optional[str] = ...) -> None: ...

class GetOperationRequest(_message.Message):
    __slots__ = ("map",)
    MAP_FIELD_NUMBER: _ClassVar[int]
    map: str
    def __init__(self, map: _Optional[str] = ...) -> None: ...

class KeyDifferences(_message.Message):
    __slots__ = ("count", "first")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    FIRST_FIELD_NUMBER: _ClassVar[int]
    count: int
    first: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, count: _Optional[int] = ..., first: _Optional[_Iterable[str]] = ...) -> None: ...

class VerifyResult(_message.Message):
    __slots__ = ("identical", "expected", "actual", "missing", "extra", "different", "watermark_matches")
    IDENTICAL_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    ACTUAL_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    DIFFERENT_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_MATCHES_FIELD_NUMBER: _ClassVar[int]
    identical: bool
    expected: int
    actual: int
    missing: KeyDifferences
    extra: KeyDifferences
    different: KeyDifferences
    watermark_matches: bool
    def __init__(self, identical: _Optional[bool] = ..., expected: _Optional[int] = ..., actual: _Optional[int] = ..., missing: _Optional[_Union[KeyDifferences, _Mapping]] = ..., extra: _Optional[_Union[KeyDifferences, _Mapping]] = ..., different: _Optional[_Union[KeyDifferences, _Mapping]] = ..., watermark_matches: _Optional[bool] = ...) -> None: ...

class RehydrateResult(_message.Message):
    __slots__ = ("loaded", "removed", "expired", "seconds")
    LOADED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    loaded: int
    removed: int
    expired: int
    seconds: float
    def __init__(self, loaded: _Optional[int] = ..., removed: _Optional[int] = ..., expired: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

class RebuildResult(_message.Message):
    __slots__ = ("generation",)
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    generation: int
    def __init__(self, generation: _Optional[int] = ...) -> None: ...

class Operation(_message.Message):
    __slots__ = ("map", "id", "kind", "requested_by", "requested_at", "state", "phase", "progress_done", "progress_total", "started_at", "finished_at", "worker_id", "error", "verify", "rehydrate", "rebuild")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[Operation.State]
        REQUESTED: _ClassVar[Operation.State]
        RUNNING: _ClassVar[Operation.State]
        DONE: _ClassVar[Operation.State]
        FAILED: _ClassVar[Operation.State]
    STATE_UNSPECIFIED: Operation.State
    REQUESTED: Operation.State
    RUNNING: Operation.State
    DONE: Operation.State
    FAILED: Operation.State
    MAP_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_AT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_DONE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    VERIFY_FIELD_NUMBER: _ClassVar[int]
    REHYDRATE_FIELD_NUMBER: _ClassVar[int]
    REBUILD_FIELD_NUMBER: _ClassVar[int]
    map: str
    id: str
    kind: str
    requested_by: str
    requested_at: _timestamp_pb2.Timestamp
    state: Operation.State
    phase: str
    progress_done: int
    progress_total: int
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    worker_id: str
    error: str
    verify: VerifyResult
    rehydrate: RehydrateResult
    rebuild: RebuildResult
    def __init__(self, map: _Optional[str] = ..., id: _Optional[str] = ..., kind: _Optional[str] = ..., requested_by: _Optional[str] = ..., requested_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., state: _Optional[_Union[Operation.State, str]] = ..., phase: _Optional[str] = ..., progress_done: _Optional[int] = ..., progress_total: _Optional[int] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., worker_id: _Optional[str] = ..., error: _Optional[str] = ..., verify: _Optional[_Union[VerifyResult, _Mapping]] = ..., rehydrate: _Optional[_Union[RehydrateResult, _Mapping]] = ..., rebuild: _Optional[_Union[RebuildResult, _Mapping]] = ...) -> None: ...
