"""Task profiles: which reasoning-gym datasets a node trains on, with what weight and configuration.

A profile is a tuple of `TaskSpec`s. Two are built in: `paper` (the nine tasks and parameters of the
paper's public reference configuration) and `easy` (settings where the bundled SmolLM2-135M gets
non-zero reward, measured).
Operators can supply their own as a plain mapping, validated here so that every error names the bad key
and says what to set.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from reasoning_gym.factory import DATASETS

from sapo.tasks.datasets import UNSAFE_VERIFIERS
from sapo.tasks.records import canonical_json, sha256_hex

STREAM_OWNED_FIELDS = frozenset({"seed", "size"})
"""Config fields the task stream sets itself; a profile may not override them."""


class ProfileError(ValueError):
    """An invalid task profile; the message names the offending key and what to set instead."""


@dataclass(frozen=True)
class TaskSpec:
    """One task of a profile: reasoning-gym dataset `name`, relative draw `weight`, config overrides.

    `config` holds keyword arguments for the dataset's config class on top of reasoning-gym's
    defaults, excluding `seed` and `size` (the stream owns those).
    """

    name: str
    weight: float
    config: Mapping[str, Any] = field(default_factory=dict, hash=False)


Profile = tuple[TaskSpec, ...]

_PROPOSITIONAL_LOGIC = TaskSpec(
    "propositional_logic",
    1.0,
    {
        "min_vars": 2,
        "max_vars": 4,
        "min_statements": 2,
        "max_statements": 4,
        "min_complexity": 1,
        "max_complexity": 3,
    },
)

PAPER_PROFILE: Profile = (
    TaskSpec("arc_1d", 1.0, {"min_size": 10, "max_size": 30, "num_train": 3}),
    TaskSpec(
        "basic_arithmetic",
        1.0,
        {
            "min_terms": 2,
            "max_terms": 6,
            "min_digits": 1,
            "max_digits": 4,
            "operators": ["+", "-", "*", "/"],
            "allow_parentheses": True,
            "allow_negation": True,
            "format_style": "natural",
        },
    ),
    TaskSpec("base_conversion", 1.0, {"min_base": 2, "max_base": 16, "min_value": 0, "max_value": 1000}),
    TaskSpec("bf", 1.0, {"difficulty": 1}),
    TaskSpec("binary_matrix", 1.0, {"min_n": 3, "max_n": 10, "p_zero": 0.25}),
    TaskSpec(
        "calendar_arithmetic",
        1.0,
        {
            "year": 2023,
            "offset_upper_bound": 100,
            "leap_year_range": 200,
            "tasks": ["count_days", "weekday_of_date", "is_leap_year", "recurring_event_day"],
        },
    ),
    TaskSpec(
        "decimal_arithmetic",
        1.0,
        {
            "min_terms": 2,
            "max_terms": 6,
            "min_num_decimal_places": 1,
            "max_num_decimal_places": 3,
            "precision": 5,
        },
    ),
    TaskSpec(
        "fraction_simplification",
        1.0,
        {
            "min_value": 1,
            "max_value": 100,
            "min_factor": 2,
            "max_factor": 100,
            "styles": ["plain", "latex_frac", "latex_dfrac"],
        },
    ),
    _PROPOSITIONAL_LOGIC,
)

# Calendar: short offsets and the weekday/leap-year/count sub-tasks (measured: 0.35-0.39 at easy settings
# vs 0.19 at paper settings); count_days gives dense partial credit. Propositional logic keeps the paper
# settings because the 135M model scored higher there (0.34) than at the easiest ones (0.11-0.16).
# Fractions: small plain fractions whose partial credit gives many groups signal; factor >= 2 so the
# question is never already in lowest terms. Arithmetic: two or three one-digit terms, + and - only.
EASY_PROFILE: Profile = (
    TaskSpec(
        "calendar_arithmetic",
        1.0,
        {
            "year": 2023,
            "offset_upper_bound": 30,
            "leap_year_range": 200,
            "tasks": ["weekday_of_date", "weekday_offset", "is_leap_year", "count_days"],
        },
    ),
    _PROPOSITIONAL_LOGIC,
    TaskSpec(
        "fraction_simplification",
        1.0,
        {"min_value": 1, "max_value": 20, "min_factor": 2, "max_factor": 10, "styles": ["plain"]},
    ),
    TaskSpec(
        "basic_arithmetic",
        1.0,
        {
            "min_terms": 2,
            "max_terms": 3,
            "min_digits": 1,
            "max_digits": 1,
            "operators": ["+", "-"],
            "allow_parentheses": False,
            "allow_negation": False,
            "format_style": "simple",
        },
    ),
)

PROFILES: dict[str, Profile] = {"paper": PAPER_PROFILE, "easy": EASY_PROFILE}


def get_profile(name: str) -> Profile:
    """A built-in profile by name; the error lists the names that exist."""
    if name not in PROFILES:
        raise ProfileError(f"unknown task profile {name!r}; set it to one of: {', '.join(sorted(PROFILES))}")
    return PROFILES[name]


def profile_from_dict(data: Mapping[str, Any]) -> Profile:
    """Build and validate a profile from `{task: {"weight": w, "config": {...}}}` (config optional).

    Tasks are listed in sorted name order so that the same mapping always yields the same profile.
    """
    if not isinstance(data, Mapping) or not data:
        raise ProfileError(
            "a task profile must be a non-empty mapping like "
            '{"calendar_arithmetic": {"weight": 1.0, "config": {"year": 2023}}}'
        )
    specs = []
    for name in sorted(data, key=str):
        specs.append(_spec_from_entry(name, data[name]))
    profile = tuple(specs)
    validate_profile(profile)
    return profile


def _spec_from_entry(name: object, entry: object) -> TaskSpec:
    """One `task -> {weight, config}` entry as a TaskSpec, with key-level checks."""
    if not isinstance(name, str):
        raise ProfileError(f"task names must be strings, got {name!r}")
    if not isinstance(entry, Mapping):
        raise ProfileError(
            f'tasks.{name} must be a mapping like {{"weight": 1.0, "config": {{}}}}, '
            f"got {type(entry).__name__}"
        )
    unknown = sorted(set(entry) - {"weight", "config"}, key=str)
    if unknown:
        raise ProfileError(f"tasks.{name} has unknown key {unknown[0]!r}; allowed keys: config, weight")
    config = entry.get("config", {})
    if not isinstance(config, Mapping):
        raise ProfileError(
            f"tasks.{name}.config must be a mapping of config fields, got {type(config).__name__}"
        )
    return TaskSpec(name=name, weight=entry.get("weight", 1.0), config=dict(config))


def validate_profile(profile: Profile) -> None:
    """Check every spec: known dataset, positive weight, known config fields, a config that validates."""
    if not profile:
        raise ProfileError("a task profile needs at least one task")
    names = [spec.name for spec in profile]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ProfileError(f"task {duplicates[0]!r} appears twice; merge its entries into one")
    for spec in profile:
        _validate_spec(spec)


def _validate_spec(spec: TaskSpec) -> None:
    """Actionable checks for one spec; builds the config once so reasoning-gym's own checks run too."""
    if spec.name not in DATASETS:
        raise ProfileError(
            f"unknown task {spec.name!r}{_suggest(spec.name, DATASETS)}; use a reasoning-gym dataset name"
        )
    if spec.name in UNSAFE_VERIFIERS:
        raise ProfileError(
            f"task {spec.name!r} is refused: its verifier evaluates model output as Python, so a peer's "
            "completion could run code on this node; remove it from the profile"
        )
    weight = spec.weight
    if (
        isinstance(weight, bool)
        or not isinstance(weight, int | float)
        or not math.isfinite(weight)
        or weight <= 0
    ):
        raise ProfileError(f"tasks.{spec.name}.weight must be a positive number, got {weight!r}; set it > 0")
    allowed = config_field_names(spec.name) - STREAM_OWNED_FIELDS
    for key in spec.config:
        if key in STREAM_OWNED_FIELDS:
            raise ProfileError(
                f"tasks.{spec.name}.config.{key} is set by the task stream per node; remove it"
            )
        if key not in allowed:
            raise ProfileError(
                f"tasks.{spec.name}.config has unknown key {key!r}{_suggest(key, allowed)}; "
                f"valid keys: {', '.join(sorted(allowed))}"
            )
    try:
        resolved_config(spec)
    except (TypeError, ValueError, AssertionError) as exc:
        raise ProfileError(
            f"tasks.{spec.name}.config is invalid ({exc}); fix the values named there"
        ) from exc


