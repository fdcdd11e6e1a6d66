import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from sapo.v1 import rollout_pb2 as _rollout_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GroupSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GROUP_SOURCE_UNSPECIFIED: _ClassVar[GroupSource]
    GROUP_SOURCE_LOCAL: _ClassVar[GroupSource]
    GROUP_SOURCE_EXTERNAL: _ClassVar[GroupSource]
GROUP_SOURCE_UNSPECIFIED: GroupSource
GROUP_SOURCE_LOCAL: GroupSource
GROUP_SOURCE_EXTERNAL: GroupSource

class BatchGroup(_message.Message):
    __slots__ = ("group", "source", "rewards", "advantages")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    ADVANTAGES_FIELD_NUMBER: _ClassVar[int]
    group: _rollout_pb2.RolloutGroup
    source: GroupSource
    rewards: _containers.RepeatedScalarFieldContainer[float]
    advantages: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, group: _Optional[_Union[_rollout_pb2.RolloutGroup, _Mapping]] = ..., source: _Optional[_Union[GroupSource, str]] = ..., rewards: _Optional[_Iterable[float]] = ..., advantages: _Optional[_Iterable[float]] = ...) -> None: ...

class OffsetRange(_message.Message):
    __slots__ = ("topic", "partition", "first", "last")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    FIRST_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    first: int
    last: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., first: _Optional[int] = ..., last: _Optional[int] = ...) -> None: ...

class PeerIntake(_message.Message):
    __slots__ = ("node_id", "received", "used", "rejected")
    class RejectedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    received: int
    used: int
    rejected: _containers.ScalarMap[str, int]
    def __init__(self, node_id: _Optional[str] = ..., received: _Optional[int] = ..., used: _Optional[int] = ..., rejected: _Optional[_Mapping[str, int]] = ...) -> None: ...

class TrainingBatch(_message.Message):
    __slots__ = ("schema_version", "batch_id", "node_id", "sequence", "target_policy_version", "groups", "offsets", "created_at", "round", "epoch", "intake", "warm_start")
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TARGET_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    INTAKE_FIELD_NUMBER: _ClassVar[int]
    WARM_START_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    batch_id: str
    node_id: str
    sequence: int
    target_policy_version: int
    groups: _containers.RepeatedCompositeFieldContainer[BatchGroup]
    offsets: _containers.RepeatedCompositeFieldContainer[OffsetRange]
    created_at: _timestamp_pb2.Timestamp
    round: int
    epoch: int
    intake: _containers.RepeatedCompositeFieldContainer[PeerIntake]
    warm_start: bool
    def __init__(self, schema_version: _Optional[int] = ..., batch_id: _Optional[str] = ..., node_id: _Optional[str] = ..., sequence: _Optional[int] = ..., target_policy_version: _Optional[int] = ..., groups: _Optional[_Iterable[_Union[BatchGroup, _Mapping]]] = ..., offsets: _Optional[_Iterable[_Union[OffsetRange, _Mapping]]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., round: _Optional[int] = ..., epoch: _Optional[int] = ..., intake: _Optional[_Iterable[_Union[PeerIntake, _Mapping]]] = ..., warm_start: _Optional[bool] = ...) -> None: ...
