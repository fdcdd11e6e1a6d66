"""The verifier's re-derivation cache: each item generated once per (dataset, config digest, seed,
index, split), every claim still compared, every provenance still checked."""

from __future__ import annotations

import dataclasses

import pytest

from sapo.sampler import verifier as verifier_module
from sapo.sampler.verifier import Verifier, item_key
from sapo.tasks import Provenance, QuestionRecord, rederive
from tests.unit.sampler.builders import questions

pytestmark = pytest.mark.unit

RECORDS = questions(node_seed=41, count=3)


@pytest.fixture
def generated(monkeypatch: pytest.MonkeyPatch) -> list[Provenance]:
    """The provenances the verifier generated an item for, in order."""
    calls: list[Provenance] = []

    def counting(provenance: Provenance) -> QuestionRecord:
        calls.append(provenance)
        return rederive(provenance)

    monkeypatch.setattr(verifier_module, "rederive", counting)
    return calls


def test_claims_about_one_item_generate_it_once_and_are_each_compared(generated: list[Provenance]) -> None:
    verifier = Verifier()
    record = RECORDS[0]
    assert verifier.verify(record) is None
    assert verifier.verify(dataclasses.replace(record, answer=record.answer + "0")) == "answer_mismatch"
    assert verifier.verify(dataclasses.replace(record, text="What is 1 + 1?")) == "question_mismatch"
    assert verifier.verify(record) is None
    assert len(generated) == 1
    assert verifier.verify(RECORDS[1]) is None
    assert [item_key(p) for p in generated] == [
        item_key(RECORDS[0].provenance),
        item_key(RECORDS[1].provenance),
    ]


def test_a_cached_item_is_never_handed_to_a_provenance_that_fails_its_checks(
    generated: list[Provenance],
) -> None:
    verifier = Verifier()
    record = RECORDS[0]
    assert verifier.verify(record) is None
    other_config = dataclasses.replace(record.provenance, config_json=record.provenance.config_json + " ")
    assert verifier.verify(dataclasses.replace(record, provenance=other_config)) == "config_digest_mismatch"
    assert len(generated) == 1


def test_the_least_recently_used_item_is_forgotten_beyond_the_capacity(generated: list[Provenance]) -> None:
    verifier = Verifier(cache_size=2)
    for record in (RECORDS[0], RECORDS[1], RECORDS[0], RECORDS[2], RECORDS[0], RECORDS[1]):
        assert verifier.verify(record) is None
    # 0, 1 generated; 0 hit; 2 evicts 1; 0 hit; 1 generated again
    assert [p.index for p in generated] == [
        r.provenance.index for r in (RECORDS[0], RECORDS[1], RECORDS[2], RECORDS[1])
    ]
    with pytest.raises(ValueError):
        Verifier(cache_size=0)
