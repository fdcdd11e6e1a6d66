"""What an experiment runs: a scenario (a YAML file of manifest keys) x its configurations x seeds.

A scenario is data, not code: every value in it is a swarm-manifest key (`sapo.swarm.manifest.NodeSpec`:
model, profile, local_groups, learning_rate, ..., and the raw `generator` / `sampler` / `trainer`
settings), so a setting's default and bounds live only where the setting is declared; a scenario says
only what it changes. The shipped scenarios are `sapo/experiment/scenarios/*.yaml`; `--scenario` also
takes the path of a file of your own.

    name: homogeneous                 # run directories and manifest names derive from it
    description: what it asks         # one paragraph, copied into the report
    seeds: [0, 1, 2]                  # `{seed}` in any string value is replaced by the seed
    evaluation: {profile: easy, questions: 256, samples: 4}   # held-out set, the same for every node
    defaults: {model: "warm:{seed}", profile: easy, rounds: 60, learning_rate: 1.0e-3}  # every node
    nodes:                            # node groups: ids <name>-1 .. <name>-<count>, own manifest keys
      - {name: strong, count: 2}
      - {name: weak, count: 2, model: "warm-bpe:{seed}:64x2:100"}
    configs:                          # what is compared: manifest keys applied to every node
      8/0: {}                         # a name I/J sets local_groups / external_groups unless the body does
      4/4: {}
      4/4-guided: {local_groups: 4, external_groups: 4, sampler: {selection: reward_guided}}
    baseline: 8/0                     # what the others are paired with (default: the first config)
    comparisons: ["4/4 vs 8/0"]       # optional; default: every other config vs the baseline
    confirm: 4/4                      # the configuration to confirm through the Kafka services

Keys apply in order: defaults, then the node group's keys, then the configuration's, then command-line
overrides (`--set key=value`, `--rounds`, `--model`); `generator` / `sampler` / `trainer` mappings merge
key by key. Every run is checked at plan time: its manifest parses and every node's three service
settings load, so a typo fails before the first run, saying what to set.

All configurations of one seed share the initial weights and every node's question stream and
sampling seed (`node_seed`), so they differ only in what the configuration changes: round 1 is the
same in all of them, and the comparison is paired. The experiment seed changes the initial model (for
`{seed}` refs), every node's streams and the samplers' choices.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sapo.experiment.shipped import SCENARIO_DIR, scenario_names
from sapo.sampler.assembler import RoundMode
from sapo.sampler.settings import SamplerSettings
from sapo.settings import ConfigError, field_bounds
from sapo.swarm.manifest import NodeSpec, SwarmManifest, parse_manifest, service_values

SERVICE_KEYS = ("generator", "sampler", "trainer")
_MIX = re.compile(r"^(\d+)/(\d+)$")
_CONFIG_NAME = r"^[a-z0-9][a-z0-9/_-]{0,31}$"
_GROUP_NAME = r"^[a-z][a-z0-9]{0,15}$"
M = TypeVar("M", bound=BaseModel)


class Evaluation(BaseModel):
    """The held-out set: the first `questions` eval-split questions of `profile`, `samples` each."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    profile: str = Field(..., min_length=1, description="Task profile of the held-out questions.")
    questions: int = Field(..., ge=1, le=100_000, description="Eval-split questions.")
    samples: int = Field(..., ge=1, le=256, description="Completions per question (temperature 1).")


class NodeGroup(BaseModel):
    """`count` nodes that share manifest keys (`keys`: everything but name and count)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    name: str = Field("node", pattern=_GROUP_NAME, description="Node ids are <name>-1 .. <name>-<count>.")
    count: int = Field(..., ge=1, le=1000, description="Nodes in the group.")

    @property
    def keys(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class ScenarioFile(BaseModel):
    """A scenario as written (see the module docstring); `Scenario` is what runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(..., pattern=r"^[a-z0-9][a-z0-9-]{0,23}$")
    description: str = Field(..., min_length=1)
    seeds: tuple[int, ...] = Field(..., min_length=1)
    evaluation: Evaluation
    defaults: dict[str, Any] = Field(default_factory=dict)
    nodes: tuple[NodeGroup, ...] = Field(..., min_length=1)
    configs: dict[str, dict[str, Any]] = Field(..., min_length=1)
    baseline: str | None = None
    comparisons: tuple[str, ...] | None = None
    confirm: str | None = None

    @model_validator(mode="after")
    def _check_names(self) -> ScenarioFile:
        bad = [c for c in self.configs if not re.match(_CONFIG_NAME, c)]
        if bad:
            raise ValueError(f"configuration name {bad[0]!r}: use lowercase letters, digits, '/', '_', '-'")
        groups = [g.name for g in self.nodes]
        if len(set(groups)) != len(groups):
            raise ValueError(f"node group names must be unique; got {groups}")
        for name in (self.baseline, self.confirm):
            if name is not None and name not in self.configs:
                raise ValueError(f"{name!r} is not one of the configurations {list(self.configs)}")
        for comparison in self.comparisons or ():
            parse_comparison(comparison, self.configs)
        return self


