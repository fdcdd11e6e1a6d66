"""Runs an experiment: every (configuration, seed) of a scenario as a swarm, then the held-out
evaluation, then the report.

Layout of the output directory:

    experiment.json                 the scenario, as run (`Scenario.as_data`)
    commands.json                   every command that ran runs here, in order (the report's
                                    "Reproduce" lines; `--report-only` adds none)
    manifests/<run>.json            every run's swarm manifest; helm/<run>/<node>.yaml for clusters
    baselines/<model>-<key>.json    held-out evaluation of each initial model (per seed, model, limits)
    runs/<run>/                     one swarm run (sapo.swarm.history layout) + result.json
    runs/<run>-services/            a `--confirm` run: the scenario's `confirm` configuration at its
                                    first seed through the Kafka services
    report.md, summary.json, *.png  written from every finished run (`sapo.experiment.analysis`)

A run is finished when its result.json exists; running the same command again skips finished runs and
starts unfinished ones over (the embedded broker keeps no state across starts, so a half run cannot be
resumed), so an interrupted experiment continues where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TextIO

import torch
import yaml
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from sapo.experiment.analysis import RESULT, write_report
from sapo.experiment.evaluate import Evaluation, evaluate, load_final_policy
from sapo.experiment.plan import Scenario, checked_manifest, group_of, run_name
from sapo.models import load_model
from sapo.swarm.helm import node_values
from sapo.swarm.manifest import resolve
from sapo.swarm.run import run_local

Mode = Literal["services", "inprocess"]


@dataclass(frozen=True)
class RunSpec:
    """One run of an experiment: a configuration at a seed, in a mode."""

    config: str
    seed: int
    mode: Mode
    confirmation: bool = False

    @property
    def name(self) -> str:
        return run_name(self.config, self.seed) + ("-services" if self.confirmation else "")


def planned_runs(scenario: Scenario, mode: Mode, *, confirm: bool = False) -> list[RunSpec]:
    """Every configuration x seed in `mode`; with `confirm`, the scenario's `confirm` configuration at
    its first seed through the services instead."""
    if confirm:
        if scenario.confirm is None:
            raise ValueError(f"scenario {scenario.name} names no configuration to confirm (`confirm:`)")
        return [RunSpec(scenario.confirm, scenario.seeds[0], "services", confirmation=True)]
    return [RunSpec(config, seed, mode) for seed in scenario.seeds for config in scenario.configs]


def _evaluate(
    scenario: Scenario, max_new_tokens: int, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> Evaluation:
    plan = scenario.evaluation
    return evaluate(
        model,
        tokenizer,
        plan.profile,
        questions=plan.questions,
        samples=plan.samples,
        max_new_tokens=max_new_tokens,
    )


def baseline(scenario: Scenario, model_ref: str, max_new_tokens: int, out_dir: Path) -> Evaluation:
    """Held-out evaluation of a node's initial model, cached per model, token limit and held-out set
    (nodes of one model share it)."""
    plan = scenario.evaluation
    key = f"{model_ref}|{max_new_tokens}|{plan.profile}|{plan.questions}x{plan.samples}"
    slug = re.sub(r"[^a-zA-Z0-9]+", "-", model_ref).strip("-")[:40]
    path = out_dir / "baselines" / f"{slug}-{hashlib.sha256(key.encode()).hexdigest()[:10]}.json"
    if path.exists():
        return Evaluation(**json.loads(path.read_text()))
    model, tokenizer = load_model(model_ref, dtype=torch.float32)
    result = _evaluate(scenario, max_new_tokens, model, tokenizer)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result.as_dict()))
    return result


def run_one(scenario: Scenario, spec: RunSpec, out_dir: Path, *, keep_checkpoints: bool) -> int:
    """One run: the swarm, then each node's initial and final policy on the held-out set."""
    run_dir = out_dir / "runs" / spec.name
    if run_dir.exists():
        shutil.rmtree(run_dir)  # an unfinished run: start it over
    run_dir.mkdir(parents=True)
    manifest = checked_manifest(scenario, spec.config, spec.seed)
    started = time.monotonic()
    with (run_dir / "swarm.out").open("w") as log:
        code = run_local(manifest, run_dir, in_process=spec.mode == "inprocess", out=log)
    wall = time.monotonic() - started
    if code != 0:
        return code
    started = time.monotonic()
    before: dict[str, object] = {}
    after: dict[str, object] = {}
    versions: dict[str, int] = {}
    mixes: list[str] = []
    for node in manifest.nodes:
        settings = resolve(manifest, node, run_dir / "checkpoints")
        mixes.append(f"{settings.sampler.local_groups}/{settings.sampler.external_groups}")
        model_ref, max_new_tokens = settings.trainer.model, settings.generator.max_new_tokens
        before[node.id] = baseline(scenario, model_ref, max_new_tokens, out_dir).as_dict()
        model, tokenizer, version = load_final_policy(model_ref, run_dir / "checkpoints", node.id)
        after[node.id] = _evaluate(scenario, max_new_tokens, model, tokenizer).as_dict()
        versions[node.id] = version
    result = {
        "config": spec.config,
        "mix": mixes[0],
        "seed": spec.seed,
        "mode": spec.mode,
        "confirmation": spec.confirmation,
        "wall_seconds": wall,
        "eval_seconds": time.monotonic() - started,
        "nodes": [n.id for n in manifest.nodes],
        "groups": {n.id: group_of(n.id) for n in manifest.nodes},
        "final_versions": versions,
        "heldout_before": before,
        "heldout_after": after,
    }
    if not keep_checkpoints:
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    shutil.rmtree(run_dir / "ports", ignore_errors=True)
    (run_dir / RESULT).write_text(json.dumps(result, indent=1))
    return 0


