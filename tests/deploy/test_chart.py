"""The sapo-node Helm chart (deploy/k8s/sapo-node), checked offline: helm lint and helm template for
every ci/ scenario, every rendered core manifest validated with `kubernetes-validate --strict`,
labels and selectors (never the chart version), the Deployments' shape, the env contract checked
against the services' own settings classes, and the values schema refusing typos.

Monitoring objects and Strimzi topics are in test_monitoring.py; helpers in helm.py.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from sapo.cliargs import broker_addresses
from sapo.swarm.manifest import SETTINGS, Service
from tests.deploy.helm import (
    CHART,
    CI_VALUES,
    CRD_API,
    KUBE_VERSIONS,
    NAMESPACE,
    RELEASE,
    SERVICES,
    container,
    deployment,
    env_of,
    install_notes,
    of_kind,
    render,
    require_tool,
    run,
    template_error,
)

pytestmark = pytest.mark.unit


def test_every_scenario_has_a_values_file() -> None:
    names = {p.name for p in CI_VALUES}
    assert names == {
        "minimal-values.yaml",
        "full-monitoring-strimzi-values.yaml",
        "gpu-node-values.yaml",
        "external-sasl-kafka-values.yaml",
        "platform-mtls-values.yaml",
    }


# --- helm lint / template -------------------------------------------------------------------------


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda p: p.name if p else "defaults")
def test_helm_lint(values: Path | None) -> None:
    helm = require_tool("helm")
    args = [helm, "lint", "--strict", str(CHART)] + (["-f", str(values)] if values else [])
    result = run(*args)
    assert result.returncode == 0, result.stdout + result.stderr


def test_scenario_renders_one_node(scenario: Path) -> None:
    docs = render(scenario)
    assert [d["metadata"]["name"].rsplit("-", 1)[1] for d in of_kind(docs, "Deployment")] == list(SERVICES)
    assert len(of_kind(docs, "Service")) == 3
    assert len(of_kind(docs, "ServiceAccount")) == 1
    assert len(of_kind(docs, "PersistentVolumeClaim")) == 1
    for doc in docs:
        if doc["kind"] not in ("KafkaTopic", "KafkaUser", "ConfigMap"):  # may live in another namespace
            assert doc["metadata"]["namespace"] == NAMESPACE


# --- Kubernetes schemas (core kinds; CRDs are checked in test_monitoring.py) -----------------------


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_core_manifests_pass_kubernetes_validate_strict(
    scenario: Path, kube_version: str, tmp_path: Path
) -> None:
    validator = require_tool("kubernetes-validate")
    core = [doc for doc in render(scenario) if doc["kind"] not in CRD_API]
    manifest = tmp_path / "core.yaml"
    manifest.write_text(yaml.safe_dump_all(core))
    result = run(validator, "--strict", "--kubernetes-version", kube_version, str(manifest))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    # Without a schema the tool only warns: a core kind must never get through unchecked.
    assert "Couldn't find schema" not in output, output


# --- labels and selectors -------------------------------------------------------------------------


def chart_version() -> str:
    version: str = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    return version


def selectors(doc: dict[str, Any]) -> list[dict[str, str]]:
    spec = doc.get("spec", {})
    if doc["kind"] == "Deployment":
        return [spec["selector"]["matchLabels"]]
    if doc["kind"] == "Service":
        return [spec["selector"]]
    if doc["kind"] == "ServiceMonitor":
        return [spec["selector"]["matchLabels"]]
    return []


def test_selectors_never_contain_the_chart_version(scenario: Path) -> None:
    version = chart_version()
    docs = render(scenario, "serviceMonitor.enabled=true")
    found = [s for doc in docs for s in selectors(doc)]
    assert found
    for selector in found:
        assert "helm.sh/chart" not in selector and "app.kubernetes.io/version" not in selector
        assert not any(version in value for value in selector.values()), selector


def test_standard_labels_on_every_object(scenario: Path) -> None:
    for doc in render(scenario):
        if doc["metadata"]["name"].endswith("-notes"):  # platform-mtls's extraObject: its own labels
            continue
        labels = doc["metadata"]["labels"]
        assert labels["helm.sh/chart"] == f"sapo-node-{chart_version()}"
        for key in ("name", "instance", "version", "managed-by", "part-of"):
            assert f"app.kubernetes.io/{key}" in labels, (doc["kind"], key)


def test_each_service_selects_its_own_deployment_pods(scenario: Path) -> None:
    docs = render(scenario)
    for svc in of_kind(docs, "Service"):
        matches = [
            dep
            for dep in of_kind(docs, "Deployment")
            if svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert [m["metadata"]["name"] for m in matches] == [svc["metadata"]["name"]]
    for dep in of_kind(docs, "Deployment"):
        pod_labels = dep["spec"]["template"]["metadata"]["labels"]
        assert dep["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


# --- deployments ---------------------------------------------------------------------------------


def test_trainer_and_sampler_are_single_recreated_owners(scenario: Path) -> None:
    """One trainer (checkpoint writer, batch consumer) and one sampler (batch sequence owner) per
    node unless a standby is asked for; an update stops the old pod first, handing its lease over."""
    docs = render(scenario)
    for service in ("trainer", "sampler"):
        dep = deployment(docs, service)
        assert dep["spec"]["replicas"] == 1
        assert dep["spec"]["strategy"] == {"type": "Recreate"}
    trainer = deployment(docs, "trainer")
    mounts = {m["name"]: m for m in container(trainer)["volumeMounts"]}
    assert mounts["checkpoints"]["readOnly"] is False
    gen_mounts = {m["name"]: m for m in container(deployment(docs, "generator"))["volumeMounts"]}
    assert gen_mounts["checkpoints"]["readOnly"] is True
    # Same path in both: the manifest URIs on the policy topic are file:// paths.
    assert gen_mounts["checkpoints"]["mountPath"] == mounts["checkpoints"]["mountPath"]
    assert "checkpoints" not in {m["name"] for m in container(deployment(docs, "sampler"))["volumeMounts"]}


def test_probes_and_port(scenario: Path) -> None:
    for dep in of_kind(render(scenario), "Deployment"):
        c = container(dep)
        assert c["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
        assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
        # The program is in args, so the image's entrypoint (tini) stays PID 1.
        assert "command" not in c
        assert c["args"] == [f"sapo-{c['name']}"]
        assert dep["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_trainer_grace_period_is_configurable() -> None:
    docs = render(None, "trainer.terminationGracePeriodSeconds=3600")
    assert deployment(docs, "trainer")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 3600


STOP_MARGIN_S = 30
"""What a grace period leaves a stopping service besides `STOP_BROKER_WAIT_S`: Kubernetes' default
grace period, for the unit in hand and closing."""


def test_every_grace_period_leaves_room_for_the_wait_for_a_broker_that_is_gone(scenario: Path) -> None:
    """A service stopping with its broker gone waits up to STOP_BROKER_WAIT_S for it after its unit in
    hand; a grace period with no room for that turns the clean stop into a SIGKILL."""
    docs = render(scenario)
    for service in SERVICES:
        dep = deployment(docs, service)
        variable = f"SAPO_{service.upper()}_STOP_BROKER_WAIT_S"
        set_to = [e["value"] for e in env_of(dep) if e["name"] == variable and "value" in e]
        default = SETTINGS[service].model_fields["stop_broker_wait_s"].default
        wait = float(set_to[0]) if set_to else default
        grace = dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace >= wait + STOP_MARGIN_S, f"{service}: {grace} s of grace, {wait} s of waiting"


def test_gpu_node_sets_image_resource_and_device_together() -> None:
    """generator.gpu and trainer.gpu each switch image, GPU limit and backend/device at once."""
    docs = render(CHART / "ci/gpu-node-values.yaml")
    gpu_image = "registry.example.com/sapo/sapo-swarm-gpu:0.1.0"
    gen = container(deployment(docs, "generator"))
    assert gen["image"] == gpu_image
    assert gen["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {"name": "SAPO_GENERATOR_BACKEND", "value": "vllm"} in gen["env"]
    assert "shm" in {m["name"] for m in gen["volumeMounts"]}
    trainer = container(deployment(docs, "trainer"))
    assert trainer["image"] == gpu_image
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {"name": "SAPO_TRAINER_DEVICE", "value": "cuda"} in trainer["env"]
    # The sampler keeps the CPU image.
    assert container(deployment(docs, "sampler"))["image"] == "sapo-swarm:0.1.0"


@pytest.mark.parametrize("service", ["generator", "trainer"])
def test_each_gpu_service_sizes_its_own_shared_memory(service: str) -> None:
    docs = render(CHART / "ci/gpu-node-values.yaml", f"{service}.gpu.shmSizeLimit=16Gi")
    volumes = {v["name"]: v for v in deployment(docs, service)["spec"]["template"]["spec"]["volumes"]}
    assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}


@pytest.mark.parametrize("service", ["generator", "trainer"])
def test_cpu_image_never_gets_a_gpu_setting(service: str) -> None:
    """DEVICE=cuda or BACKEND=vllm only come with the GPU image: on the CPU image they crash."""
    for values in CI_VALUES:
        c = container(deployment(render(values), service))
        gpu_env = {"SAPO_TRAINER_DEVICE": "cuda", "SAPO_GENERATOR_BACKEND": "vllm"}
        has_gpu_setting = any(v["name"] in gpu_env and gpu_env[v["name"]] == v.get("value") for v in c["env"])
        assert has_gpu_setting == ("gpu" in c["image"]), (values.name, c["image"])


def test_model_is_set_once_for_generator_and_trainer() -> None:
    docs = render(None, "model=Qwen/Qwen2.5-0.5B-Instruct")
    for service in ("generator", "trainer"):
        env = env_of(deployment(docs, service))
        assert {"name": f"SAPO_{service.upper()}_MODEL", "value": "Qwen/Qwen2.5-0.5B-Instruct"} in env
    assert not [v for v in env_of(deployment(docs, "sampler")) if v["name"].endswith("_MODEL")]


@pytest.mark.parametrize(
    ("sets", "image"),
    [
        ((), "sapo-swarm:0.1.0"),
        (("image.registry=registry.example.com", "image.tag=1.2.3"), "registry.example.com/sapo-swarm:1.2.3"),
        (
            ("image.registry=r.example.com", "global.imageRegistry=mirror:5000"),
            "mirror:5000/sapo-swarm:0.1.0",
        ),
        (("image.digest=sha256:" + "a" * 64, "image.tag=ignored"), "sapo-swarm@sha256:" + "a" * 64),
    ],
)
def test_image_reference(sets: tuple[str, ...], image: str) -> None:
    for service in SERVICES:
        assert container(deployment(render(None, *sets), service))["image"] == image


def test_one_service_image_can_be_swapped() -> None:
    docs = render(None, "sampler.image.repository=example.org/my-sampler", "sampler.image.tag=2.0")
    assert container(deployment(docs, "sampler"))["image"] == "example.org/my-sampler:2.0"
    assert container(deployment(docs, "generator"))["image"] == "sapo-swarm:0.1.0"


def test_rwo_checkpoints_pin_generators_to_the_trainer_node() -> None:
    rwo = deployment(render(None), "generator")["spec"]["template"]["spec"]
    term = rwo["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "trainer"
    rwx = deployment(render(None, "checkpoints.accessModes={ReadWriteMany}"), "generator")
    assert "affinity" not in rwx["spec"]["template"]["spec"]


def test_own_generator_affinity_keeps_the_pin_to_the_trainer_node() -> None:
    """A generator.affinity of one's own must not drop the pin: a generator elsewhere would hang on
    the ReadWriteOnce volume's Multi-Attach."""
    gpu_nodes = {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}
    docs = render(
        None,
        "generator.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchExpressions[0].key=gpu",
        "generator.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
    )
    affinity = deployment(docs, "generator")["spec"]["template"]["spec"]["affinity"]
    node_affinity = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert node_affinity["nodeSelectorTerms"] == [gpu_nodes]
    [term] = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "trainer"


