"""The local verifier as the sampler applies it: re-derivation and rewards, with honest caching.

`rederive` and `score` are deterministic functions of their inputs, so caching their results changes
nothing but the cost. Re-derivation is cached by what determines its result: (dataset, config digest,
seed, index, split). The provenance's own checks run on every call (the config JSON must hash to its
digest, the seed lie in its split, ...), so a cached item is only handed to a provenance that names
that very item, and the comparison with the sender's text, answer and metadata runs every time: a
sender that varies its claims about one item costs one generation, not one per claim. Several groups
on one question (the same item drawn by many nodes, a restart re-delivering its pool) generate it
once. Within a group, identical completion texts (common for short answers) are scored once.
Nothing is ever skipped: every distinct text of every group is scored by this node's verifier.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Final

from sapo.tasks import Provenance, QuestionRecord, RederivationError, rederive, score, verify_question
from sapo.tasks.verify import provenance_problem

VERIFY_CACHE_SIZE: Final = 4096
"""Re-derived items remembered (a few rounds of a large swarm)."""
ItemKey = tuple[str, str, int, int, str]
"""(dataset, config digest, seed, index, split): what a re-derived item depends on."""


def item_key(provenance: Provenance) -> ItemKey:
    """The cache key of a provenance whose checks passed: its config digest stands for its config
    JSON, which `provenance_problem` has just hashed to that digest."""
    p = provenance
    return (p.dataset, p.config_digest, p.seed, p.index, p.split)


class Verifier:
    """verify_question + score, with re-derivation cached; one per sampler."""

    def __init__(self, cache_size: int = VERIFY_CACHE_SIZE) -> None:
        if cache_size < 1:
            raise ValueError(f"cache_size must be >= 1, got {cache_size}")
        self._size = cache_size
        self._items: OrderedDict[ItemKey, QuestionRecord] = OrderedDict()

    def verify(self, record: QuestionRecord) -> str | None:
        """None when the record is exactly what its provenance re-derives to, else the reason."""
        return verify_question(record, self._rederive)

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

    def _rederive(self, provenance: Provenance) -> QuestionRecord:
        """`rederive`, generating each item once while it stays among the most recently used."""
        reason = provenance_problem(provenance)
        if reason is not None:
            raise RederivationError(reason)
        key = item_key(provenance)
        item = self._items.get(key)
        if item is None:
            item = self._items[key] = rederive(provenance)
            if len(self._items) > self._size:
                self._items.popitem(last=False)
        else:
            self._items.move_to_end(key)
        return item
