import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkItem(_message.Message):
    __slots__ = ("schema_version", "node_id", "round", "position", "stream_index", "min_policy_version", "max_policy_version", "created_at", "epoch")
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    STREAM_INDEX_FIELD_NUMBER: _ClassVar[int]
    MIN_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    node_id: str
    round: int
    position: int
    stream_index: int
    min_policy_version: int
    max_policy_version: int
    created_at: _timestamp_pb2.Timestamp
    epoch: int
    def __init__(self, schema_version: _Optional[int] = ..., node_id: _Optional[str] = ..., round: _Optional[int] = ..., position: _Optional[int] = ..., stream_index: _Optional[int] = ..., min_policy_version: _Optional[int] = ..., max_policy_version: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., epoch: _Optional[int] = ...) -> None: ...
