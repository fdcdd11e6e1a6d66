"""What a platform team needs from the chart on the first install: a writable cache under a read-only
root, models in the pods, Strimzi topics and user for the API version the cluster serves, mutual TLS,
pods rolled when their Secrets change, the usual knobs (PDB, NetworkPolicy, priority and runtime
classes, spreading, common labels, extra objects), one service switched off for another
implementation, and the generators' autoscaler.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sapo.runtime import consumer_group
from tests.deploy.helm import (
    CHART,
    CI_VALUES,
    KUBE_VERSIONS,
    NAMESPACE,
    ROOT,
    SERVICES,
    container,
    deployment,
    env_of,
    install_notes,
    of_kind,
    render,
    render_files,
    require_tool,
    run,
    template_error,
)

pytestmark = pytest.mark.unit
PLATFORM = CHART / "ci/platform-mtls-values.yaml"


def pod_spec(dep: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = dep["spec"]["template"]["spec"]
    return spec


def env_map(dep: dict[str, Any]) -> dict[str, Any]:
    return {v["name"]: v.get("value", v.get("valueFrom")) for v in env_of(dep)}


# --- caches under a read-only root filesystem ------------------------------------------------------


def test_every_cache_path_is_on_a_writable_volume(scenario: Path) -> None:
    """The images' HOME is read-only in the pods: every cache variable must point into a mounted
    volume that is not read-only, or the services crash at start (Errno 30)."""
    for dep in of_kind(render(scenario), "Deployment"):
        c = container(dep)
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        writable = [m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")]
        env = env_map(dep)
        for var in (
            "SAPO_CACHE_DIR",
            "XDG_CACHE_HOME",
            "HF_HOME",
            "TRITON_CACHE_DIR",
            "MPLCONFIGDIR",
            "VLLM_CACHE_ROOT",
        ):
            assert any(env[var] == p or env[var].startswith(p + "/") for p in writable), (var, env[var])


def test_cache_volume_is_an_emptydir_or_the_given_claim() -> None:
    (volume,) = [v for v in pod_spec(deployment(render(None), "trainer"))["volumes"] if v["name"] == "cache"]
    assert volume == {"name": "cache", "emptyDir": {"sizeLimit": "20Gi"}}
    spec = pod_spec(deployment(render(None, "cache.existingClaim=models-cache"), "trainer"))
    (volume,) = [v for v in spec["volumes"] if v["name"] == "cache"]
    assert volume == {"name": "cache", "persistentVolumeClaim": {"claimName": "models-cache"}}


# --- models ------------------------------------------------------------------------------------------


def test_model_download_init_container_then_offline() -> None:
    docs = render(CHART / "ci/gpu-node-values.yaml")
    for service in ("generator", "trainer"):
        dep = deployment(docs, service)
        (init,) = pod_spec(dep)["initContainers"]
        assert init["args"] == ["hf", "download", "Qwen/Qwen2.5-0.5B-Instruct", "--revision", "main"]
        assert init["image"] == container(dep)["image"]  # the hf CLI comes with the service's image
        init_env = {v["name"]: v.get("value") for v in init["env"]}
        env = env_map(dep)
        assert init_env["HF_HOME"] == env["HF_HOME"]
        assert {m["name"] for m in init["volumeMounts"]} >= {"cache"}
        assert env["HF_HUB_OFFLINE"] == "1"
    assert "initContainers" not in pod_spec(deployment(docs, "sampler"))
    assert "HF_HUB_OFFLINE" not in env_map(deployment(docs, "sampler"))


def test_model_download_needs_a_model_and_passes_a_token_from_a_secret() -> None:
    assert "models.download.enabled needs `model`" in template_error("models.download.enabled=true")
    docs = render(
        None, "model=org/gated", "models.download.enabled=true", "models.download.tokenSecret.name=hf"
    )
    (init,) = pod_spec(deployment(docs, "trainer"))["initContainers"]
    (token,) = [v for v in init["env"] if v["name"] == "HF_TOKEN"]
    assert token["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}


def test_models_volume_is_mounted_read_only_where_the_model_is_loaded() -> None:
    docs = render(PLATFORM)
    for service in ("generator", "trainer"):
        dep = deployment(docs, service)
        (mount,) = [m for m in container(dep)["volumeMounts"] if m["name"] == "models"]
        assert mount == {"name": "models", "mountPath": "/models", "readOnly": True}
        env = env_map(dep)
        assert env[f"SAPO_{service.upper()}_MODEL"].startswith("/models/")
        assert env["HF_HUB_OFFLINE"] == "1"
    sampler = container(deployment(docs, "sampler"))
    assert "models" not in {m["name"] for m in sampler["volumeMounts"]}


# --- Strimzi: API version, topics kept, KafkaUser ACLs ----------------------------------------------


@pytest.mark.parametrize(
    ("api_versions", "expected"),
    [
        ((), "kafka.strimzi.io/v1"),  # no cluster to ask (helm template): v1
        (("kafka.strimzi.io/v1beta2/KafkaTopic",), "kafka.strimzi.io/v1beta2"),  # Strimzi < 0.49
        (("kafka.strimzi.io/v1beta2/KafkaTopic", "kafka.strimzi.io/v1/KafkaTopic"), "kafka.strimzi.io/v1"),
    ],
)
def test_strimzi_api_version_follows_the_cluster(api_versions: tuple[str, ...], expected: str) -> None:
    from tests.deploy.helm import render_with_api_versions

    docs = render_with_api_versions(
        api_versions, "kafkaTopics.enabled=true", "kafkaUser.enabled=true", "kafkaTopics.swarm.create=true"
    )
    strimzi = [d for d in docs if d["kind"] in ("KafkaTopic", "KafkaUser")]
    assert len(strimzi) == 9  # six node topics, the swarm topic, the keys topic, the user
    assert {d["apiVersion"] for d in strimzi} == {expected}


def test_strimzi_api_version_can_be_forced() -> None:
    docs = render(None, "kafkaTopics.enabled=true", "strimzi.apiVersion=kafka.strimzi.io/v1beta2")
    assert {t["apiVersion"] for t in of_kind(docs, "KafkaTopic")} == {"kafka.strimzi.io/v1beta2"}


def test_topics_survive_uninstall_by_default() -> None:
    topics = of_kind(render(None, "kafkaTopics.enabled=true", "kafkaTopics.swarm.create=true"), "KafkaTopic")
    assert all(t["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep" for t in topics)
    topics = of_kind(render(None, "kafkaTopics.enabled=true", "kafkaTopics.keep=false"), "KafkaTopic")
    assert all("annotations" not in t["metadata"] for t in topics)


def acls(user: dict[str, Any]) -> dict[tuple[str, str, str], list[str]]:
    return {
        (a["resource"]["type"], a["resource"]["name"], a["resource"]["patternType"]): a["operations"]
        for a in user["spec"]["authorization"]["acls"]
    }


def test_kafka_user_acls_cover_exactly_the_nodes_topics_and_groups() -> None:
    from sapo.topics import TopicNames

    (user,) = of_kind(render(PLATFORM), "KafkaUser")
    assert user["metadata"]["name"] == "sapo-node-7"
    assert user["metadata"]["namespace"] == "kafka"
    assert user["metadata"]["labels"]["strimzi.io/cluster"] == "swarm"
    assert user["spec"]["authentication"] == {"type": "tls"}
    found = acls(user)
    names = TopicNames.for_node("node-7", "sapo")
    prefix = "sapo.node.node-7."
    # Every topic the node uses is covered; the swarm topic literally, the rest by prefix.
    assert all(t.startswith(prefix) for t in (names.rollouts, names.batches, names.policy, names.dlq))
    assert set(found) == {
        ("topic", prefix, "prefix"),
        ("topic", names.swarm_rollouts, "literal"),
        ("group", "sapo.node-7.", "prefix"),
    }
    assert "Write" in found[("topic", prefix, "prefix")]
    assert found[("group", "sapo.node-7.", "prefix")] == ["Read", "Describe"]


def test_kafka_user_may_read_the_keys_topic_it_follows() -> None:
    """With identity.keysTopic the sampler reads <prefix>.swarm.keys: the user may read it, not write it
    (operators publish keys with their own credentials); without it, no ACL."""
    from sapo.topics import TopicNames

    keys = TopicNames.for_node("node-7", "sapo").swarm_keys
    tofu = ("kafkaUser.enabled=true", "nodeId=node-7", "identity.mode=tofu", "identity.keySecret.name=k")
    following = (*tofu, "identity.keysTopic=true")
    (user,) = of_kind(render(None, *following), "KafkaUser")
    assert acls(user)[("topic", keys, "literal")] == ["Read", "Describe", "DescribeConfigs"]
    (user,) = of_kind(render(None, *tofu), "KafkaUser")
    assert ("topic", keys, "literal") not in acls(user)
    swarm_elsewhere = ("swarmKafka.enabled=true", "swarmKafka.bootstrapServers=swarm:9092")
    (user,) = of_kind(render(None, *following, *swarm_elsewhere), "KafkaUser")
    assert ("topic", keys, "literal") not in acls(user)


def test_consumer_groups_fall_under_the_group_acl() -> None:
    """Every group the services join starts with the prefix the KafkaUser's group ACL allows."""
    (user,) = of_kind(render(None, "kafkaUser.enabled=true", "nodeId=node-7"), "KafkaUser")
    prefixes = [
        acl["resource"]["name"]
        for acl in user["spec"]["authorization"]["acls"]
        if acl["resource"]["type"] == "group" and acl["resource"].get("patternType") == "prefix"
    ]
    for role in ("generator", "generator-policy", "sampler", "sampler-swarm", "trainer"):
        assert any(consumer_group("sapo", "node-7", role).startswith(p) for p in prefixes), role