def config_field_names(dataset: str) -> frozenset[str]:
    """The field names of a dataset's config dataclass."""
    _, config_cls = DATASETS[dataset]
    return frozenset(f.name for f in dataclasses.fields(config_cls))


def resolved_config(spec: TaskSpec) -> dict[str, Any]:
    """The full dataset configuration (defaults filled in), without seed and size, as JSON-ready data.

    Carrying every field, not only the overrides, pins the defaults: a receiver whose reasoning-gym has
    other defaults still rebuilds the same dataset, or fails loudly.
    """
    _, config_cls = DATASETS[spec.name]
    config = config_cls(**spec.config, seed=0, size=1)
    if hasattr(config, "validate"):
        config.validate()
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    for key in STREAM_OWNED_FIELDS:
        values.pop(key, None)
    normalized: dict[str, Any] = json.loads(canonical_json(values))  # TypeError if the wire cannot carry it
    return normalized


def provenance_config(spec: TaskSpec) -> str:
    """The configuration as provenance carries it (`Provenance.config_json`)."""
    return canonical_json(resolved_config(spec))


def config_digests(profile: Profile) -> frozenset[str]:
    """The `config_digest` of every dataset configuration the profile's streams produce: what a
    receiver that accepts this profile re-derives (`SamplerSettings.accepted_profiles`)."""
    return frozenset(sha256_hex(provenance_config(spec)) for spec in profile)


