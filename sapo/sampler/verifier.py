"""The local verifier as the sampler applies it: re-derivation and rewards, with honest caching.

`verify_question` and `score` are deterministic functions of their inputs, so caching their results
changes nothing but the cost. Re-derivation is cached by the full record (a hit needs an equal record:
same provenance, text, answer and metadata), which pays off when the same question arrives again (a
restart re-delivering its pool, several groups on one question). Within a group, identical completion
texts (common for short answers) are scored once. Nothing is ever skipped: every distinct text of
every group is scored by this node's verifier.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from sapo.tasks import QuestionRecord, score, verify_question

VERIFY_CACHE_SIZE = 4096
"""Re-derived questions remembered (a few rounds of a large swarm)."""


class Verifier:
    """verify_question + score, cached; one per sampler."""

    def __init__(self, cache_size: int = VERIFY_CACHE_SIZE) -> None:
        self._verify = functools.lru_cache(maxsize=cache_size)(verify_question)

    def verify(self, record: QuestionRecord) -> str | None:
        """None when the record is exactly what its provenance re-derives to, else the reason."""
        return self._verify(record)

    def rewards(self, record: QuestionRecord, texts: Sequence[str]) -> list[float]:
        """This node's reward for each completion text, in order.

        Every generator in a swarm ends its prompt with `sapo.tasks.ANSWER_PREFILL`, so the
        completion is scored as the continuation of that opening tag.
        """
        memo: dict[str, float] = {}
        for text in texts:
            if text not in memo:
                memo[text] = score(record, text, prefilled=True)
        return [memo[t] for t in texts]
