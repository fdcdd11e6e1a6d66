"""What the chart's monitoring and Kafka objects mean: the ServiceMonitor selects the three Services
and labels every series with the node, each alert is named, graded and has a runbook section, topics
match the node's topic names; the alert rules through `promtool check rules` and the unit tests in
deploy/prometheus/sapo-node.test.yaml; the Grafana dashboard; every metric the alerts and the
dashboard query, and every metric the docs name, is declared by the services. Field-level validation
against the operators' schemas is in test_crds.py; the queries' labels and label values against a
real swarm's /metrics in tests/integration/test_chart_queries.py.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from sapo.kafka.metrics import TransportMetrics
from sapo.node import generator, sampler, trainer
from sapo.node.identity import IdentityMetrics
from sapo.node.lease import LeaseMetrics
from sapo.node.metrics import GeneratorMetrics, SamplerMetrics, TrainerMetrics
from sapo.runtime import gate_waits
from sapo.swarm.launcher import GATED
from tests.deploy.helm import (
    CHART,
    CI_VALUES,
    CRD_API,
    NAMESPACE,
    PROMTOOL_TESTS,
    ROOT,
    SERVICES,
    deployment,
    env_of,
    of_kind,
    render,
    require_tool,
    run,
    template_error,
)

pytestmark = pytest.mark.unit
LEASED = ("sampler", "trainer")
"""The services that hold a lease (sapo.node.lease.node_lease) and export its metrics."""


# --- what the custom resources say (their fields are validated in test_crds.py) ------------------

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_SUBDOMAIN = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$")
"""A Kubernetes object name (RFC 1123 subdomain): dot-separated labels, each starting and ending with a
letter or digit."""
README = ROOT / "deploy/README.md"


def crds(kind: str) -> Iterator[dict[str, Any]]:
    """Every object of `kind` across the scenarios, with everything optional switched on."""
    everything = ("serviceMonitor.enabled=true", "prometheusRule.enabled=true", "kafkaTopics.enabled=true")
    for values in CI_VALUES:
        yield from of_kind(render(values, *everything), kind)


def check_object(obj: dict[str, Any], kind: str) -> None:
    assert obj["apiVersion"] == CRD_API[kind]
    assert DNS_SUBDOMAIN.match(obj["metadata"]["name"]), obj["metadata"]["name"]


def test_service_monitor_labels_every_series_with_the_node() -> None:
    monitors = list(crds("ServiceMonitor"))
    assert len(monitors) == len(CI_VALUES)
    for sm in monitors:
        check_object(sm, "ServiceMonitor")
        spec = sm["spec"]
        assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
        (endpoint,) = spec["endpoints"]
        assert endpoint["port"] == "http" and endpoint["path"] == "/metrics"
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


def test_every_alert_is_named_graded_and_has_a_runbook_section() -> None:
    rules = list(crds("PrometheusRule"))
    assert len(rules) == len(CI_VALUES)
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in README.read_text().splitlines()
        if line.startswith("#")
    }
    for rule in rules:
        check_object(rule, "PrometheusRule")
        for group in rule["spec"]["groups"]:
            for alert in group["rules"]:
                assert re.match(r"^Sapo[A-Za-z]+$", alert["alert"])
                assert alert["labels"]["severity"] in ("critical", "warning")
                assert {"summary", "description", "runbook_url"} <= set(alert["annotations"])
                url = alert["annotations"]["runbook_url"]
                assert url == f"deploy/README.md#{alert['alert'].lower()}"
                assert url.split("#")[1] in anchors, f"no runbook section for {alert['alert']} in {README}"


@pytest.mark.parametrize("label", ["severity", "sapo_node"])
def test_alert_labels_may_not_repeat_the_labels_every_alert_has(label: str) -> None:
    """The chart writes both labels into every alert's labels: the same key from alertLabels would be
    a duplicate mapping key, which YAML parsers either refuse or settle silently by keeping one of
    the two. The chart names the value instead."""
    error = template_error("prometheusRule.enabled=true", f"prometheusRule.alertLabels.{label}=x")
    assert f"prometheusRule.alertLabels.{label}: every alert already carries {label}" in error


def test_runbook_base_url_is_configurable() -> None:
    (rule,) = of_kind(
        render(
            None, "prometheusRule.enabled=true", "prometheusRule.runbookBaseUrl=https://docs.example.com/sapo"
        ),
        "PrometheusRule",
    )
    urls = {r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert all(u.startswith("https://docs.example.com/sapo#sapo") for u in urls)


def test_kafka_topics_match_the_node_topic_names() -> None:
    """The chart's KafkaTopics are the code's topics (`TopicNames.specs`): names, single-partition
    topics and compaction agree; the work topic has kafkaTopics.workPartitions."""
    from sapo.topics import TopicNames

    for values in CI_VALUES:
        docs = render(values, "kafkaTopics.enabled=true", "kafkaTopics.swarm.create=true")
        config = yaml.safe_load(values.read_text())
        names = TopicNames.for_node(config["nodeId"], config.get("topicPrefix", "sapo"))
        work_partitions = config.get("kafkaTopics", {}).get("workPartitions", 8)
        sized = 2  # what the sizable topics (rollouts, dlq, swarm) get here; the chart sizes them itself
        specs = {spec.name: spec for spec in names.specs(partitions=sized, work_partitions=work_partitions)}
        topics = {t["spec"]["topicName"]: t for t in of_kind(docs, "KafkaTopic")}
        assert set(topics) == set(specs)
        for name, topic in topics.items():
            check_object(topic, "KafkaTopic")
            assert topic["metadata"]["labels"]["strimzi.io/cluster"]
            spec, code = topic["spec"], specs[name]
            assert isinstance(spec["partitions"], int) and spec["partitions"] >= 1
            if code.partitions != sized:  # fixed by the code: single-partition topics, the work topic
                assert spec["partitions"] == code.partitions, name
            assert isinstance(spec["replicas"], int) and spec["replicas"] >= 1
            assert all(isinstance(v, str | int | bool) for v in spec["config"].values())
            policy = code.config.get("cleanup.policy", "delete")
            assert spec["config"].get("cleanup.policy", "delete") == policy, name
            if "cleanup.policy" in code.config:
                assert "retention.ms" not in spec["config"]


def test_one_value_sets_the_services_message_limit_and_every_topics() -> None:
    sets = ("kafkaTopics.enabled=true", "kafkaTopics.swarm.create=true", "maxMessageBytes=2097152")
    docs = render(None, *sets)
    topics = of_kind(docs, "KafkaTopic")
    assert topics and {t["spec"]["config"]["max.message.bytes"] for t in topics} == {"2097152"}
    for service in SERVICES:
        env = {e["name"]: e.get("value") for e in env_of(deployment(docs, service))}
        assert env[f"SAPO_{service.upper()}_MAX_MESSAGE_BYTES"] == "2097152"


def test_swarm_topic_only_on_request() -> None:
    docs = render(None, "kafkaTopics.enabled=true")
    assert "sapo.swarm.rollouts" not in {t["spec"]["topicName"] for t in of_kind(docs, "KafkaTopic")}


# --- alerts and dashboard --------------------------------------------------------------------------


def rule_groups(*sets: str) -> list[dict[str, Any]]:
    (rule,) = of_kind(render(None, "prometheusRule.enabled=true", *sets), "PrometheusRule")
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


def promtool_test(directory: Path, groups: list[dict[str, Any]], tests: list[dict[str, Any]]) -> str:
    """`promtool test rules` of `tests` against `groups`: its output, empty when every test passed."""
    promtool = require_tool("promtool")
    (directory / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    suite = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}
    (directory / "test.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    result = run(promtool, "test", "rules", "test.yaml", cwd=directory)
    return "" if result.returncode == 0 else result.stdout + result.stderr


@pytest.mark.parametrize(
    ("duration", "seconds"),
    [("45m", 2700), ("1h30m", 5400), ("1800000ms", 1800), ("1d2h", 93600), ("1y", 31536000)],
)
def test_a_stalled_alert_waits_out_its_window_after_a_start(duration: str, seconds: int) -> None:
    """The warm-up of SapoSamplerNotEmitting is its window in seconds, whichever Prometheus units the
    schema accepts it in."""
    (rule,) = of_kind(
        render(
            None, "prometheusRule.enabled=true", f"prometheusRule.thresholds.samplerStalledFor={duration}"
        ),
        "PrometheusRule",
    )
    (alert,) = [
        r for g in rule["spec"]["groups"] for r in g["rules"] if r.get("alert") == "SapoSamplerNotEmitting"
    ]
    assert re.search(rf"time\(\) - process_start_time_seconds\{{[^}}]*\}} > {seconds}\)", alert["expr"]), (
        alert["expr"]
    )


def job_matchers(rule: dict[str, Any]) -> list[re.Pattern[str]]:
    """Every job matcher of the rule's alerts as the regex Prometheus applies: the PromQL string
    decoded (its escapes are JSON's), anchored at both ends; `job="x"` as the literal x."""
    found = []
    for group in rule["spec"]["groups"]:
        for alert in group["rules"]:
            for op, literal in re.findall(r'\bjob(=~?)"((?:[^"\\]|\\.)*)"', alert["expr"]):
                text = json.loads(f'"{literal}"')
                found.append(re.compile(text if op == "=~" else re.escape(text)))
    return found


def test_alerts_select_the_jobs_of_the_services_a_long_release_name_gets() -> None:
    """The ServiceMonitor's job is the Service name, which a long fullname shortens to fit 63
    characters: every job an alert selects must be one of the rendered Services."""
    docs = render(None, "prometheusRule.enabled=true", "fullnameOverride=" + "n" * 63)
    services = {svc["metadata"]["name"] for svc in of_kind(docs, "Service")}
    (rule,) = of_kind(docs, "PrometheusRule")
    matchers = job_matchers(rule)
    assert all(any(matcher.fullmatch(job) for job in services) for matcher in matchers)
    assert {job for job in services for matcher in matchers if matcher.fullmatch(job)} == services


def test_alerts_take_a_dot_in_the_release_name_literally() -> None:
    """A release name may hold '.': the job regex must match that dot only, not any character, or
    one node's alerts would also watch a release whose name differs there."""
    helm = require_tool("helm")
    result = run(
        helm, "template", "a.b", str(CHART), "--namespace", NAMESPACE, "--set", "prometheusRule.enabled=true"
    )
    assert result.returncode == 0, result.stderr
    docs = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    services = {svc["metadata"]["name"] for svc in of_kind(docs, "Service")}
    (rule,) = of_kind(docs, "PrometheusRule")
    for matcher in job_matchers(rule):
        matched = {job for job in services if matcher.fullmatch(job)}
        assert matched, matcher.pattern
        assert not any(matcher.fullmatch(job.replace(".", "x")) for job in matched), matcher.pattern


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


@pytest.mark.parametrize("service", SERVICES)
def test_a_disabled_service_is_not_reported_absent(tmp_path: Path, service: str) -> None:
    """With `<service>.enabled=false` the release has no target of that service, and SapoServiceAbsent
    must not fire for it; it still fires for an enabled service that has none."""
    up = [
        {
            "series": f'up{{namespace="{NAMESPACE}", job="sapo-node-{s}", instance="10.0.0.1:8080"}}',
            "values": "1x20",
        }
        for s in SERVICES
        if s != service
    ]
    quiet = {"interval": "1m", "input_series": up}
    quiet["alert_rule_test"] = [{"eval_time": "15m", "alertname": "SapoServiceAbsent", "exp_alerts": []}]
    assert not promtool_test(tmp_path, rule_groups(f"{service}.enabled=false"), [quiet])
    # The same targets with the service enabled: its absence fires.
    assert "SapoServiceAbsent" in promtool_test(tmp_path, rule_groups(), [quiet])


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
        "Consumer lag by topic",
        "Generator rounds",
        "Dead letters per hour by reason",
        "Resident memory",
    ):
        assert title in titles
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))


