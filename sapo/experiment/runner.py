"""Runs an experiment: every (configuration, seed) as a swarm, then the held-out evaluation, then the report.

Layout of the output directory:

    experiment.json                 the profile, as run
    baseline-s<seed>.json           held-out evaluation of the initial model of that seed
    runs/i<I>-j<J>-s<seed>/         one swarm run (sapo.swarm.history layout) + result.json
    report.md, summary.json, *.png  written from every finished run (`sapo.experiment.analysis`)

A run is finished when its result.json exists; running the same command again skips finished runs and
starts unfinished ones over (the embedded broker keeps no state across starts, so a half run cannot be
resumed), so an interrupted experiment continues where it stopped.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Literal, TextIO

import torch
import yaml
from transformers.utils import logging as hf_logging

from sapo.experiment.analysis import RESULT, write_report
from sapo.experiment.evaluate import Evaluation, evaluate, load_final_policy
from sapo.experiment.plan import ExperimentProfile, manifest_data, mix_name, run_name
from sapo.models import load_model
from sapo.swarm.helm import node_values
from sapo.swarm.manifest import parse_manifest, resolve
from sapo.swarm.run import run_local

Mode = Literal["services", "inprocess"]


def _evaluate(profile: ExperimentProfile, model: torch.nn.Module, tokenizer: object) -> Evaluation:
    return evaluate(
        model,  # type: ignore[arg-type]
        tokenizer,  # type: ignore[arg-type]
        profile.task_profile,
        questions=profile.eval_questions,
        samples=profile.eval_samples,
        max_new_tokens=profile.max_new_tokens,
    )


def baseline(profile: ExperimentProfile, seed: int, out_dir: Path) -> Evaluation:
    """Held-out evaluation of the seed's initial model (cached in baseline-s<seed>.json)."""
    path = out_dir / f"baseline-s{seed}.json"
    if path.exists():
        return Evaluation(**json.loads(path.read_text()))
    model, tokenizer = load_model(profile.model.format(seed=seed), dtype=torch.float32)
    result = _evaluate(profile, model, tokenizer)
    path.write_text(json.dumps(result.as_dict(), indent=1))
    return result


def run_one(
    profile: ExperimentProfile,
    mix: tuple[int, int],
    seed: int,
    out_dir: Path,
    *,
    mode: Mode,
    keep_checkpoints: bool,
) -> int:
    """One configuration at one seed: the swarm, then each node's final policy on the held-out set."""
    run_dir = out_dir / "runs" / run_name(mix, seed)
    if run_dir.exists():
        shutil.rmtree(run_dir)  # an unfinished run: start it over
    run_dir.mkdir(parents=True)
    manifest = parse_manifest(manifest_data(profile, mix, seed))
    started = time.monotonic()
    with (run_dir / "swarm.out").open("w") as log:
        code = run_local(manifest, run_dir, in_process=mode == "inprocess", out=log)
    wall = time.monotonic() - started
    if code != 0:
        return code
    before = baseline(profile, seed, out_dir)
    after: dict[str, dict[str, object]] = {}
    versions: dict[str, int] = {}
    for node in manifest.nodes:
        model_ref = resolve(manifest, node, run_dir / "checkpoints").trainer.model
        model, tokenizer, version = load_final_policy(model_ref, run_dir / "checkpoints", node.id)
        after[node.id] = _evaluate(profile, model, tokenizer).as_dict()
        versions[node.id] = version
    result = {
        "mix": mix_name(mix),
        "seed": seed,
        "mode": mode,
        "wall_seconds": wall,
        "nodes": [n.id for n in manifest.nodes],
        "final_versions": versions,
        "heldout_before": before.as_dict(),
        "heldout_after": after,
    }
    if not keep_checkpoints:
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    shutil.rmtree(run_dir / "ports", ignore_errors=True)
    (run_dir / RESULT).write_text(json.dumps(result, indent=1))
    return 0


def write_plan(profile: ExperimentProfile, out_dir: Path) -> None:
    """experiment.json plus, per run, its swarm manifest and one Helm values file per node (for
    clusters: `helm install <run>-<node> deploy/k8s/sapo-node -f <your kafka values> -f <node>.yaml`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "experiment.json").write_text(json.dumps(dataclasses.asdict(profile), indent=1))
    for seed in profile.seeds:
        for mix in profile.mixes:
            name = run_name(mix, seed)
            data = manifest_data(profile, mix, seed)
            manifest = parse_manifest(data)  # fail here, not on the cluster
            path = out_dir / "manifests" / f"{name}.json"
            path.parent.mkdir(exist_ok=True)
            path.write_text(json.dumps(data, indent=1))
            helm_dir = out_dir / "helm" / name
            helm_dir.mkdir(parents=True, exist_ok=True)
            for node in manifest.nodes:
                values = node_values(manifest, node) | {"topicPrefix": f"sapo-{name}"}
                (helm_dir / f"{node.id}.yaml").write_text(yaml.safe_dump(values, sort_keys=False))


def report_header(profile: ExperimentProfile, mode: Mode, command: str) -> str:
    return (
        f"# Experiment `{profile.name}`: I local / J external groups per round\n\n"
        f"{profile.nodes} nodes of `{profile.model}`, `{profile.task_profile}` tasks, "
        f"{profile.questions_per_round} questions x {profile.completions_per_question} completions per "
        f"round, {profile.rounds} lock-step rounds, <= {profile.max_new_tokens} new tokens, GRPO with "
        f"KL 0, lr {profile.learning_rate:g}; held-out: {profile.eval_questions} eval-split questions x "
        f"{profile.eval_samples} samples at T=1.0. Mode: {mode}.\n\n"
        f"Reproduce: `{command}`"
    )


def run_experiment(
    profile: ExperimentProfile,
    out_dir: Path,
    *,
    mode: Mode,
    command: str,
    keep_checkpoints: bool,
    out: TextIO,
) -> int:
    """Every configuration x seed (skipping finished runs), then the report; returns an exit code."""
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # bars bury the per-run lines
    for name in ("sapo.kafka", "sapo.broker"):  # the swarm's own lines go to each run's swarm.out
        logging.getLogger(name).setLevel(logging.WARNING)
    write_plan(profile, out_dir)
    started = time.monotonic()
    for seed in profile.seeds:
        for mix in profile.mixes:
            name = run_name(mix, seed)
            if (out_dir / "runs" / name / RESULT).exists():
                out.write(f"{name}: finished earlier, skipped\n")
                continue
            out.write(f"{name}: running ({mode}) ...\n")
            out.flush()
            run_started = time.monotonic()
            code = run_one(profile, mix, seed, out_dir, mode=mode, keep_checkpoints=keep_checkpoints)
            if code != 0:
                out.write(f"{name}: the swarm exited with {code}; see {out_dir / 'runs' / name}\n")
                return code
            out.write(f"{name}: done in {time.monotonic() - run_started:.0f} s\n")
            out.flush()
    report = write_report(out_dir, report_header(profile, mode, command))
    out.write(f"report: {report} ({time.monotonic() - started:.0f} s this invocation)\n")
    return 0