def write_plan(scenario: Scenario, out_dir: Path) -> int:
    """experiment.json plus, per run, its swarm manifest and one Helm values file per node (for
    clusters: `helm install <run>-<node> deploy/k8s/sapo-node -f <your kafka values> -f <node>.yaml`).
    Every run's manifest and settings are checked first. Returns the number of runs."""
    runs = [(config, seed) for seed in scenario.seeds for config in scenario.configs]
    manifests = {run_name(c, s): checked_manifest(scenario, c, s) for c, s in runs}  # fail before writing
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "experiment.json").write_text(json.dumps(scenario.as_data(), indent=1))
    for name, manifest in manifests.items():
        path = out_dir / "manifests" / f"{name}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(manifest.model_dump_json(indent=1, exclude_unset=True))
        helm_dir = out_dir / "helm" / name
        helm_dir.mkdir(parents=True, exist_ok=True)
        for node in manifest.nodes:
            values = node_values(manifest, node) | {"topicPrefix": f"sapo-{name}"}
            (helm_dir / f"{node.id}.yaml").write_text(yaml.safe_dump(values, sort_keys=False))
    return len(manifests)


COMMANDS = "commands.json"


def recorded_commands(out_dir: Path) -> list[str]:
    path = out_dir / COMMANDS
    return list(json.loads(path.read_text())) if path.exists() else []


def record_command(out_dir: Path, command: str) -> None:
    """Remember a command that ran runs in `out_dir`, once, so that the report names every command
    its runs came from (an in-process experiment and its `--confirm` run are two commands)."""
    commands = recorded_commands(out_dir)
    if command and command not in commands:
        (out_dir / COMMANDS).write_text(json.dumps([*commands, command], indent=1))