@dataclass(frozen=True)
class Scenario:
    """A loaded scenario with command-line selections applied; see the module docstring."""

    name: str
    description: str
    seeds: tuple[int, ...]
    evaluation: Evaluation
    defaults: Mapping[str, Any]
    groups: tuple[NodeGroup, ...]
    configs: Mapping[str, Mapping[str, Any]]
    baseline: str
    comparisons: tuple[tuple[str, str], ...]
    confirm: str | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""

    @property
    def config_names(self) -> tuple[str, ...]:
        return tuple(self.configs)

    def as_data(self) -> dict[str, Any]:
        """What experiment.json records: the scenario as run, overrides included."""
        return {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "seeds": list(self.seeds),
            "evaluation": self.evaluation.model_dump(),
            "defaults": dict(self.defaults),
            "nodes": [g.model_dump() for g in self.groups],
            "configs": {k: dict(v) for k, v in self.configs.items()},
            "baseline": self.baseline,
            "comparisons": [f"{a} vs {b}" for a, b in self.comparisons],
            "confirm": self.confirm,
            "overrides": dict(self.overrides),
        }


def parse_mix(text: str) -> tuple[int, int] | None:
    """'6/2' -> (6, 2); None for a name that is not I/J."""
    found = _MIX.match(text.strip())
    return (int(found[1]), int(found[2])) if found else None


def parse_comparison(text: str, configs: Mapping[str, object]) -> tuple[str, str]:
    """'4/4 vs 8/0' -> ('4/4', '8/0'), both configurations of the scenario."""
    parts = [p.strip() for p in text.split(" vs ")]
    if len(parts) != 2 or not all(p in configs for p in parts):
        raise ValueError(f"comparison {text!r}: write '<config> vs <config>' with names from {list(configs)}")
    return parts[0], parts[1]


def _read(name_or_path: str) -> tuple[dict[str, Any], str]:
    path = SCENARIO_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        path = Path(name_or_path)
    if not path.is_file():
        raise ConfigError(
            f"scenario {name_or_path!r} is neither a shipped scenario ({', '.join(scenario_names())}) "
            "nor a file"
        )
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read scenario {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"scenario {path}: expected a mapping (see sapo.experiment.plan)")
    if path.parent == SCENARIO_DIR:  # recorded as the package path, not where this checkout lives
        return data, str(path.relative_to(SCENARIO_DIR.parents[2]))
    return data, str(path)


def load_scenario(name_or_path: str) -> Scenario:
    """A shipped scenario by name, or a scenario file by path; errors name the key to fix."""
    data, source = _read(name_or_path)
    return scenario_from_data(data, source)


def recorded_scenario(path: Path) -> Scenario | None:
    """The scenario an experiment directory's experiment.json records (`Scenario.as_data`, overrides
    applied), or None for a directory written before scenarios existed."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:  # not JSON, not UTF-8 text, unreadable
        data = exc
    if not isinstance(data, dict):
        why = f" ({data})" if isinstance(data, Exception) else ""
        raise ConfigError(
            f"{path} is not the record `sapo experiment` writes{why}: repair or remove it, or give a "
            "new --out"
        )
    if "configs" not in data:
        return None
    overrides = data.pop("overrides", {})
    source = data.pop("source", str(path))
    return replace(scenario_from_data(data, source), overrides=overrides)


def scenario_from_data(data: dict[str, Any], source: str) -> Scenario:
    """Validate a scenario mapping (as read from a file) and resolve its baseline and comparisons."""
    try:
        parsed = ScenarioFile(**data)
    except ValidationError as exc:
        lines = [f"invalid scenario {source}:"]
        lines += [f"  {'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise ConfigError("\n".join(lines)) from None
    names = list(parsed.configs)
    baseline = parsed.baseline or names[0]
    comparisons = (
        tuple(parse_comparison(c, parsed.configs) for c in parsed.comparisons)
        if parsed.comparisons is not None
        else tuple((name, baseline) for name in names if name != baseline)
    )
    return Scenario(
        name=parsed.name,
        description=" ".join(parsed.description.split()),
        seeds=parsed.seeds,
        evaluation=parsed.evaluation,
        defaults=parsed.defaults,
        groups=parsed.nodes,
        configs={name: _config_keys(name, body) for name, body in parsed.configs.items()},
        baseline=baseline,
        comparisons=comparisons,
        confirm=parsed.confirm,
        source=source,
    )


def _config_keys(name: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """A configuration's manifest keys; a name I/J sets the mix unless the body does."""
    keys = dict(body)
    mix = parse_mix(name)
    if mix is not None and "local_groups" not in keys and "external_groups" not in keys:
        keys |= {"local_groups": mix[0], "external_groups": mix[1]}
    return keys


