"""The training core: updates move log-probs the right way, empty batches, exact resume, pi_old modes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from sapo.checkpoints import CheckpointError, CheckpointStore
from sapo.trainer import (
    MicroBatch,
    Row,
    RowMode,
    SequenceBuilder,
    StepStats,
    Trainer,
    lr_factor,
    plan_micro_batches,
    step_metrics,
    train_on_batch,
)
from sapo.v1 import batch_pb2, question_pb2
from tests.unit.trainer import builders as b

pytestmark = pytest.mark.unit


def _trainer(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    root: Path,
    *,
    lr: float = 1e-2,
    warmup_steps: int = 2,
    steps_per_batch: int = 1,
    eps: float = 1e-8,
    **options: Any,
) -> Trainer:
    return Trainer(
        model,
        tokenizer,
        model_ref="tiny:0",
        node_id="node-a",
        store=CheckpointStore(root),
        optim=b.optim_config(lr=lr, warmup_steps=warmup_steps, eps=eps),
        step=b.step_config(steps_per_batch=steps_per_batch),
        max_sequence_tokens=512,
        **options,
    )


def _batches(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, questions: list[question_pb2.Question]
) -> list[batch_pb2.TrainingBatch]:
    """Two batches of one local and one external group, sampled from version 0."""
    batches = []
    for seq in range(2):
        q_local, q_ext = questions[seq], questions[2]
        local = b.local_group(model, tokenizer, q_local, [*b.answers(q_local), b.answers(q_local)[0]])
        external = b.external_group(q_ext, list(b.answers(q_ext)))
        groups = [b.batch_group(local, [1.0, 0.0, 1.0]), b.batch_group(external, [1.0, 0.0], b.EXTERNAL)]
        batches.append(b.training_batch(seq, groups))
    return batches


def _mean_logprob(model: PreTrainedModel, group: batch_pb2.BatchGroup, index: int) -> float:
    completion = group.group.completions[index]
    lp = b.score(model, list(group.group.prompt_token_ids), [list(completion.token_ids)])[0]
    return sum(lp) / len(lp)


def test_a_step_raises_rewarded_and_lowers_penalised_completions(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    questions: list[question_pb2.Question],
    tmp_path: Path,
) -> None:
    batch = _batches(model, tokenizer, questions)[0]
    group = batch.groups[0]
    before = [_mean_logprob(model, group, i) for i in range(2)]
    trainer = _trainer(model, tokenizer, tmp_path)

    report = trainer.apply(batch)

    after = [_mean_logprob(model, group, i) for i in range(2)]
    assert after[0] > before[0]
    assert after[1] < before[1]
    assert report.version == trainer.version == 1
    assert report.stats is not None and report.stats.optimizer_steps == 1
    # Fresh local rows start at ratio 1 (pi_old = the sampler's log-probs of these very weights).
    assert report.stats.metrics.clip_fraction_low == report.stats.metrics.clip_fraction_high == 0.0
    assert report.stats.metrics.is_tokens == 0
    assert report.lr == pytest.approx(1e-2)  # warmup: 1/2 of the rate for step 1, the full rate next


def test_empty_batch_advances_the_version_without_an_update(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    trainer = _trainer(model, tokenizer, tmp_path)
    weights = {k: v.clone() for k, v in model.state_dict().items()}

    report = trainer.apply(b.training_batch(0, []))

    assert report.stats is None and report.version == 1
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    assert trainer.optimizer.state_dict()["state"] == {}
    assert trainer.scheduler.last_epoch == 0  # the schedule counts optimizer steps only
    assert [(e.version, e.batch_id, e.optimizer_steps) for e in trainer.state.ledger] == [(1, "node-a/0", 0)]


def test_a_batch_with_token_ids_outside_the_vocabulary_trains_what_is_valid(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    questions: list[question_pb2.Question],
    tmp_path: Path,
) -> None:
    """Ids off the wire index the embedding: a peer's or a broken sampler's out-of-range id is a
    rejected row, not a step that raises (and a trainer that restarts into it until quarantine)."""
    batch = _batches(model, tokenizer, questions)[0]
    local = batch.groups[0].group
    local.completions[0].token_ids[-1] = model.config.vocab_size
    trainer = _trainer(model, tokenizer, tmp_path)

    report = trainer.apply(batch)

    assert report.version == 1
    assert report.built.skipped == {"bad_token_id": 1}
    assert len(report.built.rows) == 4  # the other two local completions and both external ones


def test_resume_from_a_checkpoint_continues_exactly(
    tokenizer: PreTrainedTokenizerBase, questions: list[question_pb2.Question], tmp_path: Path
) -> None:
    batches = _batches(b.tiny(tokenizer, 0), tokenizer, questions)

    straight = _trainer(b.tiny(tokenizer, 0), tokenizer, tmp_path / "a")
    straight.apply(batches[0])
    straight.apply(batches[1])

    first = _trainer(b.tiny(tokenizer, 0), tokenizer, tmp_path / "b")
    first.apply(batches[0])
    first.note_offset(("batches", 0), 1)
    rng = torch.get_rng_state()
    first.checkpoint()
    torch.rand(3)  # RNG consumed after the checkpoint must not leak into the resumed run
    resumed = _trainer(b.tiny(tokenizer, 9), tokenizer, tmp_path / "b")
    assert resumed.restore() is not None
    assert torch.equal(torch.get_rng_state(), rng)
    assert resumed.version == 1 and resumed.state.offsets == {("batches", 0): 1}
    assert resumed.is_duplicate(batches[0]) and not resumed.is_duplicate(batches[1])
    resumed.apply(batches[1])

    for (name, a), (_, b_) in zip(
        straight.model.state_dict().items(), resumed.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b_), name
    sa, sb = straight.optimizer.state_dict(), resumed.optimizer.state_dict()
    for key, state in sa["state"].items():
        assert all(torch.equal(v, sb["state"][key][k]) for k, v in state.items())
    assert straight.lr == resumed.lr
    assert [e.batch_id for e in resumed.state.ledger] == ["node-a/0", "node-a/1"]


def test_a_replayed_version_is_verified_and_a_divergent_replay_keeps_the_stored_weights(
    tokenizer: PreTrainedTokenizerBase, questions: list[question_pb2.Question], tmp_path: Path
) -> None:
    batch = _batches(b.tiny(tokenizer, 0), tokenizer, questions)[0]
    first = _trainer(b.tiny(tokenizer, 0), tokenizer, tmp_path)
    first.initialize()  # version 0 with a full state
    first.apply(batch)
    assert first.publish().outcome == "written"  # version 1, weights only
    stored = {k: v.clone() for k, v in first.model.state_dict().items()}

    replay = _trainer(b.tiny(tokenizer, 9), tokenizer, tmp_path)
    replay.initialize()  # resumes from version 0's state, as after a crash
    replay.apply(batch)
    assert replay.publish().outcome == "verified"  # deterministic: the same bytes, nothing rewritten

    drifted = _trainer(b.tiny(tokenizer, 9), tokenizer, tmp_path)
    drifted.initialize()
    drifted.apply(batch)
    with torch.no_grad():
        next(drifted.model.parameters()).add_(1e-3)  # what a non-deterministic kernel could leave
    assert drifted.publish().outcome == "diverged"
    assert all(torch.equal(stored[k], v) for k, v in drifted.model.state_dict().items())


def test_restore_refuses_checkpoints_of_another_base_model(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    _trainer(model, tokenizer, tmp_path).checkpoint()
    other = _trainer(model, tokenizer, tmp_path)
    other.model_ref = "tiny:1"
    with pytest.raises(CheckpointError, match="set the model to 'tiny:0'"):
        other.restore()


def _sgd_step(
    tokenizer: PreTrainedTokenizerBase, rows: list[Row], budget: int, *, share_prompts: bool
) -> tuple[list[MicroBatch], StepStats, list[torch.Tensor]]:
    """One step of plain SGD with lr 1 on a fresh `tiny:0`: the weight change equals the gradient (Adam
    would amplify float noise in near-zero gradients of rare-token embeddings)."""
    model = b.tiny(tokenizer, 0)
    before = [p.detach().clone() for p in model.parameters()]
    sgd = torch.optim.SGD(model.parameters(), lr=1.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(sgd, lambda step: 1.0)
    micro = plan_micro_batches(rows, pad_token_id=0, max_tokens=budget, share_prompts=share_prompts)
    stats = train_on_batch(model, sgd, schedule, micro, b.step_config(max_grad_norm=0))
    return micro, stats, [b_ - p.detach() for b_, p in zip(before, model.parameters(), strict=True)]


def _assert_same_step(
    first: tuple[StepStats, list[torch.Tensor]], second: tuple[StepStats, list[torch.Tensor]]
) -> None:
    (stats, deltas), (other, other_deltas) = first, second
    assert other.metrics.loss == pytest.approx(stats.metrics.loss, abs=1e-6)
    assert other.metrics.entropy_mean == pytest.approx(stats.metrics.entropy_mean, rel=1e-5)
    assert other.grad_norm == pytest.approx(stats.grad_norm, rel=1e-5)
    for g, h in zip(deltas, other_deltas, strict=True):
        torch.testing.assert_close(g, h, atol=1e-6, rtol=1e-4)


def test_micro_batches_accumulate_exactly_the_whole_batch_gradient(
    tokenizer: PreTrainedTokenizerBase, questions: list[question_pb2.Question]
) -> None:
    """Loss normalized by the whole batch's tokens: any token budget gives the same gradient."""
    batch = _batches(b.tiny(tokenizer, 0), tokenizer, questions)[0]
    rows = SequenceBuilder(tokenizer, max_sequence_tokens=512).build(batch, 0).rows[:3]  # the local group
    whole, whole_stats, whole_deltas = _sgd_step(tokenizer, rows, 4096, share_prompts=False)
    split, split_stats, split_deltas = _sgd_step(tokenizer, rows, 200, share_prompts=False)
    assert len(split) > len(whole)
    _assert_same_step((whole_stats, whole_deltas), (split_stats, split_deltas))


