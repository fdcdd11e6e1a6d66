"""The in-process swarm: the run a manifest describes, in one process, without Kafka.

Same work as `sapo swarm` (`sapo.swarm.run.run_swarm`), done by the same core functions the services
call, so it serves as the baseline of the pipeline-overhead benchmark and as a quick sweep tool:

- Settings: each node's `GeneratorSettings`, `SamplerSettings` and `TrainerSettings` are built by
  `sapo.swarm.manifest.resolve` from the values the launcher hands the services, exactly as the
  services build theirs (stray `SAPO_<SERVICE>_*` variables of this process act as they would there).
- Per node, one model: `sapo.node.build.build_trainer` loads it, and the sampling backend wraps
  that very model object (no checkpoint round trip), so round r is sampled with the weights of version
  r, which is what lock-step pacing guarantees the generator service.
- Per round r: every node generates round r's work items (`sapo.generator.generate_items`, as the
  trainer would plan them); then every node's
  `SamplerCore` (the sampler service's own) admits its own groups as "local" and the other nodes'
  shared ones (`GeneratorSettings.shares`) as "external", closes round r and builds the
  `TrainingBatch`, which the node's trainer applies (`Trainer.apply`).

Differences from the services, all deliberate:
- Lock-step only (ConfigError otherwise): the streaming modes' behaviour is made of arrival timing.
- Nothing is serialized and no header prefilter runs: the groups never leave the process, so there is
  no signature or schema to check. Arrival order is fixed (local, then peers in manifest order).
- Where a lock-step sampler would wait for a timeout (a peer shared nothing this round, or a local
  group never arrived), nothing more can arrive here, so the sampler's clock is advanced past the
  timeout instead; the progress line says "waited N s" for the time the services would have lost.
- Checkpoints: version 0 at start and each node's final version at the end, in the trainer service's
  `CheckpointStore` layout under `<run_dir>/checkpoints` (the services also write one every
  `checkpoint_every` steps: the generators need them, here nobody does).
- Nodes run one after another on one thread; the services run concurrently on every core.

Late join (`joins`: node id -> round): such a node sits out the rounds before it, then, before its
first round, its sampler warm-starts (`sapo.sampler.warm`, the service's own path) from the swarm's
retained history, every group any node shared so far, and its trainer trains the warm batches. It
joins the round given, not the highest one in the history as the service does: every earlier round
is complete here. Without `SAPO_SAMPLER_WARM_START__ENABLED` it reads no history, and the same plan
gives it one empty batch per missed round: lock-step samples round r with version r, so a late node
must reach that version before it can take part, with or without what the history teaches.

The run record (`sapo.swarm.history`) is the Kafka swarm's: `manifest.json`, `steps/<node>.jsonl` (the
`StepMetrics` a `PolicyUpdate` would announce, `created_at` = wall clock right after the step) and
`rounds/<node>.jsonl`, plus `summary.json` (`sapo.swarm.summary.summarize`).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from sapo.backends import GenerationBackend, TransformersBackend
from sapo.checkpoints import Written
from sapo.generator import Pacing, RoundSource, generate_items, round_items
from sapo.generator.settings import BackendKind, DType
from sapo.identity import Sender
from sapo.lifecycle import StopFlag, install_signal_handlers
from sapo.node.build import build_trainer, round_source
from sapo.sampler import History, Origin, SamplerCore
from sapo.sampler.settings import SamplerSettings
from sapo.settings import ConfigError
from sapo.swarm.history import ROUNDS_DIR, STEPS_DIR, append_row, round_row, step_row
from sapo.swarm.manifest import NodeSettings, NodeSpec, SwarmManifest, resolve
from sapo.swarm.summary import print_summary, summarize
from sapo.tasks import TaskStream
from sapo.trainer import StepReport, Trainer, step_metrics
from sapo.v1 import batch_pb2, rollout_pb2
from sapo.wire import InvalidMessageError, now_timestamp

log = logging.getLogger(__name__)

BackendFactory = Callable[[Trainer], GenerationBackend]
"""Makes a node's sampling backend from its trainer; it must sample with `trainer.model`."""


def shared_backend(trainer: Trainer) -> GenerationBackend:
    """The transformers backend over the trainer's own model object and tokenizer."""
    return TransformersBackend(trainer.model, trainer.builder.tokenizer)