def test_kafka_user_leaves_the_swarm_topic_to_the_swarm_cluster() -> None:
    (user,) = of_kind(
        render(
            None,
            "kafkaUser.enabled=true",
            "swarmKafka.enabled=true",
            "swarmKafka.bootstrapServers=swarm:9092",
        ),
        "KafkaUser",
    )
    assert [key for key in acls(user) if key[0] == "topic"] == [("topic", "sapo.node.node-0.", "prefix")]


# --- mutual TLS and Secret rotation ------------------------------------------------------------------


def test_a_default_user_name_too_long_for_a_kafka_user_is_refused_not_cut() -> None:
    """Cut to 63 characters, the default names of two nodes whose ids differ past the cut were one
    KafkaUser: one Secret, one set of ACLs. The refusal names what to set, and the name an earlier
    install created."""
    prefix = "topicPrefix=research-lab-sapo-swarm-experiment-2026-q4"
    error = template_error(prefix, "nodeId=gpu-cluster-west-node-001", "kafkaUser.enabled=true")
    assert "set kafkaUser.name (to research-lab-sapo-swarm-experiment-2026-q4-gpu-cluster-west-nod " in error
    named = ("nodeId=gpu-cluster-west-node-001", "kafkaUser.enabled=true", "kafkaUser.name=west-001")
    (user,) = of_kind(render(None, prefix, *named), "KafkaUser")
    assert user["metadata"]["name"] == "west-001"