@pytest.mark.parametrize("budget", [4096, 100])
def test_sharing_prompts_gives_the_same_step(
    tokenizer: PreTrainedTokenizerBase, questions: list[question_pb2.Question], budget: int
) -> None:
    """A local group (as sampled) and an external one (re-rendered by our template) each share their
    prompt; a budget below a whole group cuts it into runs that each compute the prompt."""
    batch = _batches(b.tiny(tokenizer, 0), tokenizer, questions)[0]
    rows = SequenceBuilder(tokenizer, max_sequence_tokens=512).build(batch, 0).rows
    assert len({tuple(r.sample.prompt_ids) for r in rows}) == 2
    _, whole_stats, whole_deltas = _sgd_step(tokenizer, rows, budget, share_prompts=False)
    shared, shared_stats, shared_deltas = _sgd_step(tokenizer, rows, budget, share_prompts=True)
    assert any(mb.shared_prompt for mb in shared)
    if budget == 4096:
        assert [mb.packed.num_rows for mb in shared] == [3, 2]  # one micro-batch per group
    _assert_same_step((whole_stats, whole_deltas), (shared_stats, shared_deltas))


def test_gradient_checkpointing_gives_the_same_update(
    tokenizer: PreTrainedTokenizerBase, questions: list[question_pb2.Question], tmp_path: Path
) -> None:
    """Checkpointing scores every row whole, the default shares prompts: gradients agree to float
    rounding. AdamW's first step is lr * g / (|g| + eps), so a gradient element near its default eps
    (1e-8: a rare token's output-embedding row) would turn that rounding into an lr-sized difference;
    a larger eps keeps the comparison about the gradient."""
    group = b.local_group(b.tiny(tokenizer), tokenizer, questions[0], list(b.answers(questions[0])))
    batch = b.training_batch(0, [b.batch_group(group, [1.0, 0.0])])
    trainers = [
        _trainer(
            b.tiny(tokenizer),
            tokenizer,
            tmp_path / str(checkpointing),
            warmup_steps=0,
            eps=1e-4,
            gradient_checkpointing=checkpointing,
        )
        for checkpointing in (False, True)
    ]
    reports = [t.apply(batch) for t in trainers]
    assert reports[1].stats is not None and reports[0].stats is not None
    assert reports[1].stats.grad_norm == pytest.approx(reports[0].stats.grad_norm, rel=1e-5)
    assert not any(m.training for m in trainers[1].model.modules())  # eval mode again between steps
    for x, y in zip(trainers[0].model.parameters(), trainers[1].model.parameters(), strict=True):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=1e-5)