STORE = (
    "checkpoints.url=s3://ckpt/sapo",
    "checkpoints.existingSecret=ckpt-creds",
    "checkpoints.endpoint=http://minio.storage:9000",
    "checkpoints.region=eu-west-1",
)


def test_object_store_checkpoints_need_no_volume() -> None:
    """With checkpoints.url: the trainer writes there, generators load from there with the same
    credentials and endpoint; no claim, no checkpoint mount, no pin to the trainer's node."""
    docs = render(None, *STORE, "networkPolicy.enabled=true")
    assert not of_kind(docs, "PersistentVolumeClaim")
    for service in SERVICES:
        pod = deployment(docs, service)["spec"]["template"]["spec"]
        assert "checkpoints" not in {v["name"] for v in pod["volumes"]}
        assert "affinity" not in pod
        env = {v["name"]: v.get("value") for v in env_of(deployment(docs, service))}
        env_from = container(deployment(docs, service)).get("envFrom", [])
        if service == "sampler":  # never touches the store
            assert not env_from and "AWS_ENDPOINT_URL" not in env
            continue
        assert env_from == [{"secretRef": {"name": "ckpt-creds"}}]
        assert env["AWS_ENDPOINT_URL"] == "http://minio.storage:9000"
        assert env["AWS_DEFAULT_REGION"] == "eu-west-1"
        annotations = deployment(docs, service)["spec"]["template"]["metadata"]["annotations"]
        assert (
            annotations["checksum/secrets"]
            != deployment(render(None), service)["spec"]["template"]["metadata"]["annotations"][
                "checksum/secrets"
            ]
        )  # a changed credentials Secret rolls the pod
    trainer_env = {v["name"]: v.get("value") for v in env_of(deployment(docs, "trainer"))}
    assert trainer_env["SAPO_TRAINER_CHECKPOINT_ROOT"] == "s3://ckpt/sapo"
    [policy] = of_kind(docs, "NetworkPolicy")
    assert any(port.get("port") == 443 for rule in policy["spec"]["egress"] for port in rule["ports"])


