"""The sampler's pure core: filters, pool, I/J selection, round modes, batch building.

No Kafka here: the service (`sapo.node.sampler`) feeds consumed messages in and publishes what comes
out. Module map:
- `screen`: header prefilter, bounded decode, the per-group filter pipeline, rejection reasons,
  eager or lazy (at selection) verification, lazy arrival on the facts header without decoding.
- `sender`: who sent a group (the verified node identity on the swarm stream, `sapo.identity`).
- `seen`: the bounded dedupe set of group ids.
- `verifier`: re-derivation and local rewards, with result caching that never skips a check.
- `pool`: accepted groups waiting for a batch, bounded per origin.
- `selection`: fixed / adaptive I/J, per-source quota, uniform / reward-guided choice of J.
- `assembler`: the round modes lockstep / deadline / async; verifies lazily screened picks.
- `intake`: per peer, what was received, rejected and used since the previous batch (`PeerIntake`).
- `configs`: the generator settings fingerprints of the node's own groups over a recent window.
- `batch`: the TrainingBatch message and the history a restart recovers from the batch topic.
- `warm`: warm start (late join) from the swarm topic's retained history, through the same screen.
- `core`: `SamplerCore`, all of the above for one node without transport (service and in-process).
- `settings`: `SamplerSettings`, the service's settings (imported from there, not from this package).
"""

from sapo.sampler.assembler import Assembler, Assembly, AssemblyConfig, Discard, RoundMode, make_assembler
from sapo.sampler.batch import History, HistoryBuilder, batch_id, build_batch
from sapo.sampler.core import FRESH_REASONS, SamplerCore, next_sequence_of
from sapo.sampler.pool import Entry, Pool
from sapo.sampler.screen import (
    HEADER_REASONS,
    MALFORMED_REASONS,
    ORIGINS,
    REASONS,
    Origin,
    Scored,
    Screen,
    ScreenConfig,
    Unread,
    VerifyMode,
    arrival_facts,
    header_reason,
    parse,
)
from sapo.sampler.seen import SeenGroups
from sapo.sampler.selection import Mix, MixPolicy, SelectionPolicy, pick_external, plan
from sapo.sampler.sender import claimed_sender, sender_of
from sapo.sampler.verifier import Verifier
from sapo.sampler.warm import WarmConfig, WarmStart, needs_warm_start

__all__ = [
    "FRESH_REASONS",
    "HEADER_REASONS",
    "MALFORMED_REASONS",
    "ORIGINS",
    "REASONS",
    "Assembler",
    "Assembly",
    "AssemblyConfig",
    "Discard",
    "Entry",
    "History",
    "HistoryBuilder",
    "Mix",
    "MixPolicy",
    "Origin",
    "Pool",
    "RoundMode",
    "SamplerCore",
    "Scored",
    "Screen",
    "ScreenConfig",
    "SeenGroups",
    "SelectionPolicy",
    "Unread",
    "Verifier",
    "VerifyMode",
    "WarmConfig",
    "WarmStart",
    "arrival_facts",
    "batch_id",
    "build_batch",
    "claimed_sender",
    "header_reason",
    "make_assembler",
    "needs_warm_start",
    "next_sequence_of",
    "parse",
    "pick_external",
    "plan",
    "sender_of",
]