def report_header(scenario: Scenario, commands: list[str], ran: Sequence[str] = ()) -> str:
    """`ran`: configurations of finished runs; with the scenario's, the header names both (runs of one
    directory may come from several `--configs` invocations)."""
    plan = scenario.evaluation
    configs = [*scenario.configs, *(c for c in ran if c not in scenario.configs)]
    reproduce = "\n".join(f"Reproduce: `{c}`" for c in commands) or "Reproduce: (no command recorded)"
    groups = ", ".join(f"{g.count} x {g.name}" for g in scenario.groups)
    return (
        f"# Experiment `{scenario.name}`\n\n{scenario.description}\n\n"
        f"Nodes: {groups}; configurations: {', '.join(configs)}; seeds: "
        f"{', '.join(map(str, scenario.seeds))}. Held-out: {plan.questions} eval-split questions of "
        f"`{plan.profile}` x {plan.samples} samples at T=1.0, the same for every policy. The scenario as "
        f"run, with every manifest key: `experiment.json`; every run's manifest: `manifests/`.\n\n"
        f"{reproduce}"
    )


def write_scenario_report(scenario: Scenario, out_dir: Path, command: str = "") -> Path:
    """The report from every finished run; its "Reproduce" lines are the recorded commands, or
    `command` where none was recorded (results written before commands were)."""
    commands = recorded_commands(out_dir) or ([command] if command else [])
    ran = [json.loads(p.read_text())["config"] for p in sorted(out_dir.glob(f"runs/*/{RESULT}"))]
    return write_report(
        out_dir,
        report_header(scenario, commands, list(dict.fromkeys(ran))),
        order=scenario.config_names,
        pairs=scenario.comparisons,
        heldout_profile=scenario.evaluation.profile,
    )


def evaluation_mismatch(result: dict[str, Any], scenario: Scenario) -> str:
    """Why a finished run's held-out evaluation is not the scenario's (empty when it is)."""
    plan = scenario.evaluation
    for node, evaluation in result.get("heldout_after", {}).items():
        done = (evaluation.get("questions"), evaluation.get("samples"))
        if done != (plan.questions, plan.samples):
            return (
                f"{node} was evaluated on {done[0]} questions x {done[1]} samples, this command asks for "
                f"{plan.questions} x {plan.samples}"
            )
    return ""


def run_experiment(
    scenario: Scenario,
    out_dir: Path,
    *,
    mode: Mode,
    command: str,
    keep_checkpoints: bool,
    out: TextIO,
    confirm: bool = False,
    recorded_as: Scenario | None = None,
) -> int:
    """Every planned run (skipping finished ones), then the report; returns an exit code.
    `recorded_as` is what experiment.json and the report cover (`sapo.experiment.plan.widened`;
    default `scenario`)."""
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # bars bury the per-run lines
    for name in ("sapo.kafka", "sapo.broker"):  # the swarm's own lines go to each run's swarm.out
        logging.getLogger(name).setLevel(logging.WARNING)
    specs = planned_runs(scenario, mode, confirm=confirm)
    # Before anything is written: every finished run of the directory shares the report (a `--confirm`
    # run is compared with in-process runs it does not plan), so one held-out set for all.
    for finished in sorted(out_dir.glob(f"runs/*/{RESULT}")):
        mismatch = evaluation_mismatch(json.loads(finished.read_text()), scenario)
        if mismatch:
            out.write(
                f"{finished.parent.name}: {mismatch}; use the same --eval-questions/--eval-samples or "
                "another --out\n"
            )
            return 2
    whole = recorded_as or scenario
    write_plan(whole, out_dir)
    started = time.monotonic()
    for spec in specs:
        if (out_dir / "runs" / spec.name / RESULT).exists():
            out.write(f"{spec.name}: finished earlier, skipped\n")
            continue
        out.write(f"{spec.name}: running ({spec.mode}) ...\n")
        out.flush()
        record_command(out_dir, command)
        run_started = time.monotonic()
        code = run_one(scenario, spec, out_dir, keep_checkpoints=keep_checkpoints)
        if code != 0:
            out.write(f"{spec.name}: the swarm exited with {code}; see {out_dir / 'runs' / spec.name}\n")
            return code
        out.write(f"{spec.name}: done in {time.monotonic() - run_started:.0f} s\n")
        out.flush()
    report = write_scenario_report(whole, out_dir, command)
    out.write(f"report: {report} ({time.monotonic() - started:.0f} s this invocation)\n")
    return 0