def check_inprocess(node: NodeSpec, s: NodeSettings) -> None:
    """Refuse what one shared fp32 model and lock-step rounds cannot reproduce; say what to set."""
    modes = {"trainer": str(s.trainer.round_mode), "sampler": str(s.sampler.round_mode)}
    if set(modes.values()) != {"lockstep"}:
        raise ConfigError(
            f"node {node.id}: the in-process mode runs lock-step rounds only (round modes {modes}): set "
            "round_mode: lockstep (or leave it unset) and no trainer/sampler round_mode override, or "
            "run `sapo swarm`"
        )
    g, t = s.generator, s.trainer
    problems = []
    if g.backend is not BackendKind.HF:
        problems.append("generator backend: hf (vLLM holds its own copy of the weights)")
    if g.dtype is not DType.FLOAT32:
        problems.append("generator dtype: float32 (the trainer's weights are sampled as they are)")
    if g.device != t.device or g.model != t.model:
        problems.append(f"generator model/device equal to the trainer's ({t.model} on {t.device})")
    if problems:
        raise ConfigError(
            f"node {node.id}: the in-process mode samples with the trainer's own fp32 model; set "
            + "; ".join(problems)
        )


@dataclass(frozen=True)
class NodeRound:
    """What one node did in one round."""

    node_id: str
    groups: list[rollout_pb2.RolloutGroup]
    shared: int
    batch: batch_pb2.TrainingBatch
    report: StepReport
    waited_s: float
    """How long the services' lock-step sampler would have waited on a timeout before this batch."""


class LockstepSampler:
    """One node's sampler without Kafka: the services' `SamplerCore` (fresh history, no handles), fed
    groups directly and closed round by round."""

    def __init__(self, settings: SamplerSettings, history: History | None = None) -> None:
        self.settings = settings
        self.core: SamplerCore[None] = settings.core(history or History())
        self.rejected: Counter[str] = Counter()

    def offer(self, group: rollout_pb2.RolloutGroup, origin: Origin, now_s: float) -> None:
        """Screen and pool one group; rejections are counted by reason."""
        try:  # in one process, every group is handed over by the node that made it
            reason = self.core.admit(group, origin, None, now_s, Sender(group.node_id))
        except InvalidMessageError as exc:  # the service dead-letters it
            reason = exc.reason
        if reason is not None:
            self.rejected[reason] += 1

    def warm_start(
        self, history: list[rollout_pb2.RolloutGroup], join_round: int, now_s: float
    ) -> list[batch_pb2.TrainingBatch]:
        """The warm-start batches up to `join_round` (module docstring: late join); `history` is read
        only with warm start enabled, and its rejections are counted by reason under `warm_`."""
        warm = self.core.warm_start(self.settings.warm_start.config())
        if warm is None:
            raise RuntimeError(f"{self.settings.node_id}: joins late after it trained: nothing to warm-start")
        for group in history if self.settings.warm_start.enabled else []:
            try:
                warm.admit(group, None, now_s, Sender(group.node_id))
            except InvalidMessageError as exc:
                warm.rejected[exc.reason] += 1
        assemblies = warm.plan(self.core.sequence, self.core.history.next_round, join_round)
        self.rejected.update({f"warm_{k}": v for k, v in warm.rejected.items() if v})
        batches = []
        for assembly in assemblies:
            batches.append(self.core.build(assembly, [], now_timestamp()))
            self.core.emitted()
        self.core.joined()
        return batches

    def close_round(self, now_s: float) -> tuple[batch_pb2.TrainingBatch, float]:
        """The next lock-step batch and the timeout wait the service would have had before it."""
        cfg = self.settings
        peers, local = cfg.lockstep_timeout_s, cfg.lockstep_local_timeout_s
        for wait in sorted({0.0, peers, local, local + peers}):
            assembly = self.core.next_batch(now_s + wait)
            if assembly is not None:
                break
        else:
            raise RuntimeError(
                f"{cfg.node_id}: the lock-step sampler closed no round: none of its own groups of the "
                "round arrived; the services would stall here too"
            )
        for discard in self.core.take_discards():
            self.rejected[discard.reason] += 1
        batch = self.core.build(assembly, [], now_timestamp())
        self.core.emitted()
        return batch, wait


