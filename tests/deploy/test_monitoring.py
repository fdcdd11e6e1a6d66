"""The chart's monitoring and Kafka objects: ServiceMonitor, PrometheusRule and KafkaTopic checked
structurally (no CRD schemas offline), the alert rules through `promtool check rules` and the unit
tests in deploy/prometheus/sapo-node.test.yaml, the Grafana dashboard, and every metric the alerts
and the dashboard query declared by the services' metrics modules.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from sapo.kafka.metrics import TransportMetrics
from sapo.node.metrics import GeneratorMetrics, SamplerMetrics, TrainerMetrics
from tests.deploy.helm import (
    CI_VALUES,
    CRD_API,
    NAMESPACE,
    PROMTOOL_TESTS,
    SERVICES,
    of_kind,
    render,
    require_tool,
    run,
)

pytestmark = pytest.mark.unit


# --- CRD objects, checked structurally ------------------------------------------------------------

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
# Fields of the CRD versions we target (Prometheus Operator v0.7x, Strimzi 0.4x); the chart must only
# use fields that exist there. Listed, not fetched: there is no cluster to ask.
SERVICE_MONITOR_SPEC = {
    "selector",
    "namespaceSelector",
    "endpoints",
    "jobLabel",
    "targetLabels",
    "podTargetLabels",
}
ENDPOINT = {"port", "path", "scheme", "interval", "scrapeTimeout", "relabelings", "metricRelabelings"}
RELABEL = {"sourceLabels", "separator", "targetLabel", "regex", "modulus", "replacement", "action"}
RELABEL_ACTIONS = {"replace", "keep", "drop", "hashmod", "labelmap", "labeldrop", "labelkeep", "lowercase"}
RULE_GROUP = {"name", "interval", "rules", "limit", "partial_response_strategy"}
ALERTING_RULE = {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
KAFKA_TOPIC_SPEC = {"topicName", "partitions", "replicas", "config"}


def crds(kind: str) -> Iterator[dict[str, Any]]:
    """Every object of `kind` across the scenarios, with everything optional switched on."""
    everything = ("serviceMonitor.enabled=true", "prometheusRule.enabled=true", "kafkaTopics.enabled=true")
    for values in CI_VALUES:
        yield from of_kind(render(values, *everything), kind)


def check_object(obj: dict[str, Any], kind: str) -> None:
    assert obj["apiVersion"] == CRD_API[kind]
    assert set(obj) == {"apiVersion", "kind", "metadata", "spec"}
    assert DNS_SUBDOMAIN.match(obj["metadata"]["name"]), obj["metadata"]["name"]
    assert all(isinstance(v, str) for v in obj["metadata"]["labels"].values())


def test_service_monitor_structure() -> None:
    monitors = list(crds("ServiceMonitor"))
    assert len(monitors) == len(CI_VALUES)
    for sm in monitors:
        check_object(sm, "ServiceMonitor")
        spec = sm["spec"]
        assert set(spec) <= SERVICE_MONITOR_SPEC
        assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
        (endpoint,) = spec["endpoints"]
        assert set(endpoint) <= ENDPOINT
        assert endpoint["port"] == "http" and endpoint["path"] == "/metrics"
        assert DURATION.match(endpoint["interval"]) and DURATION.match(endpoint["scrapeTimeout"])
        for relabel in endpoint["relabelings"]:
            assert set(relabel) <= RELABEL and relabel.get("action", "replace") in RELABEL_ACTIONS
        assert {"action": "replace", "targetLabel": "sapo_node"}.items() <= endpoint["relabelings"][0].items()


def test_service_monitor_selects_exactly_the_three_services() -> None:
    docs = render(None, "serviceMonitor.enabled=true")
    (sm,) = of_kind(docs, "ServiceMonitor")
    selector = sm["spec"]["selector"]
    (components,) = selector["matchExpressions"]
    selected = [
        svc
        for svc in of_kind(docs, "Service")
        if selector["matchLabels"].items() <= svc["metadata"]["labels"].items()
        and svc["metadata"]["labels"]["app.kubernetes.io/component"] in components["values"]
    ]
    assert len(selected) == 3
    assert all(p["name"] == "http" for svc in selected for p in svc["spec"]["ports"])


def test_prometheus_rule_structure() -> None:
    rules = list(crds("PrometheusRule"))
    assert len(rules) == len(CI_VALUES)
    for rule in rules:
        check_object(rule, "PrometheusRule")
        assert set(rule["spec"]) == {"groups"}
        for group in rule["spec"]["groups"]:
            assert set(group) <= RULE_GROUP
            for alert in group["rules"]:
                assert set(alert) <= ALERTING_RULE, alert["alert"]
                assert re.match(r"^Sapo[A-Za-z]+$", alert["alert"])
                assert alert["labels"]["severity"] in ("critical", "warning")
                assert {"summary", "description"} <= set(alert["annotations"])
                assert "for" not in alert or DURATION.match(alert["for"])


def test_kafka_topics_match_the_node_topic_names() -> None:
    from sapo.topics import TopicNames

    for values in CI_VALUES:
        docs = render(values, "kafkaTopics.enabled=true", "kafkaTopics.swarm.create=true")
        config = yaml.safe_load(values.read_text())
        names = TopicNames.for_node(config["nodeId"], config.get("topicPrefix", "sapo"))
        topics = {t["spec"]["topicName"]: t for t in of_kind(docs, "KafkaTopic")}
        expected = {names.rollouts, names.batches, names.policy, names.dlq}
        expected |= {names.swarm_rollouts, names.swarm_keys}
        assert set(topics) == expected
        for topic in topics.values():
            check_object(topic, "KafkaTopic")
            spec = topic["spec"]
            assert set(spec) <= KAFKA_TOPIC_SPEC
            assert topic["metadata"]["labels"]["strimzi.io/cluster"]
            assert isinstance(spec["partitions"], int) and spec["partitions"] >= 1
            assert isinstance(spec["replicas"], int) and spec["replicas"] >= 1
            assert all(isinstance(v, str | int | bool) for v in spec["config"].values())
        for compacted in (names.policy, names.swarm_keys):
            spec = topics[compacted]["spec"]
            assert spec["config"]["cleanup.policy"] == "compact"
            assert spec["partitions"] == 1
            assert "retention.ms" not in spec["config"]


def test_swarm_topic_only_on_request() -> None:
    docs = render(None, "kafkaTopics.enabled=true")
    assert "sapo.swarm.rollouts" not in {t["spec"]["topicName"] for t in of_kind(docs, "KafkaTopic")}


# --- alerts and dashboard --------------------------------------------------------------------------


def rule_groups() -> list[dict[str, Any]]:
    (rule,) = of_kind(render(None, "prometheusRule.enabled=true"), "PrometheusRule")
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


def test_promtool_check_rules(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    rules = tmp_path / "sapo-node.rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": rule_groups()}, sort_keys=False))
    result = run(promtool, "check", "rules", str(rules))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    (tmp_path / "sapo-node.rules.yaml").write_text(yaml.safe_dump({"groups": rule_groups()}, sort_keys=False))
    shutil.copy(PROMTOOL_TESTS, tmp_path / PROMTOOL_TESTS.name)
    result = run(promtool, "test", "rules", PROMTOOL_TESTS.name, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def dashboard(*sets: str) -> tuple[dict[str, Any], dict[str, Any]]:
    (cm,) = of_kind(render(None, "grafanaDashboard.enabled=true", *sets), "ConfigMap")
    (text,) = cm["data"].values()
    parsed: dict[str, Any] = json.loads(text)
    return cm, parsed


def test_dashboard_configmap() -> None:
    cm, board = dashboard("nodeId=node-7")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert board["uid"] == "sapo-node-node-7"
    (node_var,) = [v for v in board["templating"]["list"] if v["name"] == "node"]
    assert node_var["current"]["value"] == "node-7"
    titles = {p["title"] for p in board["panels"]}
    for title in (
        "Mean reward by task",
        "Batches emitted",
        "Groups rejected by reason",
        "Loss",
        "Clip fractions",
        "Gradient norm",
        "Step time",
        "Policy versions",
    ):
        assert title in titles
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))


def queried_metrics() -> dict[str, set[str]]:
    """Metric names used by the alert expressions and dashboard queries, by service."""
    exprs = [r["expr"] for g in rule_groups() for r in g["rules"]]
    exprs += [t["expr"] for p in dashboard()[1]["panels"] for t in p.get("targets", [])]
    names: dict[str, set[str]] = {s: set() for s in SERVICES}
    for expr in exprs:
        # {__name__=~"sapo_(generator|sampler|trainer)_x"} stands for each of the three.
        for services, rest in re.findall(r"sapo_\(([a-z|]+)\)_([a-z0-9_]+)", expr):
            for service in services.split("|"):
                names[service].add(f"sapo_{service}_{rest}")
        for service, rest in re.findall(r"\bsapo_(generator|sampler|trainer)_([a-z0-9_]+)", expr):
            names[service].add(f"sapo_{service}_{rest}")
    return names


def declared_metrics(service: str) -> set[str]:
    """Names on a registry after the transport metrics and the service's own metrics are built."""
    registry = CollectorRegistry()
    TransportMetrics(registry, service)
    if service == "generator":
        GeneratorMetrics(registry, ())
    elif service == "sampler":
        SamplerMetrics(registry)
    else:
        TrainerMetrics(registry)
    names = set()
    for family in registry.collect():
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names |= {family.name + suffix for suffix in ("_bucket", "_sum", "_count")}
        else:
            names.add(family.name)
    return names


def test_alerts_and_dashboard_query_declared_metrics() -> None:
    for service, queried in queried_metrics().items():
        unknown = sorted(queried - declared_metrics(service))
        assert not unknown, f"{service}: queried but never declared: {unknown}"