def test_client_certificate_from_a_secret() -> None:
    for dep in of_kind(render(PLATFORM), "Deployment"):
        c = container(dep)
        prefix = f"SAPO_{c['name'].upper()}_KAFKA__"
        env = env_map(dep)
        assert env[prefix + "SECURITY_PROTOCOL"] == "SSL"
        assert env[prefix + "SSL_CERTIFICATE_LOCATION"] == "/etc/sapo/kafka-client/user.crt"
        assert env[prefix + "SSL_KEY_LOCATION"] == "/etc/sapo/kafka-client/user.key"
        (mount,) = [m for m in c["volumeMounts"] if m["name"] == "kafka-client"]
        assert mount == {"name": "kafka-client", "mountPath": "/etc/sapo/kafka-client", "readOnly": True}
        (volume,) = [v for v in pod_spec(dep)["volumes"] if v["name"] == "kafka-client"]
        assert volume["secret"]["secretName"] == "sapo-node-7"
        assert {i["key"] for i in volume["secret"]["items"]} == {"user.crt", "user.key"}


def test_client_certificate_needs_tls() -> None:
    assert "does not use TLS" in template_error("kafka.clientCertSecret.name=user")


def test_secret_changes_roll_the_pods() -> None:
    """checksum/secrets changes with the referenced Secrets (names here; data via lookup on a cluster),
    and the reloader annotation lists every one of them."""

    def checksum(*sets: str, service: str = "sampler") -> str:
        dep = deployment(render(None, *sets), service)
        value: str = dep["spec"]["template"]["metadata"]["annotations"]["checksum/secrets"]
        return value

    tls = ("kafka.securityProtocol=SSL", "kafka.caSecret.name=ca-v1")
    assert checksum(*tls) == checksum(*tls)
    assert checksum(*tls) != checksum("kafka.securityProtocol=SSL", "kafka.caSecret.name=ca-v2")
    key = ("identity.mode=tofu", "identity.keySecret.name=node-key")
    assert checksum(*tls, service="generator") != checksum(*tls, *key, service="generator")
    for dep in of_kind(render(PLATFORM), "Deployment"):
        annotations = dep["spec"]["template"]["metadata"]["annotations"]
        assert annotations["secret.reloader.stakater.com/reload"] == "sapo-node-7,swarm-cluster-ca-cert"