@pytest.mark.parametrize(
    ("sets", "complaint"),
    [
        # credentials for a store the checkpoints are not in would be ignored
        (("checkpoints.existingSecret=ckpt-creds",), "checkpoints.existingSecret is for an object store"),
        (("checkpoints.url=s3://ckpt/sapo", "checkpoints.existingClaim=ckpt"), "set one of them"),
        # the trainer could not write, or the generators could not mount what it writes
        (("checkpoints.accessModes={ReadOnlyMany}",), "the trainer writes the checkpoints"),
        (("checkpoints.accessModes={ReadWriteOncePod}",), "lets a single pod mount the claim"),
    ],
)
def test_checkpoint_values_that_cannot_work_fail_at_install(sets: tuple[str, ...], complaint: str) -> None:
    assert complaint in template_error(*sets)


def test_a_recreated_service_s_rollout_outlasts_its_grace_period() -> None:
    """Recreate starts the new pod once the old one stopped, which may take the grace period: with
    Kubernetes' default deadline (600 s) under the trainer's 1200 s grace, a rollout beside a long
    step was reported failed while it went on. By default the deadline follows the grace period."""
    docs = render(None)
    for component in ("generator", "sampler", "trainer"):
        spec = deployment(docs, component)["spec"]
        assert spec["progressDeadlineSeconds"] > spec["template"]["spec"]["terminationGracePeriodSeconds"]
    hour = "trainer.terminationGracePeriodSeconds=3600"
    assert deployment(render(None, hour), "trainer")["spec"]["progressDeadlineSeconds"] == 4200
    error = template_error("trainer.progressDeadlineSeconds=1200")
    assert "trainer.progressDeadlineSeconds=1200 must exceed" in error
    raised = render(None, hour, "trainer.progressDeadlineSeconds=7200")
    assert deployment(raised, "trainer")["spec"]["progressDeadlineSeconds"] == 7200