def test_dashboard_opens_on_one_node_of_the_release_namespace() -> None:
    """Every panel aggregates over the selected nodes, so the picker takes one node; the namespace it
    lists nodes of is the release's, where the node's metrics are scraped."""
    _, board = dashboard("nodeId=node-7")
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert not variables["node"]["multi"] and not variables["node"]["includeAll"]
    assert variables["namespace"]["current"]["value"] == NAMESPACE


@pytest.mark.parametrize("service", SERVICES)
def test_dashboard_finds_the_node_without_one_of_the_charts_services(service: str) -> None:
    """With `<service>.enabled=false` the release scrapes the other two only: the namespace and node
    pickers must list the node from what it still scrapes, or every panel selects nothing."""
    _, board = dashboard(f"{service}.enabled=false")
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            for query in (variable["query"]["query"], variable["definition"]):
                assert f"sapo_{service}_" not in query, (variable["name"], query)


def test_nodes_sharing_a_grafana_and_a_strimzi_namespace_get_objects_of_their_own() -> None:
    """Two nodes installed under one release name (in two namespaces) put their KafkaTopics into the
    one Strimzi namespace and their dashboards into the one Grafana: names and uids follow the node
    id, whole: ids of the longest length that differ only at their end get uids of their own."""
    long_a, long_b = "n" * 47 + "a", "n" * 47 + "b"
    names, uids = [], []
    for node in ("node-a", "node-b", long_a, long_b):
        cm, board = dashboard(f"nodeId={node}", "kafkaTopics.enabled=true")
        docs = render(None, "grafanaDashboard.enabled=true", f"nodeId={node}", "kafkaTopics.enabled=true")
        names.append({d["metadata"]["name"] for d in docs if d["kind"] in ("KafkaTopic", "ConfigMap")})
        uids.append(board["uid"])
        assert len(board["uid"]) <= 40 and cm["metadata"]["name"].endswith("-dashboard")
    for i, mine in enumerate(names):
        assert all(not mine & other for other in names[i + 1 :])
    assert len(set(uids)) == 4 and uids[0] == "sapo-node-node-a"
    # Swarms whose prefixes differ only where a Kubernetes name cannot (case, '.', '_') stay apart too,
    # and a prefix that starts with '_' still makes a valid name.
    by_prefix = []
    for prefix in ("sapo.a", "sapo_a", "Sapo-a", "_sapo"):
        sets = ("grafanaDashboard.enabled=true", "kafkaTopics.enabled=true", f"topicPrefix={prefix}")
        docs = [d for d in render(None, *sets) if d["kind"] in ("KafkaTopic", "ConfigMap")]
        for doc in docs:
            assert DNS_SUBDOMAIN.match(doc["metadata"]["name"]), doc["metadata"]["name"]
        by_prefix.append({d["metadata"]["name"] for d in docs})
    for i, mine in enumerate(by_prefix):
        assert all(not mine & other for other in by_prefix[i + 1 :])
    # The swarm topics' names keep the prefix's dots, and each is valid and its own whatever the prefix.
    swarm_sets = ("kafkaTopics.enabled=true", "kafkaTopics.swarm.create=true")
    for prefix in ("_sapo", ".-sapo", "sapo-._", "a-.b", "a..b", "a._b", "a" * 62 + ".b", "a" * 60, "_"):
        swarm_names = [
            d["metadata"]["name"]
            for d in of_kind(render(None, *swarm_sets, f"topicPrefix={prefix}"), "KafkaTopic")
        ]
        assert all(DNS_SUBDOMAIN.match(name) for name in swarm_names), (prefix, swarm_names)
        assert len(set(swarm_names)) == len(swarm_names), (prefix, swarm_names)
    # Names earlier charts gave that were valid stay, so an upgrade keeps the swarm's KafkaTopics.
    kept = {d["metadata"]["name"] for d in render(None, *swarm_sets, "topicPrefix=sapo_.")}
    assert {"sapo--swarm-rollouts", "sapo--swarm-keys"} <= kept


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


