"""Every custom resource the chart renders, validated against the operators' schemas (crds.py): the
Prometheus Operator's generated models for ServiceMonitor and PrometheusRule, a closed hand-written
schema for Strimzi's KafkaTopic and KafkaUser (no package carries Strimzi's). A deliberately
misspelt field must fail each of them.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.deploy.crds import validate_prometheus_operator, validate_strimzi
from tests.deploy.helm import CI_VALUES, of_kind, render, render_with_api_versions

pytestmark = pytest.mark.unit
EVERYTHING = (
    "serviceMonitor.enabled=true",
    "prometheusRule.enabled=true",
    "kafkaTopics.enabled=true",
    "kafkaTopics.swarm.create=true",
    "kafkaUser.enabled=true",
)


def rendered(*kinds: str) -> list[dict[str, Any]]:
    return [doc for values in CI_VALUES for doc in render(values, *EVERYTHING) if doc["kind"] in kinds]


def test_prometheus_operator_objects_match_the_operator_schema() -> None:
    objects = rendered("ServiceMonitor", "PrometheusRule")
    assert len(objects) == 2 * len(CI_VALUES)
    valid, output = validate_prometheus_operator(objects)
    assert valid, output


@pytest.mark.parametrize(
    ("kind", "misspell"),
    [
        # spec.endpoints[0].scrapeTimeout -> scrapeTimout
        (
            "ServiceMonitor",
            lambda o: o["spec"]["endpoints"][0].update(
                scrapeTimout=o["spec"]["endpoints"][0].pop("scrapeTimeout")
            ),
        ),
        # spec.namespaceSelector -> namespaceSelecter
        ("ServiceMonitor", lambda o: o["spec"].update(namespaceSelecter=o["spec"].pop("namespaceSelector"))),
        # a rule's annotations -> anotations
        (
            "PrometheusRule",
            lambda o: o["spec"]["groups"][0]["rules"][0].update(
                anotations=o["spec"]["groups"][0]["rules"][0].pop("annotations")
            ),
        ),
    ],
)
def test_a_misspelt_prometheus_operator_field_fails(kind: str, misspell: Any) -> None:
    (good,) = of_kind(render(None, *EVERYTHING), kind)
    bad = copy.deepcopy(good)
    misspell(bad)
    (typo,) = set(_keys(bad)) - set(_keys(good))
    valid, output = validate_prometheus_operator([good, bad])
    assert not valid
    assert f"'\"{typo}\"' does not exist" in output, output
    assert output.count("error TS") == 1, output  # only the misspelt copy is refused


def test_a_bad_duration_fails_the_operator_validator() -> None:
    (good,) = of_kind(render(None, *EVERYTHING), "ServiceMonitor")
    bad = copy.deepcopy(good)
    bad["spec"]["endpoints"][0]["interval"] = "30 seconds"
    valid, output = validate_prometheus_operator([bad])
    assert not valid and "interval must match pattern" in output, output


@pytest.mark.parametrize("api_versions", [(), ("kafka.strimzi.io/v1beta2/KafkaTopic",)])
def test_strimzi_objects_match_the_strimzi_schema(api_versions: tuple[str, ...]) -> None:
    objects = rendered("KafkaTopic", "KafkaUser")
    objects += [
        d for d in render_with_api_versions(api_versions, *EVERYTHING) if d["kind"].startswith("Kafka")
    ]
    assert {o["kind"] for o in objects} == {"KafkaTopic", "KafkaUser"}
    for obj in objects:
        assert validate_strimzi(obj) == [], obj["metadata"]["name"]


@pytest.mark.parametrize(
    ("kind", "path", "typo"),
    [
        ("KafkaTopic", ("spec",), "replicas"),
        ("KafkaUser", ("spec", "authorization", "acls", 0), "operations"),
        ("KafkaUser", ("spec", "authorization", "acls", 0, "resource"), "patternType"),
    ],
)
def test_a_misspelt_strimzi_field_fails(kind: str, path: tuple[Any, ...], typo: str) -> None:
    (obj,) = of_kind(render(None, *EVERYTHING), kind)[:1]
    target = obj
    for step in path:
        target = target[step]
    target[typo + "s"] = target.pop(typo)
    errors = validate_strimzi(obj)
    assert any(f"'{typo}s' was unexpected" in e for e in errors), errors


def _keys(obj: Any) -> list[str]:
    """Every mapping key in a nested object."""
    if isinstance(obj, dict):
        return [k for key, value in obj.items() for k in (key, *_keys(value))]
    if isinstance(obj, list):
        return [k for item in obj for k in _keys(item)]
    return []