def parse_assignment(text: str) -> tuple[str, Any]:
    """'sampler.selection=reward_guided' -> ('sampler.selection', 'reward_guided'); values are YAML."""
    key, eq, value = text.partition("=")
    if not eq or not key.strip():
        raise ConfigError(f"--set {text!r}: write KEY=VALUE, e.g. rounds=3 or sampler.selection=uniform")
    return key.strip(), yaml.safe_load(value)


def select(
    scenario: Scenario,
    *,
    configs: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    overrides: Mapping[str, Any] | None = None,
    nodes: int | None = None,
    evaluation: Mapping[str, int] | None = None,
) -> Scenario:
    """The scenario with command-line selections applied. `configs` picks configurations by name (an
    I/J not in the scenario is added: the mix alone); `overrides` are manifest keys for every node
    ('sampler.x' for a service setting); `nodes` resizes a one-group scenario."""
    chosen = dict(scenario.configs)
    if configs:
        chosen = {c: scenario.configs.get(c) or _ad_hoc(c, scenario) for c in configs}
    baseline = scenario.baseline if scenario.baseline in chosen else next(iter(chosen))
    comparisons = tuple((a, b) for a, b in scenario.comparisons if a in chosen and b in chosen)
    if configs:  # pairs of what was picked: the scenario's own, else each one against the baseline
        comparisons = comparisons or tuple((c, baseline) for c in chosen if c != baseline)
    groups = scenario.groups
    if nodes is not None:
        if len(groups) != 1:
            raise ConfigError(f"--nodes resizes one-group scenarios only; {scenario.name} has node groups")
        groups = (_updated(groups[0], {"count": nodes}, {"count": "--nodes"}),)
    merged = dict(scenario.overrides)
    for key, value in (overrides or {}).items():
        merged[key] = value
    result = replace(
        scenario,
        configs=chosen,
        seeds=tuple(seeds) if seeds else scenario.seeds,
        baseline=baseline,
        comparisons=comparisons,
        groups=groups,
        overrides=merged,
        evaluation=_updated(scenario.evaluation, evaluation or {}, _EVALUATION_FLAGS),
        confirm=scenario.confirm if scenario.confirm in chosen else None,
    )
    if sum(g.count for g in result.groups) < 2:
        raise ConfigError("an experiment needs at least 2 nodes (4 or more: one node's swarm is itself)")
    for name in chosen.keys() - scenario.configs.keys():
        _check_mix(result, name)
    return result


_EVALUATION_FLAGS = {"questions": "--eval-questions", "samples": "--eval-samples"}


def _updated(model: M, update: Mapping[str, Any], flags: Mapping[str, str]) -> M:
    """`model` with `update` applied and validated again (its bounds hold for command-line values too);
    a value out of bounds is a ConfigError naming its flag (`flags`: field -> flag)."""
    try:
        return type(model).model_validate(model.model_dump() | dict(update))
    except ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0])
        raise ConfigError(f"{flags.get(name, name)} {update.get(name)}: {error['msg']}") from None


def widened(
    base: Scenario, scenario: Scenario, recorded: Scenario | None, *, nodes: int | None = None
) -> Scenario:
    """What an experiment directory records once `scenario` (`base` with selections applied) runs in
    it: `recorded` (its experiment.json) being the same experiment (name, nodes, defaults, overrides,
    held-out set), the configurations and seeds of both, selected from `base` again so that its own
    comparisons among them come back; otherwise `scenario`. Invocations split by `--configs` or
    `--seeds` (one per core, side by side) so leave the whole experiment recorded, not the last part."""
    if recorded is None or _identity(recorded) != _identity(scenario):
        return scenario
    known = [*base.configs, *recorded.configs, *scenario.configs]
    ran = [c for c in dict.fromkeys(known) if c in recorded.configs or c in scenario.configs]
    names = [c for c in ran if c in base.configs or parse_mix(c)]  # one the file no longer has: dropped
    seeds = sorted({*recorded.seeds, *scenario.seeds})
    return select(
        base,
        configs=names,
        seeds=seeds,
        overrides=scenario.overrides,
        nodes=nodes,
        evaluation={"questions": scenario.evaluation.questions, "samples": scenario.evaluation.samples},
    )


def _identity(scenario: Scenario) -> tuple[Any, ...]:
    """What makes runs of two selections parts of one experiment."""
    return (
        scenario.name,
        [g.model_dump() for g in scenario.groups],
        dict(scenario.defaults),
        dict(scenario.overrides),
        scenario.evaluation.model_dump(),
    )