def _suggest(word: str, choices: Iterable[str]) -> str:
    """' (did you mean X?)' for a near miss, else ''."""
    matches = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {matches[0]!r}?)" if matches else ""


def profile_subset(profile: Profile, tasks: Iterable[str]) -> Profile:
    """The profile's specs of the named tasks (in the profile's order), e.g. one node's data silo."""
    wanted = [t.strip() for t in tasks if t.strip()]
    known = [spec.name for spec in profile]
    unknown = sorted(set(wanted) - set(known))
    if unknown or not wanted:
        raise ProfileError(
            f"task subset {wanted}: {unknown[0] if unknown else 'no task'} is not in the profile; pick "
            f"from {', '.join(known)}"
        )
    return tuple(spec for spec in profile if spec.name in wanted)


def load_profile(name_or_path: str) -> Profile:
    """A built-in profile by name, a subset of one (`easy:propositional_logic,basic_arithmetic`: the
    named tasks with their weights and configurations), or a profile file (YAML or JSON) by path."""
    if name_or_path in PROFILES:
        return get_profile(name_or_path)
    base, colon, tasks = name_or_path.partition(":")
    if colon and base in PROFILES:
        return profile_subset(get_profile(base), tasks.split(","))
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(
            f"{name_or_path!r} is neither a built-in profile ({', '.join(sorted(PROFILES))}) nor a file"
        )
    try:
        data: Any = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read profile file {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"profile file {path} must hold a mapping of task name to settings")
    try:
        return profile_from_dict(data)
    except ProfileError as exc:
        raise ValueError(f"profile file {path}: {exc}") from None
