import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Lease(_message.Message):
    __slots__ = ("schema_version", "node_id", "role", "owner", "epoch", "renewed_at", "ttl_s", "released")
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    RENEWED_AT_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    node_id: str
    role: str
    owner: str
    epoch: int
    renewed_at: _timestamp_pb2.Timestamp
    ttl_s: float
    released: bool
    def __init__(self, schema_version: _Optional[int] = ..., node_id: _Optional[str] = ..., role: _Optional[str] = ..., owner: _Optional[str] = ..., epoch: _Optional[int] = ..., renewed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., ttl_s: _Optional[float] = ..., released: _Optional[bool] = ...) -> None: ...