class Node:
    """One node's generator, sampler and trainer around one model."""

    def __init__(self, spec: NodeSpec, settings: NodeSettings, make_backend: BackendFactory) -> None:
        self.spec = spec
        self.settings = settings
        self.trainer = build_trainer(settings.trainer)
        self.backend = make_backend(self.trainer)
        self.source: RoundSource = round_source(settings.generator, self.backend.tokenizer)
        self.stream = TaskStream(settings.generator.task_profile(), self.source.node_seed, "train")
        self.pacing: Pacing = settings.trainer.pacing()
        self.sampler = LockstepSampler(settings.sampler)

    @property
    def id(self) -> str:
        return self.spec.id

    def generate(self, round_: int) -> list[rollout_pb2.RolloutGroup]:
        """Round `round_`'s items, as the trainer would plan them, sampled with the current weights."""
        version = self.trainer.version
        per_round = self.settings.trainer.questions_per_round
        items = round_items(self.id, round_, per_round, self.pacing)
        if any(item.fate(version) != "ready" for item in items):
            raise RuntimeError(f"{self.id}: round {round_} with policy v{version} breaks lock-step")
        records = [self.stream.record_at(item.stream_index) for item in items]
        return generate_items(self.backend, records, self.source, items, version).groups

    def shared(self, groups: list[rollout_pb2.RolloutGroup]) -> list[rollout_pb2.RolloutGroup]:
        return [g for g in groups if self.settings.generator.shares(g)]


class InProcessSwarm:
    """The swarm of a manifest in this process; see the module docstring. `run` drives it whole;
    tests call `start`, `run_round` and `finish` to look at each round."""

    def __init__(
        self,
        manifest: SwarmManifest,
        run_dir: Path,
        *,
        make_backend: BackendFactory = shared_backend,
        joins: Mapping[str, int] | None = None,
    ) -> None:
        self.manifest = manifest
        self.joins = dict(joins or {})
        unknown = sorted(set(self.joins) - {n.id for n in manifest.nodes})
        if unknown:
            raise ConfigError(f"late joins name nodes the manifest does not have: {', '.join(unknown)}")
        self.history: list[rollout_pb2.RolloutGroup] = []
        """Every group shared so far: the swarm topic's retained history, for late joiners."""
        self.run_dir = run_dir
        self._make_backend = make_backend
        self.settings = {n.id: resolve(manifest, n, run_dir / "checkpoints") for n in manifest.nodes}
        for node in manifest.nodes:
            check_inprocess(node, self.settings[node.id])
        self.nodes: list[Node] = []

    @property
    def rounds(self) -> int:
        return max(n.rounds for n in self.manifest.nodes)

    def start(self) -> None:
        """Refuse a used run directory, write the manifest, load every model, write version 0."""
        for part in (STEPS_DIR, ROUNDS_DIR, "checkpoints"):
            if any((self.run_dir / part).glob("*")):
                raise ConfigError(f"{self.run_dir / part} holds an earlier run: pick a fresh run directory")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "manifest.json").write_text(self.manifest.model_dump_json(indent=1))
        for spec in self.manifest.nodes:
            node = Node(spec, self.settings[spec.id], self._make_backend)
            node.trainer.initialize()
            self.nodes.append(node)

    def run_round(self, round_: int, stop: StopFlag | None = None) -> list[NodeRound]:
        """Every node generates round `round_`, then every node trains its batch of that round.
        Nodes past their own round limit sit the round out. Stops between units once `stop` is set."""
        active = [n for n in self.nodes if not n.pacing.finished(round_) and self._joined(n, round_)]
        for node in active:
            if self.joins.get(node.id, 0) == round_ > 0:
                self._warm_start(node, round_)
        generated: dict[str, list[rollout_pb2.RolloutGroup]] = {}
        shared: dict[str, list[rollout_pb2.RolloutGroup]] = {}
        for node in active:
            if stop is not None and stop.is_set():
                return []
            generated[node.id] = groups = node.generate(round_)
            shared[node.id] = node.shared(groups)
            append_row(self.run_dir / ROUNDS_DIR / f"{node.id}.jsonl", round_row(groups))
        for node in active if self.joins else []:  # kept only when someone will read it
            self.history.extend(shared[node.id])
        done: list[NodeRound] = []
        for node in active:
            if stop is not None and stop.is_set():
                break
            done.append(self._train(node, generated, shared))
        return done

    def _train(
        self,
        node: Node,
        generated: dict[str, list[rollout_pb2.RolloutGroup]],
        shared: dict[str, list[rollout_pb2.RolloutGroup]],
    ) -> NodeRound:
        sampler = node.sampler
        for group in generated[node.id]:
            sampler.offer(group, "local", time.time())
        for peer, groups in shared.items():
            if peer != node.id:
                for group in groups:
                    sampler.offer(group, "external", time.time())
        batch, waited = sampler.close_round(time.time())
        if waited:
            log.warning("%s: the services' lock-step sampler would wait %.0f s here", node.id, waited)
        report = self._apply(node, batch)
        own = generated[node.id]
        return NodeRound(node.id, own, len(shared[node.id]), batch, report, waited)

    def _joined(self, node: Node, round_: int) -> bool:
        return self.joins.get(node.id, 0) <= round_

    def _warm_start(self, node: Node, round_: int) -> None:
        """A late joiner trains on the history before its first round (module docstring)."""
        batches = node.sampler.warm_start(self.history, round_, time.time())
        for batch in batches:
            self._apply(node, batch)
        groups = sum(len(b.groups) for b in batches)
        log.info(
            "%s joins at round %d after %d warm-start batches (%d groups)",
            node.id,
            round_,
            len(batches),
            groups,
        )

    def _apply(self, node: Node, batch: batch_pb2.TrainingBatch) -> StepReport:
        """One training step of `node`, recorded as the trainer service announces it."""
        report = node.trainer.apply(batch)
        row = step_row(node.id, report.version, report.batch_id, step_metrics(report), time.time())
        append_row(self.run_dir / STEPS_DIR / f"{node.id}.jsonl", row)
        return report

    def finish(self) -> list[Written]:
        """Write each node's current version as its final checkpoint (version 0 is already there)."""
        return [n.trainer.checkpoint() for n in self.nodes if n.trainer.version > 0]

    def run(self, out: TextIO = sys.stdout, stop: StopFlag | None = None) -> int:
        """Run every round, write the final checkpoints, print a summary; 130 when `stop` was set or
        on KeyboardInterrupt (then a step cut short may leave its weights half-updated: `run_inprocess`
        turns Ctrl-C into `stop`, honoured between steps). Errors propagate with no final checkpoint."""
        code = 0
        try:
            self.start()
            for round_ in range(self.rounds):
                started = time.perf_counter()
                done = self.run_round(round_, stop)
                out.write(progress_line(round_, self.rounds, done, time.perf_counter() - started) + "\n")
                out.flush()
                if stop is not None and stop.is_set():
                    out.write(f"\nstopping ({stop.reason})\n")
                    code = 130
                    break
        except KeyboardInterrupt:
            out.write("\ninterrupted\n")
            code = 130
        self.finish()
        print_summary(summarize(self.manifest, self.run_dir), out)
        for node in self.nodes:
            counts = ", ".join(f"{k} {v}" for k, v in sorted(node.sampler.rejected.items())) or "none"
            out.write(f"{node.id} sampler rejections: {counts}\n")
        return code