def test_a_file_url_is_a_volume_the_operator_mounts() -> None:
    """`file://` names a path the pods share through extraVolumes (an NFS export, a hostPath on one
    machine): the chart makes no claim for it and refuses nothing."""
    docs = render(None, "checkpoints.url=file:///mnt/checkpoints")
    assert not of_kind(docs, "PersistentVolumeClaim")


def test_a_single_pod_claim_serves_a_trainer_without_generators() -> None:
    docs = render(None, "checkpoints.accessModes={ReadWriteOncePod}", "generator.enabled=false")
    (claim,) = of_kind(docs, "PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteOncePod"]


def test_standbys_wait_on_the_lease() -> None:
    docs = render(None, *STORE, "trainer.standby=true", "sampler.standby=true")
    for service in ("trainer", "sampler"):
        dep = deployment(docs, service)
        assert dep["spec"]["replicas"] == 2
        assert dep["spec"]["strategy"] == {"type": "Recreate"}
    rwx = render(None, "trainer.standby=true", "checkpoints.accessModes={ReadWriteMany}")
    assert deployment(rwx, "trainer")["spec"]["replicas"] == 2


def test_install_notes_ask_for_the_swarm_size_until_it_is_set() -> None:
    notes = install_notes()
    assert notes.startswith('SAPO node "node-0" is deployed')
    assert "NOTE: sampler.settings.EXPECTED_PEERS is not set" in notes
    for peers in ("0", "2"):
        assert "EXPECTED_PEERS" not in install_notes(f"sampler.settings.EXPECTED_PEERS={peers}")


def test_install_notes_warn_when_the_trainers_grace_period_is_shorter_than_its_longest_step() -> None:
    """A stop during a step longer than the grace period ends in SIGKILL, and the step is trained again."""
    long_steps = "trainer.settings.STEP_MAX_SILENCE_S=3000"
    assert "trainer.terminationGracePeriodSeconds (1200) is shorter" in install_notes(long_steps)
    assert "terminationGracePeriodSeconds" not in install_notes(
        long_steps, "trainer.terminationGracePeriodSeconds=3600"
    )
    assert "terminationGracePeriodSeconds" not in install_notes()


def test_tofu_pins_kept_on_a_volume_of_the_sampler() -> None:
    def env(dep: dict[str, Any]) -> dict[str, Any]:
        return {v["name"]: v.get("value") for v in env_of(dep)}

    tofu = ("identity.mode=tofu", "identity.keySecret.name=k")
    on_claim = render(None, *tofu, "cache.existingClaim=c", "identity.pinsFile=/var/cache/sapo/pins.json")
    assert (
        env(deployment(on_claim, "sampler"))["SAPO_SAMPLER_IDENTITY__PINS_FILE"]
        == "/var/cache/sapo/pins.json"
    )
    mounted = (
        "sampler.extraVolumes[0].name=pins",
        "sampler.extraVolumes[0].persistentVolumeClaim.claimName=pins",
        "sampler.extraVolumeMounts[0].name=pins",
        "sampler.extraVolumeMounts[0].mountPath=/pins",
    )
    docs = render(None, *tofu, *mounted, "identity.pinsFile=/pins/pins.json")
    assert env(deployment(docs, "sampler"))["SAPO_SAMPLER_IDENTITY__PINS_FILE"] == "/pins/pins.json"
    assert "SAPO_GENERATOR_IDENTITY__PINS_FILE" not in env(deployment(docs, "generator"))


def test_install_notes_create_topics_that_take_the_message_size_and_name_the_users_credentials() -> None:
    """The topics command NOTES give makes topics that take the services' largest message and have
    the work partitions the NOTES announce; a tls-external KafkaUser gets no Secret from the User
    Operator, and NOTES do not promise one."""
    assert "--max-message-bytes 4194304`" in install_notes("maxMessageBytes=4194304")
    notes = install_notes("kafkaTopics.workPartitions=16", "generator.replicas=12")
    assert "work (16 partitions" in notes and "--work-partitions 16 " in notes
    tls = install_notes("kafkaUser.enabled=true")
    assert "the User Operator writes its credentials" in tls
    external = install_notes("kafkaUser.enabled=true", "kafkaUser.authentication=tls-external")
    assert "writes no credentials" in external and "writes its credentials" not in external