def test_steps_per_batch_keeps_pi_old_fixed_so_clipping_engages(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    questions: list[question_pb2.Question],
    tmp_path: Path,
) -> None:
    batch = _batches(model, tokenizer, questions)[0]
    trainer = _trainer(model, tokenizer, tmp_path, lr=5e-2, steps_per_batch=2)
    report = trainer.apply(batch)
    assert report.stats is not None and report.stats.optimizer_steps == 2
    m = report.stats.metrics
    assert m.clip_fraction_low + m.clip_fraction_high > 0
    assert trainer.scheduler.last_epoch == 2
    assert trainer.version == 1  # one batch, one version


def test_stale_local_rows_get_truncated_importance_weights(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    questions: list[question_pb2.Question],
    tmp_path: Path,
) -> None:
    first, second = _batches(model, tokenizer, questions)  # both sampled from version 0
    trainer = _trainer(model, tokenizer, tmp_path)
    trainer.apply(first)
    report = trainer.apply(second)  # the weights moved: staleness 1
    assert report.built.staleness == [1]
    assert report.stats is not None
    m = report.stats.metrics
    local_tokens = sum(len(c.token_ids) for c in second.groups[0].group.completions)
    assert m.is_tokens == local_tokens
    assert m.is_ratio_mean != pytest.approx(1.0, abs=1e-6)
    assert {r.mode for r in report.built.rows if r.local} == {RowMode.CORRECTED}