def service_registry(service: str) -> CollectorRegistry:
    """A registry after the transport metrics (with the service's refusals) and the service's own metrics
    are built, the compute gate's where the launcher gives the service one, the lease's of the single
    writers, and the sampler's key announcements (identity on)."""
    registry = CollectorRegistry()
    refusals = {"generator": generator.REFUSALS, "sampler": sampler.REFUSALS, "trainer": trainer.REFUSALS}
    TransportMetrics(registry, service, refusals[service])
    if service in GATED:
        gate_waits(service, registry)
    if service in LEASED:
        LeaseMetrics(registry, service)
    if service == "generator":
        GeneratorMetrics(registry, ())
    elif service == "sampler":
        SamplerMetrics(registry)
        IdentityMetrics(registry, service)
    else:
        TrainerMetrics(registry)
    return registry


def declared_metrics(service: str) -> set[str]:
    """The metric names a service exposes (counters with `_total`, histograms' three series)."""
    names = set()
    for family in service_registry(service).collect():
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names |= {family.name + suffix for suffix in ("_bucket", "_sum", "_count")}
        else:
            names.add(family.name)
    return names


def test_alerted_counter_series_exist_before_their_first_count() -> None:
    """An alert on `increase(counter{label="value"}[w]) > 0` misses the first count of a series that
    is born at 1 (increase needs two samples of it): every series an alert picks by label equality
    is exposed at 0 from the start."""
    exposed = {
        (sample.name, label, value)
        for service in SERVICES
        for family in service_registry(service).collect()
        for sample in family.samples
        for label, value in sample.labels.items()
    }
    picked = [
        (f"sapo_{service}_{rest}", label, value)
        for group in rule_groups()
        for rule in group["rules"]
        for service, rest, selector in re.findall(
            r"\bsapo_(generator|sampler|trainer)_([a-z0-9_]+)\{([^}]*)\}", rule["expr"]
        )
        for label, value in re.findall(r"\b(outcome|reason|kind|mode)=\"([^\"]+)\"", selector)
    ]
    assert picked, "no alert picks a series by label: the pattern above is out of date"
    missing = sorted(set(picked) - exposed)
    assert not missing, f"alerted series not exposed before their first count: {missing}"