def test_install_notes_ask_to_copy_the_strimzi_secrets_into_the_release_namespace() -> None:
    """A KafkaUser's Secret and Strimzi's cluster CA Secret live in the Kafka namespace, which pods
    of another namespace cannot mount."""
    apart = install_notes("kafkaUser.enabled=true", "strimzi.namespace=kafka", "strimzi.clusterName=main")
    copy = "copy the user's Secret and the cluster CA Secret\n  (main-cluster-ca-cert)"
    assert f"{copy} from kafka into {NAMESPACE}" in apart
    assert "copy the user's Secret" not in install_notes(
        "kafkaUser.enabled=true", f"strimzi.namespace={NAMESPACE}"
    )


# --- env contract --------------------------------------------------------------------------------


def test_secrets_come_from_secret_refs_only(scenario: Path) -> None:
    for dep in of_kind(render(scenario), "Deployment"):
        for var in env_of(dep):
            if var["name"].endswith(("SASL_PASSWORD", "KEY_PASSWORD")):
                assert set(var) == {"name", "valueFrom"}, var
                assert set(var["valueFrom"]) == {"secretKeyRef"}


def test_common_env_on_every_service(scenario: Path) -> None:
    config = yaml.safe_load(scenario.read_text())
    for service in SERVICES:
        env = {v["name"]: v for v in env_of(deployment(render(scenario), service))}
        prefix = f"SAPO_{service.upper()}_"
        for field in ("NODE_ID", "TOPIC_PREFIX", "HTTP_PORT", "LOG_FORMAT", "KAFKA__BOOTSTRAP_SERVERS"):
            assert prefix + field in env, (service, field)
        assert env[prefix + "NODE_ID"]["value"] == config["nodeId"]
        assert env[prefix + "HTTP_PORT"]["value"] == "8080"
        assert env[prefix + "LOG_FORMAT"]["value"] == "json"
        assert (prefix + "SWARM_KAFKA__BOOTSTRAP_SERVERS" in env) == bool(
            config.get("swarmKafka", {}).get("enabled")
        )
        names = [v["name"] for v in env_of(deployment(render(scenario), service))]
        assert len(names) == len(set(names)), "duplicate env names"