def test_learning_rate_schedule_warms_up_then_holds_or_decays() -> None:
    constant = b.optim_config(lr=1.0, warmup_steps=4)
    assert [lr_factor(s, constant) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    cosine = b.optim_config(lr=1.0, warmup_steps=2, schedule="cosine", total_steps=6, min_lr_ratio=0.1)
    factors = [lr_factor(s, cosine) for s in range(8)]
    assert factors[:3] == pytest.approx([0.5, 1.0, 1.0])
    assert factors[4] == pytest.approx(0.55)
    assert factors[6:] == pytest.approx([0.1, 0.1])


def test_the_senders_temperature_does_not_change_what_the_receiver_trains(
    tokenizer: PreTrainedTokenizerBase, questions: list[question_pb2.Question], tmp_path: Path
) -> None:
    """A peer's text is trained as our policy samples (at our temperature, 0.8 here): the same text sent
    by a peer sampling at 0.3 or at 0.8 makes the same update."""
    updated = []
    for sender in (0.3, 0.8):
        group = b.external_group(questions[0], list(b.answers(questions[0])), temperature=sender)
        batch = b.training_batch(0, [b.batch_group(group, [1.0, 0.0], b.EXTERNAL)])
        trainer = _trainer(
            b.tiny(tokenizer), tokenizer, tmp_path / str(sender), warmup_steps=0, sampling_temperature=0.8
        )
        report = trainer.apply(batch)
        assert report.stats is not None and report.stats.optimizer_steps == 1
        updated.append(list(trainer.model.parameters()))
    for x, y in zip(*updated, strict=True):
        torch.testing.assert_close(x, y, atol=0, rtol=0)


def test_step_metrics_say_how_many_local_and_external_completions_were_trained(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    questions: list[question_pb2.Question],
    tmp_path: Path,
) -> None:
    """The run record derives the external groups' mean reward from these counts (reference metric)."""
    batch = _batches(model, tokenizer, questions)[0]  # local rewards 1, 0, 1; external 1, 0
    batch.intake.add(node_id="node-peer", received=3, used=1, rejected={"no_signal": 2})
    report = _trainer(model, tokenizer, tmp_path).apply(batch)
    metrics = step_metrics(report)
    assert list(metrics.intake) == list(batch.intake)  # the sampler's account, passed on
    assert metrics.step_seconds == report.seconds > 0
    assert metrics.step_cpu_seconds == report.cpu_seconds > 0  # a real step takes this process's CPU
    assert (metrics.local_completions, metrics.external_completions) == (3, 2)
    assert metrics.reward_mean == pytest.approx(3 / 5)
    assert metrics.local_reward_mean == pytest.approx(2 / 3)
    # Contribution accounting: the node's own groups under its id, the peer's under the peer's.
    by_node = {c.node_id: c for c in metrics.contributions}
    assert set(by_node) == {"node-a", "node-peer"}
    assert (by_node["node-a"].groups, by_node["node-a"].completions) == (1, 3)
    assert (by_node["node-peer"].groups, by_node["node-peer"].completions) == (1, 2)
    assert sum(c.completion_tokens for c in metrics.contributions) == metrics.completion_tokens
    for contribution, group in zip(("node-a", "node-peer"), batch.groups, strict=True):
        mass = sum(abs(a) for a in group.advantages)
        assert by_node[contribution].advantage_mass == pytest.approx(mass)
