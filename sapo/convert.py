"""Conversion between the task package's plain records and the wire's protobuf messages."""

from __future__ import annotations

import json

from sapo.tasks import Provenance, QuestionRecord
from sapo.tasks.records import Split
from sapo.v1 import question_pb2
from sapo.wire import InvalidMessageError

_SPLIT_TO_WIRE = {"train": question_pb2.SPLIT_TRAIN, "eval": question_pb2.SPLIT_EVAL}


def question_to_proto(record: QuestionRecord) -> question_pb2.Question:
    p = record.provenance
    return question_pb2.Question(
        task=record.task,
        text=record.text,
        answer=record.answer,
        metadata_json=record.metadata_json,
        provenance=question_pb2.Provenance(
            dataset=p.dataset,
            config_json=p.config_json,
            config_digest=p.config_digest,
            seed=p.seed,
            index=p.index,
            generator_version=p.generator_version,
            split=_SPLIT_TO_WIRE[p.split],
        ),
    )


def question_from_proto(question: question_pb2.Question) -> QuestionRecord:
    """The record as the sender claims it; callers re-derive it before trusting any of it."""
    p = question.provenance
    split: Split
    if p.split == question_pb2.SPLIT_TRAIN:
        split = "train"
    elif p.split == question_pb2.SPLIT_EVAL:
        split = "eval"
    else:
        raise InvalidMessageError("missing_split")
    try:
        metadata = json.loads(question.metadata_json or "{}")
    except ValueError:
        raise InvalidMessageError("bad_metadata_json") from None
    if not isinstance(metadata, dict):
        raise InvalidMessageError("bad_metadata_json")
    provenance = Provenance(
        dataset=p.dataset,
        config_json=p.config_json,
        config_digest=p.config_digest,
        seed=p.seed,
        index=p.index,
        generator_version=p.generator_version,
        split=split,
    )
    return QuestionRecord(question.task, question.text, question.answer, metadata, provenance)