@pytest.mark.parametrize("service", SERVICES)
def test_rendered_env_is_accepted_by_the_service_settings(
    scenario: Path, service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every SAPO_<SERVICE>_* variable the chart sets is a real, valid setting of that service:
    a misspelt top-level name would otherwise be silently ignored by pydantic-settings."""
    cls = SETTINGS[service]
    prefix = f"SAPO_{service.upper()}_"
    env = env_of(deployment(render(scenario), service))
    own = {v["name"].removeprefix(prefix): v for v in env if v["name"].startswith(prefix)}
    unknown = sorted(name for name in own if name.split("__")[0].lower() not in cls.model_fields)
    assert not unknown, f"{cls.__name__} has no field for {[prefix + n for n in unknown]}"
    for name in [n for n in os.environ if n.startswith("SAPO_")]:
        monkeypatch.delenv(name)
    for name, var in own.items():
        monkeypatch.setenv(prefix + name, var.get("value", "secret-from-kubernetes"))
    cls()  # raises ValidationError with the offending variable


# --- values schema -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "complaint"),
    [
        ("generator.replica=2", "replica"),  # typo of replicas
        ("trainer.replicas=2", "replicas"),  # one trainer (standby: a second one that waits)
        ("sampler.replicas=2", "replicas"),  # so is the sampler
        ("checkpoints.url=bucket/prefix", "url"),  # a URL names its scheme
        ("kafka.bootstrapServer=x:9092", "bootstrapServer"),
        # A broker list the services refuse at start (sapo.cliargs.broker_addresses).
        ("kafka.bootstrapServers=kafka:99999", "bootstrapServers"),
        ("kafka.bootstrapServers=http://kafka:9092", "bootstrapServers"),
        ("swarmKafka.bootstrapServers=swarm:0", "bootstrapServers"),
        ("serviceMonitor.enable=true", "enable"),
        ("kafka.securityProtocol=SASL", "securityProtocol"),
        ("nodeId=Node_0", "nodeId"),
        ("nodeId=node-", "nodeId"),  # also the value of a label, which must end in a letter or digit
        # Helm 4 names the key, Helm 3 only the map.
        ("sampler.settings.KAFKA__SASL_PASSWORD=hunter2", "KAFKA__SASL_PASSWORD|sampler.settings"),
        ("generator.settings.NODE_ID=other", "NODE_ID|generator.settings"),  # set by the chart
        ("sampler.settings.IDENTITY__MODE=off", "IDENTITY__MODE|sampler.settings"),  # so is identity
        ("identity.mode=paranoid", "mode"),
        # A setting's bounds and number type, from its settings class (scripts/gen_chart_schema.py).
        ("generator.settings.MAX_NEW_TOKENS=60000000", "MAX_NEW_TOKENS"),  # le=32768
        ("trainer.settings.WARMUP_STEPS=-1", "WARMUP_STEPS"),  # ge=0
        ("sampler.settings.LOCAL_GROUPS=true", "LOCAL_GROUPS"),  # a boolean is no number
        # Resource quantities as Kubernetes reads them (the API server would refuse these at apply).
        ("trainer.resources.limits.memory=2GB", "memory"),
        ("generator.resources.requests.cpu=-1", "cpu"),
        ("sampler.resources.requests.memory=lots", "memory"),
    ],
)
def test_schema_rejects(override: str, complaint: str) -> None:
    """values.schema.json catches typos and values the services would refuse, at install time."""
    error = template_error(override)
    assert re.search(complaint, error), error


BROKER_LISTS = (
    "kafka:9092",
    "a.b-c_d.svc.cluster.local:1,10.0.0.1:65535,[::1]:9093",
    "SASL_SSL://lab-kafka-bootstrap.kafka:9093",
    "b-1.msk.abc123.c2.kafka.us-east-1.amazonaws.com.:9098,[::ffff:10.0.0.1]:9092,[fe80::1:2]:1",
    # Read as the services read a list: entries trimmed, empty ones skipped.
    "a:9092, b:9093",
    " kafka:9092 ",
    "kafka:9092,",
    "kafka:9092,,x:1",
    "kafka:99999",
    "kafka:65536",
    "kafka:0",
    "http://kafka:9092",
    "kafka:9092/",
    "b\u00fccher.example:9092",
    "[kafka]:9092",
    "kafka:9092, x",
    "kafka",  # the services take port 9092; the chart wants it named
    "kafka:09092",  # so do they 9092; the chart wants no leading zero
    "kafka..svc:9092",
    ".kafka:9092",
    f"{'a' * 64}.kafka:9092",
    "[10.0.0.1]:9092",
    "[::::]:9092",
    "[1:2:3:4:5:6:7:8:9]:9092",
    "[::1.2.3.256]:9092",
    f"{'a' * 63}.{'b' * 63}.{'c' * 63}.{'d' * 62}:9092",  # labels of 63, but a host of 254 characters
    f"{'a' * 63}.{'b' * 63}.{'c' * 63}.{'d' * 61}.:9092",  # the trailing dot counts
)


def broker_list_error(field: str, value: str) -> str:
    """stderr of `helm template` with `value` as the connection's bootstrapServers ("" if it renders)."""
    helm = require_tool("helm")
    escaped = value.replace(",", "\\,")  # --set splits at unescaped commas
    result = run(helm, "template", RELEASE, str(CHART), "--set-string", f"{field}.bootstrapServers={escaped}")
    return result.stderr if result.returncode else ""


@pytest.mark.parametrize("field", ["kafka", "swarmKafka"])
def test_the_chart_takes_no_broker_list_the_services_refuse(field: str) -> None:
    """The chart's broker check (hand-written: the connections are the chart's own values, not
    generated settings) is the services' rule or stricter, so a list they would refuse at start,
    naming KAFKA__BOOTSTRAP_SERVERS in a crash loop, fails `helm install` instead (swarmKafka's while
    it is off too). A scheme is checked against the security protocol apart."""
    taken = [
        value for value in BROKER_LISTS if "is not a broker address" not in broker_list_error(field, value)
    ]
    for value in taken:
        broker_addresses(value)  # raises for a list the services refuse
    assert taken == list(BROKER_LISTS[:8])


@pytest.mark.parametrize(
    ("field", "value", "entry"),
    [("kafka", "kafka", "kafka"), ("kafka", "a:9092, b:99999", "b:99999"), ("swarmKafka", "s:9092,s", "s")],
)
def test_a_wrong_broker_list_is_named_with_the_form_expected(field: str, value: str, entry: str) -> None:
    """The refusal names the value, the entry at fault and the form wanted, in one line: not the
    regular expression, which a schema pattern's refusal would print whole."""
    stderr = broker_list_error(field, value)
    error = stderr.strip().splitlines()[0]
    assert f'{field}.bootstrapServers="{value}": "{entry}" is not a broker address' in error, stderr
    assert "expected host:port[,host:port...]" in error
    assert len(stderr) < 400 and "[0-9]" not in stderr, stderr


@pytest.mark.parametrize("value", [",", " , "])
def test_a_broker_list_of_no_broker_is_refused(value: str) -> None:
    """A list of nothing but commas and spaces passes `required` but names no broker: the services
    would refuse it at start."""
    error = broker_list_error("kafka", value)
    assert f'kafka.bootstrapServers="{value}" names no broker' in error, error


def test_the_network_policy_opens_the_port_of_every_broker_of_a_spaced_list() -> None:
    """Each entry's port is read from the trimmed entry, so a space after a comma loses no port."""
    docs = render(None, "kafka.bootstrapServers=a:9092\\, b:9096 ", "networkPolicy.enabled=true")
    [policy] = of_kind(docs, "NetworkPolicy")
    ports = {p["port"] for rule in policy["spec"]["egress"] for p in rule.get("ports", [])}
    assert {9092, 9096} <= ports, ports


def test_settings_at_their_bounds_or_given_as_text_install(tmp_path: Path) -> None:
    """The bounds the schema takes from the settings classes are inclusive where theirs are, and a
    number given as a string (quoted in a values file) is left to the service."""
    values = tmp_path / "values.yaml"
    values.write_text('sampler:\n  settings:\n    LOCAL_GROUPS: "4"\n')
    sets = ("generator.settings.MAX_NEW_TOKENS=32768", "trainer.settings.WARMUP_STEPS=0")
    docs = render(values, *sets)
    env = {v["name"]: v.get("value") for s in SERVICES for v in env_of(deployment(docs, s))}
    assert env["SAPO_GENERATOR_MAX_NEW_TOKENS"] == "32768"
    assert env["SAPO_TRAINER_WARMUP_STEPS"] == "0"
    assert env["SAPO_SAMPLER_LOCAL_GROUPS"] == "4"


@pytest.mark.parametrize(
    ("overrides", "complaint"),
    [
        (("kafka.securityProtocol=SASL_SSL",), "needs kafka.sasl.mechanism"),
        (
            ("kafka.securityProtocol=SASL_SSL", "kafka.sasl.mechanism=SCRAM-SHA-512"),
            "kafka.sasl.passwordSecret.name",
        ),
        (("swarmKafka.enabled=true",), "SWARM_KAFKA bootstrapServers is required"),
        (  # the services refuse a broker whose scheme is not the security protocol
            ("kafka.bootstrapServers=a:9092\\,SASL_SSL://b:9093",),
            "kafka.bootstrapServers names the scheme SASL_SSL:// but kafka.securityProtocol=PLAINTEXT",
        ),
        (
            (
                "swarmKafka.enabled=true",
                "swarmKafka.bootstrapServers=SSL://s:9093",
                "swarmKafka.securityProtocol=SASL_SSL",
                "swarmKafka.sasl.mechanism=OAUTHBEARER",
            ),
            "swarmKafka.bootstrapServers names the scheme SSL:// but swarmKafka.securityProtocol=SASL_SSL",
        ),
        (("kafka.caSecret.name=ca",), "does not use TLS"),
        (
            (
                "kafka.sasl.mechanism=SCRAM-SHA-512",
                "kafka.sasl.username=u",
                "kafka.sasl.passwordSecret.name=p",
            ),
            "kafka.sasl is set but kafka.securityProtocol=PLAINTEXT does not use SASL",
        ),
        (
            (
                "swarmKafka.enabled=true",
                "swarmKafka.bootstrapServers=s:9093",
                "swarmKafka.securityProtocol=SSL",
                "swarmKafka.sasl.username=u",
            ),
            "swarmKafka.sasl is set but swarmKafka.securityProtocol=SSL does not use SASL",
        ),
        (("model=m", "trainer.settings.MODEL=other"), "set the model once"),
        (("identity.mode=tofu",), "a verifying node must sign; set identity.keySecret.name"),
        (("identity.mode=strict", "identity.keySecret.name=k"), "set identity.trustConfigMap.name"),
        (("identity.keysTopic=true",), "identity.keysTopic=true needs identity.mode strict or tofu"),
        (("identity.pinsFile=/p/pins.json",), "identity.pinsFile is kept by identity.mode=tofu only"),
        (
            ("serviceMonitor.enabled=true", "serviceMonitor.interval=30s", "serviceMonitor.scrapeTimeout=1m"),
            "serviceMonitor.scrapeTimeout (1m) is longer than serviceMonitor.interval (30s)",
        ),
        (
            (
                "identity.mode=tofu",
                "identity.keySecret.name=k",
                "identity.pinsFile=/var/cache/sapo/pins.json",
            ),
            "is on no volume that outlives the sampler pod",  # the default cache is an emptyDir
        ),
        (("trainer.standby=true",), "trainer.standby needs checkpoints.url or a ReadWriteMany claim"),
        (("checkpoints.endpoint=http://minio:9000",), "checkpoints.endpoint is for an object store"),
        (("checkpoints.region=eu-west-1",), "checkpoints.region is for an object store"),
        (
            ("kafkaTopics.enabled=true", "generator.replicas=12"),
            "generator.replicas (12) > kafkaTopics.workPartitions (8)",
        ),
    ],
)
def test_inconsistent_kafka_settings_fail_at_install(overrides: tuple[str, ...], complaint: str) -> None:
    assert complaint in template_error(*overrides)


OAUTHBEARER = ("kafka.securityProtocol=SASL_SSL", "kafka.sasl.mechanism=OAUTHBEARER")


def test_oauthbearer_needs_the_token_properties_of_every_service() -> None:
    """No value of the chart configures an OAUTHBEARER token: without librdkafka's sasl.oauthbearer.*
    properties (KAFKA__EXTRA) the services could never authenticate, so the chart asks for them."""
    assert "give generator.extraEnv the variable SAPO_GENERATOR_KAFKA__EXTRA" in template_error(*OAUTHBEARER)
    extra = [
        f"{service}.extraEnv[0].name=SAPO_{service.upper()}_KAFKA__EXTRA,"
        f"{service}.extraEnv[0].valueFrom.secretKeyRef.name=oidc,"
        f"{service}.extraEnv[0].valueFrom.secretKeyRef.key={service}"
        for service in SERVICES
    ]
    assert "give trainer.extraEnv" in template_error(*OAUTHBEARER, *extra[:2])
    docs = render(None, *OAUTHBEARER, *extra)
    for service in SERVICES:
        env = {v["name"]: v for v in env_of(deployment(docs, service))}
        assert env[f"SAPO_{service.upper()}_KAFKA__EXTRA"]["valueFrom"]["secretKeyRef"]["key"] == service
    swarm = (
        "swarmKafka.enabled=true",
        "swarmKafka.bootstrapServers=s:9093",
        "swarmKafka.securityProtocol=SASL_SSL",
    )
    error = template_error(*swarm, "swarmKafka.sasl.mechanism=OAUTHBEARER")
    assert "swarmKafka.sasl.mechanism=OAUTHBEARER" in error and "SAPO_GENERATOR_SWARM_KAFKA__EXTRA" in error


def test_oauthbearer_token_properties_may_come_one_variable_each() -> None:
    """The services read KAFKA__EXTRA as one JSON object or one property a variable
    (SAPO_<SERVICE>_KAFKA__EXTRA__<property>, say each from its own Secret key): either brings the
    token's properties."""
    one_by_one = [
        f"{service}.extraEnv[0].name=SAPO_{service.upper()}_KAFKA__EXTRA__SASL.OAUTHBEARER.CLIENT.SECRET,"
        f"{service}.extraEnv[0].valueFrom.secretKeyRef.name=oidc,"
        f"{service}.extraEnv[0].valueFrom.secretKeyRef.key=secret"
        for service in SERVICES
    ]
    assert len(of_kind(render(None, *OAUTHBEARER, *one_by_one), "Deployment")) == len(SERVICES)
    assert "give sampler.extraEnv" in template_error(*OAUTHBEARER, one_by_one[0], one_by_one[2])
    # A variable that only begins like it is another setting's.
    other = one_by_one[1].replace("KAFKA__EXTRA__SASL", "KAFKA__EXTRASASL")
    assert "give sampler.extraEnv" in template_error(*OAUTHBEARER, one_by_one[0], other, one_by_one[2])


def test_the_private_key_reaches_the_generator_only_and_the_trust_list_the_sampler_only() -> None:
    docs = render(
        None,
        "identity.mode=strict",
        "identity.keySecret.name=node-0-key",
        "identity.trustConfigMap.name=swarm-trust",
        "identity.keysTopic=true",
    )
    mounted: dict[str, dict[str, str | None]] = {}
    for service in SERVICES:
        dep = deployment(docs, service)
        volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
        mounts = {m["name"]: m["mountPath"] for m in container(dep)["volumeMounts"]}
        env = {v["name"]: v.get("value") for v in env_of(dep)}
        mounted[service] = {k: v for k, v in env.items() if "IDENTITY__" in k}
        if service == "generator":
            assert volumes["identity-key"]["secret"]["defaultMode"] == 0o400
            assert env["SAPO_GENERATOR_IDENTITY__PRIVATE_KEY_FILE"] == f"{mounts['identity-key']}/node.key"
        else:
            assert "identity-key" not in volumes
        if service == "sampler":
            assert volumes["identity-trust"]["configMap"]["name"] == "swarm-trust"
            assert env["SAPO_SAMPLER_IDENTITY__TRUST_FILE"] == f"{mounts['identity-trust']}/trust.yaml"
        else:
            assert "identity-trust" not in volumes
    key_file = "/etc/sapo/identity/key/node.key"
    assert mounted["generator"] == {"SAPO_GENERATOR_IDENTITY__PRIVATE_KEY_FILE": key_file}
    assert mounted["sampler"] == {
        "SAPO_SAMPLER_IDENTITY__MODE": "strict",
        "SAPO_SAMPLER_IDENTITY__TRUST_FILE": "/etc/sapo/identity/trust/trust.yaml",
        "SAPO_SAMPLER_IDENTITY__KEYS_TOPIC": "true",
    }
    assert mounted["trainer"] == {}


# Kubernetes objects passed through as they are: their fields are documented by Kubernetes (or Kafka).
FREE_FORM_KEYS = {
    "podSecurityContext",
    "containerSecurityContext",
    "resources",
    "liveness",
    "readiness",
    "config",
    "to",  # NetworkPolicyPeer objects
}


def test_every_values_key_is_commented() -> None:
    """prometheus-community style: a comment directly above every key of values.yaml, except inside
    pass-through Kubernetes objects (FREE_FORM_KEYS)."""
    key = re.compile(r"^(\s*)([A-Za-z][\w.-]*):")
    ancestors: list[tuple[int, str]] = []
    uncommented = []
    previous = ""
    for line in (CHART / "values.yaml").read_text().splitlines():
        match = key.match(line)
        if match:
            indent, name = len(match.group(1)), match.group(2)
            ancestors = [(i, n) for i, n in ancestors if i < indent]
            inside_free_form = any(n in FREE_FORM_KEYS for _, n in ancestors)
            if not previous.strip().startswith("#") and not inside_free_form:
                uncommented.append(line.strip())
            ancestors.append((indent, name))
        previous = line
    assert not uncommented, f"values.yaml keys without a comment: {uncommented}"
