"""Records survive the trip through the wire and still verify."""

from __future__ import annotations

import pytest

from sapo.convert import question_from_proto, question_to_proto
from sapo.tasks import EASY_PROFILE, TaskStream, verify_question
from sapo.v1 import question_pb2
from sapo.wire import InvalidMessageError

pytestmark = pytest.mark.unit


def test_round_trip_preserves_records_and_verification() -> None:
    for record in TaskStream(EASY_PROFILE, node_seed=3, split="train").take(8):
        wire_bytes = question_to_proto(record).SerializeToString()
        back = question_pb2.Question()
        back.ParseFromString(wire_bytes)
        again = question_from_proto(back)
        assert again == record
        assert verify_question(again) is None


def test_unspecified_split_and_bad_metadata_are_rejected() -> None:
    record = TaskStream(EASY_PROFILE, node_seed=3, split="train").take(1)[0]
    msg = question_to_proto(record)
    msg.provenance.split = question_pb2.SPLIT_UNSPECIFIED
    with pytest.raises(InvalidMessageError, match="missing_split"):
        question_from_proto(msg)
    msg = question_to_proto(record)
    msg.metadata_json = "[1]"
    with pytest.raises(InvalidMessageError, match="bad_metadata_json"):
        question_from_proto(msg)
