"""Built-in profiles and validation of user-defined ones."""

from __future__ import annotations

from typing import Any

import pytest

from sapo.tasks import (
    EASY_PROFILE,
    PAPER_PROFILE,
    ProfileError,
    TaskSpec,
    get_profile,
    load_profile,
    profile_from_dict,
    validate_profile,
)
from sapo.tasks.profiles import resolved_config

pytestmark = pytest.mark.unit


def test_paper_profile_is_the_nine_tasks_of_appendix_a_with_weight_one() -> None:
    assert sorted(spec.name for spec in PAPER_PROFILE) == [
        "arc_1d",
        "base_conversion",
        "basic_arithmetic",
        "bf",
        "binary_matrix",
        "calendar_arithmetic",
        "decimal_arithmetic",
        "fraction_simplification",
        "propositional_logic",
    ]
    assert {spec.weight for spec in PAPER_PROFILE} == {1.0}


def test_paper_parameters_reach_the_resolved_configs() -> None:
    configs = {spec.name: resolved_config(spec) for spec in PAPER_PROFILE}
    assert configs["calendar_arithmetic"]["year"] == 2023
    assert configs["calendar_arithmetic"]["tasks"] == [
        "count_days",
        "weekday_of_date",
        "is_leap_year",
        "recurring_event_day",
    ]
    assert configs["basic_arithmetic"]["format_style"] == "natural"
    assert configs["decimal_arithmetic"]["precision"] == 5
    assert configs["fraction_simplification"]["styles"] == ["plain", "latex_frac", "latex_dfrac"]
    assert configs["binary_matrix"]["p_zero"] == 0.25
    assert all("seed" not in c and "size" not in c for c in configs.values())


def test_builtin_profiles_validate_and_resolve_by_name() -> None:
    validate_profile(PAPER_PROFILE)
    validate_profile(EASY_PROFILE)
    assert get_profile("paper") is PAPER_PROFILE
    assert {spec.name for spec in get_profile("easy")} == {
        "calendar_arithmetic",
        "propositional_logic",
        "fraction_simplification",
        "basic_arithmetic",
    }


def test_unknown_profile_name_lists_the_choices() -> None:
    with pytest.raises(ProfileError, match="set it to one of: easy, paper"):
        get_profile("papr")


def test_a_subset_of_a_builtin_profile_keeps_its_tasks_settings() -> None:
    silo = load_profile("easy:propositional_logic, basic_arithmetic")
    assert silo == tuple(
        spec for spec in EASY_PROFILE if spec.name in {"propositional_logic", "basic_arithmetic"}
    )
    with pytest.raises(ProfileError, match="arc_1d is not in the profile; pick from calendar_arithmetic"):
        load_profile("easy:arc_1d")
    with pytest.raises(ProfileError, match="no task"):
        load_profile("easy:")


def test_profile_from_dict_sorts_tasks_and_defaults_weight() -> None:
    profile = profile_from_dict(
        {
            "propositional_logic": {"weight": 2},
            "calendar_arithmetic": {"config": {"year": 2024, "tasks": ["is_leap_year"]}},
        }
    )
    assert profile == (
        TaskSpec("calendar_arithmetic", 1.0, {"year": 2024, "tasks": ["is_leap_year"]}),
        TaskSpec("propositional_logic", 2, {}),
    )


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({}, ["non-empty mapping"]),
        ({"calender_arithmetic": {}}, ["unknown task 'calender_arithmetic'", "'calendar_arithmetic'"]),
        ({"calendar_arithmetic": 1}, ["tasks.calendar_arithmetic must be a mapping"]),
        ({"calendar_arithmetic": {"wieght": 1}}, ["unknown key 'wieght'", "allowed keys: config, weight"]),
        ({"calendar_arithmetic": {"weight": 0}}, ["tasks.calendar_arithmetic.weight", "set it > 0"]),
        ({"calendar_arithmetic": {"weight": "1"}}, ["tasks.calendar_arithmetic.weight", "positive number"]),
        ({"calendar_arithmetic": {"config": []}}, ["tasks.calendar_arithmetic.config must be a mapping"]),
        ({"calendar_arithmetic": {"config": {"yaer": 1}}}, ["unknown key 'yaer'", "did you mean 'year'"]),
        ({"calendar_arithmetic": {"config": {"seed": 1}}}, ["config.seed is set by the task stream"]),
        (
            {"basic_arithmetic": {"config": {"min_terms": 5, "max_terms": 2}}},
            ["basic_arithmetic.config is invalid"],
        ),
        (
            {"calendar_arithmetic": {"config": {"tasks": ["nope"]}}},
            ["config is invalid", "Invalid tasks: nope"],
        ),
        ({"countdown": {}}, ["'countdown' is refused", "remove it"]),
    ],
)
def test_profile_errors_name_the_key_and_what_to_set(data: dict[str, Any], expected: list[str]) -> None:
    with pytest.raises(ProfileError) as info:
        profile_from_dict(data)
    for fragment in expected:
        assert fragment in str(info.value)


def test_duplicate_tasks_are_refused() -> None:
    with pytest.raises(ProfileError, match="appears twice"):
        validate_profile((PAPER_PROFILE[0], PAPER_PROFILE[0]))