def test_pod_annotations_are_kept_next_to_the_checksum() -> None:
    dep = deployment(render(None, "podAnnotations.example\\.com/owner=me"), "trainer")
    annotations = dep["spec"]["template"]["metadata"]["annotations"]
    assert annotations["example.com/owner"] == "me"
    assert "checksum/secrets" in annotations


# --- platform knobs ------------------------------------------------------------------------------------


def test_generator_pod_disruption_budget() -> None:
    (pdb,) = of_kind(render(PLATFORM), "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    generators = deployment(render(PLATFORM), "generator")
    assert pdb["spec"]["selector"]["matchLabels"] == generators["spec"]["selector"]["matchLabels"]
    assert not of_kind(render(None), "PodDisruptionBudget")
    both = ("generator.podDisruptionBudget.enabled=true", "generator.podDisruptionBudget.minAvailable=1")
    assert "not both" in template_error(*both)
    (pdb,) = of_kind(
        render(None, *both, "generator.podDisruptionBudget.maxUnavailable="), "PodDisruptionBudget"
    )
    assert pdb["spec"] == {"minAvailable": 1, "selector": pdb["spec"]["selector"]}


NO_SURGE = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}


def test_generators_roll_without_a_surge_pod_where_it_would_wait_for_the_old_ones() -> None:
    """A GPU generator's surge pod waits for the GPU the old pod holds, and one pinned to the trainer's
    node by a ReadWriteOnce volume for room there: the rollout would never finish. Those replace one
    pod at a time; generators free to go anywhere keep Kubernetes' default."""
    gpu = render(CHART / "ci/gpu-node-values.yaml", "checkpoints.accessModes={ReadWriteMany}")
    assert deployment(gpu, "generator")["spec"]["strategy"] == NO_SURGE
    assert deployment(render(None), "generator")["spec"]["strategy"] == NO_SURGE  # the default claim
    free = deployment(render(None, "checkpoints.accessModes={ReadWriteMany}"), "generator")
    assert "strategy" not in free["spec"]
    own = render(None, "generator.strategy.type=RollingUpdate", "generator.strategy.rollingUpdate.maxSurge=2")
    assert deployment(own, "generator")["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 2},
    }
    for service in ("sampler", "trainer"):  # one writer each: never two at once
        assert deployment(own, service)["spec"]["strategy"] == {"type": "Recreate"}


def test_a_generator_strategy_of_recreate_clears_the_rolling_update(tmp_path: Path) -> None:
    """An upgrade patches the Deployment: left out, the rollingUpdate Kubernetes defaulted under the
    earlier rolling strategy would stay, and the API server refuses it next to Recreate."""
    docs = render(None, "generator.strategy.type=Recreate")
    assert deployment(docs, "generator")["spec"]["strategy"] == {"type": "Recreate", "rollingUpdate": None}
    validator = require_tool("kubernetes-validate")
    manifest = tmp_path / "generator.yaml"
    manifest.write_text(yaml.safe_dump(deployment(docs, "generator")))
    for version in KUBE_VERSIONS:
        result = run(validator, "--strict", "--kubernetes-version", version, str(manifest))
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("sets", "complaint"),
    [
        (
            ("generator.strategy.type=Recreate", "generator.strategy.rollingUpdate.maxSurge=1"),
            "type Recreate",
        ),
        (
            (
                "generator.strategy.rollingUpdate.maxSurge=0",
                "generator.strategy.rollingUpdate.maxUnavailable=0%",
            ),
            "both 0",
        ),
        (("generator.strategy.type=Rolling",), "/generator/strategy/type"),
    ],
)
def test_a_generator_strategy_kubernetes_refuses_fails_at_install(
    sets: tuple[str, ...], complaint: str
) -> None:
    assert complaint in template_error(*sets)