def test_alerts_and_dashboard_query_declared_metrics() -> None:
    for service, queried in queried_metrics().items():
        unknown = sorted(queried - declared_metrics(service))
        assert not unknown, f"{service}: queried but never declared: {unknown}"


DOCS = (ROOT / "README.md", README, *sorted((ROOT / "docs").glob("*.md")))
DOC_METRIC = re.compile(r"\bsapo_(?:[a-z0-9_<>]|\{[a-z0-9_,]+\}(?=[a-z0-9_]))+")
"""A metric name in the docs: `<service>` for whichever services have it, `{a,b}` for each of a and b."""


def documented_metrics() -> Iterator[tuple[str, str, list[str]]]:
    """(doc, name as written, each name it stands for) of every metric a doc names in code spans; the
    `sapo_node` label and prefixes (`sapo_<service>_`) are not metrics."""
    for doc in DOCS:
        for span in re.findall(r"`([^`\n]+)`", doc.read_text()):
            for written in DOC_METRIC.findall(span):
                if written == "sapo_node" or written.endswith("_"):
                    continue
                parts = re.split(r"\{([^}]*)\}", written)
                choices = [part.split(",") if i % 2 else [part] for i, part in enumerate(parts)]
                for name in ("".join(combo) for combo in itertools.product(*choices)):
                    yield doc.name, written, [name.replace("<service>", s) for s in SERVICES]


