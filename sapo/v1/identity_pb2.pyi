import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class KeyAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KEY_ACTION_UNSPECIFIED: _ClassVar[KeyAction]
    KEY_ACTION_ADD: _ClassVar[KeyAction]
    KEY_ACTION_REVOKE: _ClassVar[KeyAction]
KEY_ACTION_UNSPECIFIED: KeyAction
KEY_ACTION_ADD: KeyAction
KEY_ACTION_REVOKE: KeyAction

class KeyStatement(_message.Message):
    __slots__ = ("schema_version", "action", "node_id", "key_id", "public_key", "previous_key_id", "retire_previous_at", "issued_at")
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_KEY_ID_FIELD_NUMBER: _ClassVar[int]
    RETIRE_PREVIOUS_AT_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    action: KeyAction
    node_id: str
    key_id: str
    public_key: bytes
    previous_key_id: str
    retire_previous_at: _timestamp_pb2.Timestamp
    issued_at: _timestamp_pb2.Timestamp
    def __init__(self, schema_version: _Optional[int] = ..., action: _Optional[_Union[KeyAction, str]] = ..., node_id: _Optional[str] = ..., key_id: _Optional[str] = ..., public_key: _Optional[bytes] = ..., previous_key_id: _Optional[str] = ..., retire_previous_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., issued_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class KeySignature(_message.Message):
    __slots__ = ("key_id", "signature")
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    signature: bytes
    def __init__(self, key_id: _Optional[str] = ..., signature: _Optional[bytes] = ...) -> None: ...

class KeyAnnouncement(_message.Message):
    __slots__ = ("statement", "signatures")
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    SIGNATURES_FIELD_NUMBER: _ClassVar[int]
    statement: bytes
    signatures: _containers.RepeatedCompositeFieldContainer[KeySignature]
    def __init__(self, statement: _Optional[bytes] = ..., signatures: _Optional[_Iterable[_Union[KeySignature, _Mapping]]] = ...) -> None: ...