def test_network_policy_allows_dns_kafka_and_scrapes_only() -> None:
    docs = render(PLATFORM)
    (policy,) = of_kind(docs, "NetworkPolicy")
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    for dep in of_kind(docs, "Deployment"):
        pod_labels = dep["spec"]["template"]["metadata"]["labels"]
        assert spec["podSelector"]["matchLabels"].items() <= pod_labels.items()
    (ingress,) = spec["ingress"]
    assert ingress["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert ingress["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "monitoring"
    }
    dns, kafka = spec["egress"]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert kafka["ports"] == [{"port": 9093, "protocol": "TCP"}]
    assert kafka["to"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "kafka"}
    with_store = of_kind(
        render(None, "networkPolicy.enabled=true", "networkPolicy.objectStore.enabled=true"), "NetworkPolicy"
    )
    assert with_store[0]["spec"]["egress"][-1]["ports"] == [{"port": 443, "protocol": "TCP"}]
    # A store at an endpoint of its own is reached on its port: MinIO's 9000, a plain-HTTP 80.
    for endpoint, ports in (
        ("http://minio.storage:9000", [443, 9000]),
        ("https://s3.x", [443]),
        ("http://m", [443, 80]),
    ):
        store = ("networkPolicy.enabled=true", "checkpoints.url=s3://b/p", f"checkpoints.endpoint={endpoint}")
        (policy,) = of_kind(render(None, *store), "NetworkPolicy")
        assert [p["port"] for p in policy["spec"]["egress"][-1]["ports"]] == ports, endpoint


def test_network_policy_lets_the_model_download_reach_the_hub() -> None:
    """models.download's init container fetches from the hub over HTTPS: with the NetworkPolicy on,
    its egress opens by itself, as it does for checkpoints.url, instead of the pods waiting forever on
    a download the policy drops."""
    download = ("models.download.enabled=true", "model=HuggingFaceTB/SmolLM2-360M-Instruct")
    (policy,) = of_kind(render(None, "networkPolicy.enabled=true", *download), "NetworkPolicy")
    assert policy["spec"]["egress"][-1] == {"ports": [{"port": 443, "protocol": "TCP"}]}
    (closed,) = of_kind(render(None, "networkPolicy.enabled=true"), "NetworkPolicy")
    assert all(port["port"] != 443 for rule in closed["spec"]["egress"] for port in rule["ports"])


def test_network_policy_lets_the_services_reach_their_bootstrap_servers() -> None:
    """A managed Kafka listens on ports of its own (9094, 9096, ...): the egress rule takes the
    bootstrap servers' ports, of the swarm's cluster too, next to networkPolicy.kafka.ports."""
    sets = (
        "networkPolicy.enabled=true",
        "kafka.bootstrapServers=b-1.msk.example.com:9096\\,b-2.msk.example.com:9096",
        "swarmKafka.enabled=true",
        "swarmKafka.bootstrapServers=[fd00::1]:29092",
    )
    (policy,) = of_kind(render(None, *sets), "NetworkPolicy")
    _dns, kafka = policy["spec"]["egress"]
    assert [p["port"] for p in kafka["ports"]] == [9092, 9093, 9096, 29092]


def test_priority_runtime_class_and_spreading() -> None:
    docs = render(PLATFORM)
    for service in SERVICES:
        spec = pod_spec(deployment(docs, service))
        assert spec["runtimeClassName"] == "kata"
        expected = "sapo-training-critical" if service == "trainer" else "sapo-training"
        assert spec["priorityClassName"] == expected
    (spread,) = pod_spec(deployment(docs, "generator"))["topologySpreadConstraints"]
    assert spread["topologyKey"] == "topology.kubernetes.io/zone"
    generator_labels = deployment(docs, "generator")["spec"]["selector"]["matchLabels"]
    assert spread["labelSelector"] == {"matchLabels": generator_labels}
    assert "topologySpreadConstraints" not in pod_spec(deployment(docs, "trainer"))


def test_common_labels_on_every_object_but_never_in_selectors() -> None:
    docs = render(PLATFORM)
    for doc in docs:
        if doc["kind"] == "ConfigMap":  # the extra object carries its own labels
            continue
        assert doc["metadata"]["labels"]["team"] == "ml-platform", doc["kind"]
    for dep in of_kind(docs, "Deployment"):
        assert "team" not in dep["spec"]["selector"]["matchLabels"]
        assert dep["spec"]["template"]["metadata"]["labels"]["team"] == "ml-platform"


def test_extra_objects_are_templated() -> None:
    (cm,) = of_kind(render(PLATFORM), "ConfigMap")
    assert cm["metadata"] == {"name": "sapo-node-notes", "namespace": NAMESPACE}
    assert cm["data"] == {"node": "node-7"}