def test_docs_name_metrics_the_services_declare() -> None:
    """A name the docs give an operator to look up is one a service exposes: `_total` on counters, a
    histogram by its family or a series; a `<service>` name is exposed by at least one service."""
    exposed = set()
    for service in SERVICES:
        exposed |= declared_metrics(service)
        exposed |= {f.name for f in service_registry(service).collect() if f.type == "histogram"}
    named = list(documented_metrics())
    assert len(named) > 20, "the docs name fewer metrics than they did: DOC_METRIC is out of date"
    unknown = sorted({(doc, written) for doc, written, names in named if not exposed & set(names)})
    assert not unknown, f"metrics the docs name that no service declares: {unknown}"


@pytest.mark.integration
def test_services_export_process_and_python_metrics(
    monkeypatch: pytest.MonkeyPatch, kafka_bootstrap: str
) -> None:
    """The warm-up of the stalled-service alerts reads process_start_time_seconds: every service's
    /metrics must carry the default process and python collectors next to its own series."""
    import urllib.request

    from sapo.runtime import start_runtime
    from sapo.sampler.settings import SamplerSettings

    for name in [n for n in os.environ if n.startswith("SAPO_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SAPO_SAMPLER_KAFKA__BOOTSTRAP_SERVERS", kafka_bootstrap)
    settings = SamplerSettings(node_id="node-0", http_host="127.0.0.1", http_port=0)
    runtime = start_runtime("sampler", settings, install_signals=False)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{runtime.ops.port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        runtime.close()
    for family in (
        "process_start_time_seconds",
        "process_resident_memory_bytes",
        "python_info",
        "python_gc_objects_collected_total",
        "sapo_sampler_messages_produced_total",
    ):
        assert re.search(rf"^{family}[{{ ]", text, re.MULTILINE), family


def test_every_alert_wait_the_values_offer_is_the_wait_of_an_alert() -> None:
    """Each `prometheusRule.thresholds.*For` is how long some alert's condition must hold (its `for`,
    or the range its expression looks back over): a wait written into a rule as a constant would
    ignore the value a team sets."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    waits = sorted(k for k in values["prometheusRule"]["thresholds"] if k.endswith("For"))
    assert "generatorConfigsDivergeFor" in waits
    chosen = {key: f"{101 + i}m" for i, key in enumerate(waits)}  # distinct, and no default's
    sets = [f"prometheusRule.thresholds.{key}={wait}" for key, wait in chosen.items()]
    (rule,) = of_kind(render(None, "prometheusRule.enabled=true", *sets), "PrometheusRule")
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    used = {a.get("for") for a in alerts} | {w for a in alerts for w in re.findall(r"\[(\w+)\]", a["expr"])}
    assert {key: wait for key, wait in chosen.items() if wait not in used} == {}
