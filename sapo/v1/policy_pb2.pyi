import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from sapo.v1 import batch_pb2 as _batch_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PeerContribution(_message.Message):
    __slots__ = ("node_id", "groups", "completions", "completion_tokens", "advantage_mass")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ADVANTAGE_MASS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    groups: int
    completions: int
    completion_tokens: int
    advantage_mass: float
    def __init__(self, node_id: _Optional[str] = ..., groups: _Optional[int] = ..., completions: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., advantage_mass: _Optional[float] = ...) -> None: ...

class StepMetrics(_message.Message):
    __slots__ = ("loss", "reward_mean", "local_reward_mean", "clip_fraction_low", "clip_fraction_high", "grad_norm", "entropy", "completion_tokens", "step_seconds", "local_completions", "external_completions", "contributions", "intake", "step_cpu_seconds")
    LOSS_FIELD_NUMBER: _ClassVar[int]
    REWARD_MEAN_FIELD_NUMBER: _ClassVar[int]
    LOCAL_REWARD_MEAN_FIELD_NUMBER: _ClassVar[int]
    CLIP_FRACTION_LOW_FIELD_NUMBER: _ClassVar[int]
    CLIP_FRACTION_HIGH_FIELD_NUMBER: _ClassVar[int]
    GRAD_NORM_FIELD_NUMBER: _ClassVar[int]
    ENTROPY_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTIONS_FIELD_NUMBER: _ClassVar[int]
    INTAKE_FIELD_NUMBER: _ClassVar[int]
    STEP_CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    loss: float
    reward_mean: float
    local_reward_mean: float
    clip_fraction_low: float
    clip_fraction_high: float
    grad_norm: float
    entropy: float
    completion_tokens: int
    step_seconds: float
    local_completions: int
    external_completions: int
    contributions: _containers.RepeatedCompositeFieldContainer[PeerContribution]
    intake: _containers.RepeatedCompositeFieldContainer[_batch_pb2.PeerIntake]
    step_cpu_seconds: float
    def __init__(self, loss: _Optional[float] = ..., reward_mean: _Optional[float] = ..., local_reward_mean: _Optional[float] = ..., clip_fraction_low: _Optional[float] = ..., clip_fraction_high: _Optional[float] = ..., grad_norm: _Optional[float] = ..., entropy: _Optional[float] = ..., completion_tokens: _Optional[int] = ..., step_seconds: _Optional[float] = ..., local_completions: _Optional[int] = ..., external_completions: _Optional[int] = ..., contributions: _Optional[_Iterable[_Union[PeerContribution, _Mapping]]] = ..., intake: _Optional[_Iterable[_Union[_batch_pb2.PeerIntake, _Mapping]]] = ..., step_cpu_seconds: _Optional[float] = ...) -> None: ...

class PolicyUpdate(_message.Message):
    __slots__ = ("schema_version", "node_id", "version", "manifest_uri", "manifest_sha256", "created_at", "metrics", "batch_id", "epoch", "sequence")
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_URI_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_SHA256_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    node_id: str
    version: int
    manifest_uri: str
    manifest_sha256: str
    created_at: _timestamp_pb2.Timestamp
    metrics: StepMetrics
    batch_id: str
    epoch: int
    sequence: int
    def __init__(self, schema_version: _Optional[int] = ..., node_id: _Optional[str] = ..., version: _Optional[int] = ..., manifest_uri: _Optional[str] = ..., manifest_sha256: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., metrics: _Optional[_Union[StepMetrics, _Mapping]] = ..., batch_id: _Optional[str] = ..., epoch: _Optional[int] = ..., sequence: _Optional[int] = ...) -> None: ...