@pytest.mark.parametrize(
    ("override", "complaint"),
    [
        ("image.digest=latest", "digest"),
        ("priorityClassName=High_Priority", "priorityClassName"),
        ("generator.podDisruptionBudget.maxUnavailable=-1", "maxUnavailable"),
        ("kafkaUser.authentication=plain", "authentication"),
        ("strimzi.apiVersion=kafka.strimzi.io/v1alpha1", "apiVersion"),
        ("networkPolicy.kafka.ports[0]=0", "ports"),
        ("commonLabels.-bad=x", "-bad"),
        ("kafka.clientCertSecret.cert=user.crt", "cert"),
        ("generator.podDisruptionBudget.maxUnavailable=150%", "maxUnavailable"),
        (
            "commonLabels.app\\.kubernetes\\.io/name=x",
            "app.kubernetes.io/name",
        ),  # would split pods from selectors
        ("podLabels.app\\.kubernetes\\.io/instance=x", "app.kubernetes.io/instance"),
        # the chart's own labels: a second key of the same name made the manifests invalid YAML
        ("commonLabels.app\\.kubernetes\\.io/part-of=ml", "app.kubernetes.io/part-of"),
        ("podLabels.helm\\.sh/chart=x", "helm.sh/chart"),
        ("commonLabels.sapo-swarm\\.io/node-id=x", "sapo-swarm.io/node-id"),
        ("fullnameOverride=Bad_Name", "fullnameOverride"),
        ("nameOverride=UPPER", "nameOverride"),
        ("image.tag=bad:tag", "tag"),
        ("generator.replicas=1000000", "replicas"),
    ],
)
def test_schema_rejects_bad_platform_values(override: str, complaint: str) -> None:
    assert complaint in template_error(override)


@pytest.mark.parametrize(
    "key", ["generator.enabled", "sampler.enabled", "trainer.enabled", "generator.autoscaling"]
)
def test_values_of_an_older_chart_are_refused_not_read_as_a_service_switched_off(key: str) -> None:
    """`helm upgrade --reuse-values` renders with the defaults of the chart a release was installed
    with: a switch a newer chart added is then missing, and must stop the upgrade, naming it, rather
    than read as false and remove the service."""
    parent, _, name = key.rpartition(".")
    error = template_error(f"{key}=null")
    assert f"at '/{parent}': missing property '{name}'" in error


def test_a_label_in_both_common_and_pod_labels_is_refused() -> None:
    """Pods carry both: the key came out twice in their labels (invalid YAML)."""
    assert "podLabels.team repeats commonLabels.team" in template_error(
        "commonLabels.team=a", "podLabels.team=b"
    )
    pods = [
        d["spec"]["template"]
        for d in of_kind(render(None, "commonLabels.team=a", "podLabels.tier=b"), "Deployment")
    ]
    assert pods and all(
        {"team": "a", "tier": "b"}.items() <= pod["metadata"]["labels"].items() for pod in pods
    )


def test_pod_labels_install_with_common_labels_cleared() -> None:
    """`commonLabels: null` (a later values file clearing the map) failed the check above in a
    template type error."""
    pods = [
        d["spec"]["template"]
        for d in of_kind(render(None, "commonLabels=null", "podLabels.team=b"), "Deployment")
    ]
    assert pods and all(pod["metadata"]["labels"]["team"] == "b" for pod in pods)


def test_every_scenario_renders_with_everything_on() -> None:
    for values in CI_VALUES:
        docs = render(
            values, "kafkaTopics.enabled=true", "kafkaUser.enabled=true", "networkPolicy.enabled=true"
        )
        assert of_kind(docs, "KafkaUser") and of_kind(docs, "NetworkPolicy")