def progress_line(round_: int, rounds: int, done: list[NodeRound], seconds: float) -> str:
    """`round 3/10 (4.1 s): node-a 0.250 4+4, ...`: the on-policy reward of each node's own round and
    the local+external groups of its batch."""
    parts = []
    for r in done:
        mean = round_row(r.groups)["reward_mean"]
        sources = Counter(bg.source for bg in r.batch.groups)
        mix = f"{sources[batch_pb2.GROUP_SOURCE_LOCAL]}+{sources[batch_pb2.GROUP_SOURCE_EXTERNAL]}"
        waited = f" (waited {r.waited_s:.0f} s)" if r.waited_s else ""
        parts.append(f"{r.node_id} {mean:.3f} {mix}{waited}")
    return f"round {round_ + 1}/{rounds} ({seconds:.1f} s): " + ", ".join(parts)


@contextlib.contextmanager
def _stop_on_signals(stop: StopFlag) -> Iterator[None]:
    """SIGINT / SIGTERM set `stop` (a second one exits at once) while the block runs, in the main
    thread only; the previous handlers come back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    install_signal_handlers(stop)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_inprocess(manifest: SwarmManifest, run_dir: Path, out: TextIO = sys.stdout) -> int:
    """Run the manifest's swarm in this process (lock-step only); 0 when done, 130 when stopped by
    SIGINT / SIGTERM (after the current step, with the record and final checkpoints written)."""
    stop = StopFlag()
    with _stop_on_signals(stop):
        return InProcessSwarm(manifest, run_dir).run(out, stop)
