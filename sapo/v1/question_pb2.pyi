from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Split(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SPLIT_UNSPECIFIED: _ClassVar[Split]
    SPLIT_TRAIN: _ClassVar[Split]
    SPLIT_EVAL: _ClassVar[Split]
SPLIT_UNSPECIFIED: Split
SPLIT_TRAIN: Split
SPLIT_EVAL: Split

class Provenance(_message.Message):
    __slots__ = ("dataset", "config_json", "config_digest", "seed", "index", "generator_version", "split")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    CONFIG_DIGEST_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    GENERATOR_VERSION_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    config_json: str
    config_digest: str
    seed: int
    index: int
    generator_version: str
    split: Split
    def __init__(self, dataset: _Optional[str] = ..., config_json: _Optional[str] = ..., config_digest: _Optional[str] = ..., seed: _Optional[int] = ..., index: _Optional[int] = ..., generator_version: _Optional[str] = ..., split: _Optional[_Union[Split, str]] = ...) -> None: ...

class Question(_message.Message):
    __slots__ = ("task", "text", "answer", "metadata_json", "provenance")
    TASK_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    METADATA_JSON_FIELD_NUMBER: _ClassVar[int]
    PROVENANCE_FIELD_NUMBER: _ClassVar[int]
    task: str
    text: str
    answer: str
    metadata_json: str
    provenance: Provenance
    def __init__(self, task: _Optional[str] = ..., text: _Optional[str] = ..., answer: _Optional[str] = ..., metadata_json: _Optional[str] = ..., provenance: _Optional[_Union[Provenance, _Mapping]] = ...) -> None: ...