def test_kind_overrides_make_every_scenario_installable_on_kind(scenario: Path) -> None:
    """deploy/k8s/kind/kind-values.yaml (the chart-testing recipe) turns off what kind lacks."""
    docs = render_files(scenario, ROOT / "deploy/k8s/kind/kind-values.yaml")
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"ServiceMonitor", "PrometheusRule", "KafkaUser"}
    assert {"KafkaTopic", "Deployment"} <= kinds
    for dep in of_kind(docs, "Deployment"):
        spec = pod_spec(dep)
        c = container(dep)
        assert c["image"] == "sapo-swarm:0.1.0" and c["imagePullPolicy"] == "Never"
        assert not {
            "priorityClassName",
            "runtimeClassName",
            "nodeSelector",
            "tolerations",
            "initContainers",
        } & set(spec)
        assert "nvidia.com/gpu" not in c.get("resources", {}).get("limits", {})
        env = env_map(dep)
        assert env[f"SAPO_{c['name'].upper()}_KAFKA__BOOTSTRAP_SERVERS"] == "sapo-kafka-bootstrap.kafka:9092"
        assert not any(name.endswith(("_MODEL", "SSL_CA_LOCATION", "SASL_PASSWORD")) for name in env)
        claims = [
            v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v
        ]
        assert claims in ([], ["sapo-node-checkpoints"])
        # kind has no Secret or ConfigMap but those the chart makes: none is mounted from elsewhere.
        made = {d["metadata"]["name"] for d in docs if d["kind"] in ("Secret", "ConfigMap")}
        for volume in spec["volumes"]:
            ref = volume.get("secret", {}).get("secretName") or volume.get("configMap", {}).get("name")
            assert ref is None or ref in made, (dep["metadata"]["name"], volume)
    for policy in of_kind(docs, "NetworkPolicy"):  # the kind Kafka's plain-text listener
        assert any(
            {"port": 9092, "protocol": "TCP"} in rule.get("ports", []) for rule in policy["spec"]["egress"]
        )


def test_names_yaml_reads_as_booleans_or_numbers_stay_strings() -> None:
    """A release or name override such as `on` or `12345` is a YAML boolean or number unquoted, which
    Kubernetes refuses as a label value: every label the chart writes stays a string."""

    def labels(node: Any) -> Iterator[tuple[str, Any]]:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("labels", "matchLabels") and isinstance(value, dict):
                    yield from value.items()
                else:
                    yield from labels(value)
        elif isinstance(node, list):
            for item in node:
                yield from labels(item)

    everything = ("kafkaTopics.enabled=true", "kafkaUser.enabled=true", "grafanaDashboard.enabled=true")
    for override in ("nameOverride=on", "nameOverride=no", "strimzi.clusterName=on"):
        found = list(labels(render(None, override, *everything)))
        assert found and all(isinstance(v, str) for _, v in found), [
            kv for kv in found if not isinstance(kv[1], str)
        ]


# --- one service swapped for another implementation -------------------------------------------------

EVERYTHING = (
    "serviceMonitor.enabled=true",
    "prometheusRule.enabled=true",
    "networkPolicy.enabled=true",
    "kafkaTopics.enabled=true",
    "kafkaUser.enabled=true",
    "generator.podDisruptionBudget.enabled=true",
    "grafanaDashboard.enabled=true",
)


def selected_components(obj: dict[str, Any]) -> list[str]:
    """The app.kubernetes.io/component values a ServiceMonitor or NetworkPolicy selects."""
    spec = obj["spec"]
    selector = spec["selector"] if obj["kind"] == "ServiceMonitor" else spec["podSelector"]
    (expression,) = selector["matchExpressions"]
    assert expression["key"] == "app.kubernetes.io/component" and expression["operator"] == "In"
    values: list[str] = expression["values"]
    return values


@pytest.mark.parametrize("service", SERVICES)
def test_a_disabled_service_renders_none_of_its_objects(service: str) -> None:
    """`<service>.enabled=false` leaves out the service's Deployment, Service and PodDisruptionBudget
    and its part of the ServiceMonitor and NetworkPolicy; the objects the node shares (topics,
    KafkaUser, service account, checkpoint volume) and the other two services stay as they were."""
    everything = render(None, *EVERYTHING)
    docs = render(None, *EVERYTHING, f"{service}.enabled=false")
    others = [s for s in SERVICES if s != service]
    of_service = [
        f"{d['kind']}/{d['metadata']['name']}"
        for d in docs
        if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == service
    ]
    assert not of_service
    assert sorted(d["metadata"]["name"] for d in of_kind(docs, "Deployment")) == [
        f"sapo-node-{s}" for s in others
    ]
    for kind in ("ServiceMonitor", "NetworkPolicy"):
        (obj,) = of_kind(docs, kind)
        assert selected_components(obj) == others
    for kind in ("KafkaTopic", "KafkaUser", "ServiceAccount", "PersistentVolumeClaim"):
        assert of_kind(docs, kind) == of_kind(everything, kind), kind
    for other in others:
        if (service, other) != ("trainer", "generator"):  # that one loses its affinity to the trainer
            assert deployment(docs, other) == deployment(everything, other)