def _ad_hoc(name: str, scenario: Scenario) -> dict[str, Any]:
    if parse_mix(name) is None:
        raise ConfigError(
            f"configuration {name!r} is not in scenario {scenario.name} ({', '.join(scenario.configs)}) "
            "and not an I/J mix such as 6/2"
        )
    return _config_keys(name, {})


def _check_mix(scenario: Scenario, name: str) -> None:
    """An I/J from `--configs` that the scenario's nodes can run, else a ConfigError naming the flag and
    what it allows. The sampler settings refuse such a mix too, but name their environment variables,
    which the user of `--configs` never set."""
    mix = parse_mix(name)
    assert mix is not None  # `_ad_hoc` admitted only I/J names
    round_sizes = _lockstep_round_sizes(scenario, name)
    most_local = min([_upper_bound("local_groups"), *round_sizes])
    most_external = _upper_bound("external_groups")
    if sum(mix) < 1 or mix[0] > most_local or mix[1] > most_external:
        why = " (a lock-step round's questions)" if most_local in round_sizes else ""
        raise ConfigError(
            f"--configs {name}: I/J is I local and J external groups per batch; scenario {scenario.name} "
            f"allows I <= {most_local}{why}, J <= {most_external} and I + J >= 1"
        )


def _upper_bound(field_name: str) -> int:
    """The `le` bound the sampler settings declare for one of their fields."""
    return int(field_bounds(SamplerSettings.model_fields[field_name])["le"])


def _lockstep_round_sizes(scenario: Scenario, config: str) -> list[int]:
    """The questions per round of each lock-step node under `config`."""
    fields = SamplerSettings.model_fields
    sizes: list[int] = []
    for node in manifest_data(scenario, config, scenario.seeds[0])["nodes"]:
        try:
            values = service_values(NodeSpec(**node), "sampler", peers=0)
        except ValidationError:  # a bad key of the scenario: the plan's manifest check names it
            continue
        if RoundMode(values.get("round_mode", fields["round_mode"].default)) is RoundMode.LOCKSTEP:
            sizes.append(int(values.get("questions_per_round", fields["questions_per_round"].default)))
    return sizes


def run_name(config: str, seed: int) -> str:
    """Directory name of one run: `i6-j2-s0` for an I/J configuration, else `<slug>-s0`."""
    mix = parse_mix(config)
    slug = f"i{mix[0]}-j{mix[1]}" if mix else re.sub(r"[^a-z0-9]+", "-", config).strip("-")
    return f"{slug}-s{seed}"


def node_seed(seed: int, index: int) -> int:
    """Distinct per node and per experiment seed, so no two nodes of any run share a stream."""
    return 1000 * seed + index + 1


def _merge(base: dict[str, Any], keys: Mapping[str, Any]) -> dict[str, Any]:
    """Manifest keys on top of others; the service mappings merge key by key."""
    out = copy.deepcopy(base)
    for key, value in keys.items():
        service, dot, setting = key.partition(".")
        if dot and service in SERVICE_KEYS:
            out.setdefault(service, {})[setting] = value
        elif key in SERVICE_KEYS and isinstance(value, Mapping):
            out[key] = {**out.get(key, {}), **value}
        else:
            out[key] = value
    return out


def _with_seed(value: Any, seed: int) -> Any:
    """`{seed}` in every string value replaced by the experiment seed."""
    if isinstance(value, str):
        return value.replace("{seed}", str(seed))
    if isinstance(value, Mapping):
        return {k: _with_seed(v, seed) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_with_seed(v, seed) for v in value]
    return value


def manifest_data(scenario: Scenario, config: str, seed: int) -> dict[str, Any]:
    """The swarm manifest of one run (as `sapo.swarm.manifest.parse_manifest` reads it)."""
    nodes: list[dict[str, Any]] = []
    for group in scenario.groups:
        for k in range(group.count):
            keys = _merge(dict(scenario.defaults), group.keys)
            keys = _merge(keys, scenario.configs[config])
            keys = _merge(keys, scenario.overrides)
            index = len(nodes)
            nodes.append({"id": f"{group.name}-{k + 1}", "seed": node_seed(seed, index), **keys})
    return {"name": f"exp-{scenario.name}-{run_name(config, seed)}", "nodes": _with_seed(nodes, seed)}


def checked_manifest(scenario: Scenario, config: str, seed: int) -> SwarmManifest:
    """The run's manifest, parsed; parsing loads every node's three service settings, so a bad raw
    setting fails here, naming it, instead of in the middle of an experiment."""
    try:
        return parse_manifest(manifest_data(scenario, config, seed))
    except ConfigError as exc:
        raise ConfigError(f"scenario {scenario.name}, {config}: {exc}") from None


def group_of(node_id: str) -> str:
    """The node group of a node id `<group>-<k>`."""
    return node_id.rsplit("-", 1)[0]