def test_generators_without_the_charts_trainer_get_no_affinity_to_it() -> None:
    """With a ReadWriteOnce checkpoint claim the generators must sit with the chart's trainer; without
    that trainer no pod carries its labels and a required affinity would leave them Pending."""
    with_trainer = pod_spec(deployment(render(None), "generator"))
    assert with_trainer["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert "affinity" not in pod_spec(deployment(render(None, "trainer.enabled=false"), "generator"))


@pytest.mark.parametrize("service", ["generator", "trainer"])
def test_notes_keep_the_colocation_a_read_write_once_volume_needs(service: str) -> None:
    """Without the chart's generators or trainer the ones run instead still share the ReadWriteOnce
    claim and so one Kubernetes node: the NOTES say so, and no longer promise a pod affinity."""
    notes = install_notes(f"{service}.enabled=false")
    assert "the checkpoint volume is ReadWriteOnce: every generator must run on the" in notes, notes
    assert "a pod affinity keeps them there" not in notes
    assert "a pod affinity keeps them there" in install_notes()


def test_with_every_service_disabled_only_the_shared_objects_remain() -> None:
    off = ("generator.enabled=false", "sampler.enabled=false", "trainer.enabled=false")
    kinds = {d["kind"] for d in render(None, *EVERYTHING, *off)}
    assert kinds == {"KafkaTopic", "KafkaUser", "ServiceAccount", "PersistentVolumeClaim", "ConfigMap"}


# --- generator autoscaling ---------------------------------------------------------------------------


def test_generators_scale_with_a_horizontal_pod_autoscaler() -> None:
    """autoscaling/v2 on CPU, aimed at the generators' Deployment, which then leaves its replica count
    to the autoscaler (a `replicas` of its own would be reset at every `helm upgrade`)."""
    sets = (
        "generator.autoscaling.enabled=true",
        "generator.autoscaling.minReplicas=2",
        "generator.autoscaling.maxReplicas=6",
        "generator.autoscaling.targetCPUUtilizationPercentage=70",
    )
    docs = render(None, *sets)
    (hpa,) = of_kind(docs, "HorizontalPodAutoscaler")
    generator = deployment(docs, "generator")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["metadata"]["labels"]["app.kubernetes.io/component"] == "generator"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": generator["metadata"]["name"],
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
    (metric,) = hpa["spec"]["metrics"]
    assert metric == {
        "type": "Resource",
        "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}},
    }
    assert "replicas" not in generator["spec"]
    assert all(deployment(docs, s)["spec"]["replicas"] == 1 for s in ("sampler", "trainer"))
    assert not of_kind(render(None), "HorizontalPodAutoscaler")
    assert not of_kind(render(None, *sets, "generator.enabled=false"), "HorizontalPodAutoscaler")


@pytest.mark.parametrize(
    ("overrides", "complaint"),
    [
        (
            ("generator.autoscaling.minReplicas=5", "generator.autoscaling.maxReplicas=3"),
            "generator.autoscaling.minReplicas (5) > maxReplicas (3)",
        ),
        (  # replicas beyond the work topic's partitions would idle
            ("kafkaTopics.enabled=true", "generator.autoscaling.maxReplicas=12"),
            "generator.autoscaling.maxReplicas (12) > kafkaTopics.workPartitions (8)",
        ),
        (
            ("generator.resources.requests=null",),
            "generator.autoscaling needs generator.resources.requests.cpu",
        ),
    ],
)
def test_generator_autoscaling_is_refused_where_it_cannot_work(
    overrides: tuple[str, ...], complaint: str
) -> None:
    error = template_error("generator.autoscaling.enabled=true", *overrides)
    assert complaint in error, error


def test_kafka_topics_with_enough_partitions_take_the_autoscalers_maximum() -> None:
    sets = ("generator.autoscaling.enabled=true", "generator.autoscaling.maxReplicas=12")
    docs = render(None, *sets, "kafkaTopics.enabled=true", "kafkaTopics.workPartitions=12")
    assert of_kind(docs, "HorizontalPodAutoscaler")


@pytest.mark.parametrize("service", ["sampler", "trainer"])
def test_the_single_writers_refuse_autoscaling_and_say_why(service: str) -> None:
    error = template_error(f"{service}.autoscaling.enabled=true")
    assert f"{service}.autoscaling: only the generators scale; the {service} is one writer" in error, error
    assert f"{service}.standby=true" in error
