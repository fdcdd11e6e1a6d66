"""Per-node identity against the real broker and the real sampler process: a peer rotates its key on
the keys topic (`sapo keys announce`) and the sampler keeps accepting its groups through the overlap;
a new node is admitted by an admin announcement; a revoked key is refused; impersonators, forged
keys, unsigned and header/body-mismatched groups are refused, dead-lettered and counted in /metrics.
`sapo keys announce` takes its cluster from `SAPO_KEYS_KAFKA__*`, and ends after its --timeout on a
secured connection the listener does not speak."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sapo.cli import main
from sapo.identity import NodeKey, Signer
from sapo.identity.keys import write_private
from sapo.identity.trustlist import TrustList, save_trust_list
from sapo.kafka import KafkaPublisher
from sapo.v1 import identity_pb2, rollout_pb2
from sapo.wire import rollout_headers
from tests.integration.kafka_helpers import read_topic
from tests.integration.test_sampler import NODE, ROOT, TopicReader, _get, _sampler_env, _topics
from tests.unit.sampler.builders import questions, real_group

pytestmark = pytest.mark.integration


def metric(text: str, name: str, labels: Mapping[str, str] | None = None) -> float:
    """The value of one sample in Prometheus text (0 when absent)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == dict(labels or {}):
                return float(sample.value)
    return 0.0


def signed(
    group: rollout_pb2.RolloutGroup, key: NodeKey | None, *, claims_node: str = "", claims_task: str = ""
) -> tuple[bytes, list[tuple[str, bytes]]]:
    """The group's bytes with routing headers that claim `claims_*` (default: the truth), signed by `key`."""
    value = group.SerializeToString()
    claimed = rollout_pb2.RolloutGroup()
    claimed.CopyFrom(group)  # the body's facts header: node and task are not facts
    claimed.node_id = claims_node or group.node_id
    if claims_task:
        claimed.question.task = claims_task
    return value, rollout_headers(claimed, value, Signer(key) if key is not None else None)


def test_rotation_without_downtime_and_impersonators_refused_and_counted(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    topics = _topics(kafka_bootstrap, topic_prefix)  # node topics, the swarm topic and the keys topic
    keys = {name: NodeKey.generate() for name in ("peer-1", "peer-1-new", "peer-2", "mallory", "admin")}
    files = {}
    for name, key in keys.items():
        files[name] = tmp_path / f"{name}.key"
        write_private(files[name], key)
    trust = TrustList(admins=(keys["admin"].public_text,))
    trust = trust.with_key("peer-1", keys["peer-1"].public_text)
    trust = trust.with_key("peer-m", keys["mallory"].public_text)
    save_trust_list(tmp_path / "trust.yaml", trust)

    env = _sampler_env(kafka_bootstrap, topic_prefix) | {
        "SAPO_SAMPLER_LOCAL_GROUPS": "1",
        "SAPO_SAMPLER_EXTERNAL_GROUPS": "1",
        "SAPO_SAMPLER_MAX_PER_SOURCE": "1",
        "SAPO_SAMPLER_IDENTITY__MODE": "strict",
        "SAPO_SAMPLER_IDENTITY__TRUST_FILE": str(tmp_path / "trust.yaml"),
        "SAPO_SAMPLER_IDENTITY__KEYS_TOPIC": "true",
        "SAPO_SAMPLER_IDENTITY__KEYS_IDLE_S": "1",
    }
    records = iter(questions(node_seed=41, count=24))
    pub = KafkaPublisher({"bootstrap.servers": kafka_bootstrap})

    sent = []

    def send(group: rollout_pb2.RolloutGroup, key: NodeKey | None, **claims: str) -> rollout_pb2.RolloutGroup:
        value, headers = signed(group, key, **claims)
        pub.send(topics.swarm_rollouts, group.group_id.encode(), value, headers)
        pub.flush(10)
        sent.append(group)
        return group

    for _ in range(6):  # the node's own groups: one per batch (I=1); its private topic needs no key
        local = real_group(next(records), NODE)
        pub.send(topics.rollouts, local.group_id.encode(), *signed(local, None))
    pub.flush(10)

    log_path = tmp_path / "sampler.log"
    reader = TopicReader(kafka_bootstrap, topics.batches)

    def wait_for(name: str, labels: dict[str, str], value: float, timeout_s: float = 30) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = _get(log_path, "/metrics")
            if metric(text, name, labels) >= value:
                return text
            time.sleep(0.2)
        raise AssertionError(f"{name}{labels} never reached {value}:\n{log_path.read_text()[-3000:]}")

    def announce(*argv: str, result: str) -> None:
        """Run `sapo keys ...` once the sampler read every group sent so far (each one is judged by
        the keys of its time), then wait until the sampler applied the announcement."""
        wait_for("sapo_sampler_groups_consumed_total", {"origin": "external"}, len(sent))
        assert main(["keys", *argv, "--bootstrap", kafka_bootstrap, "--prefix", topic_prefix]) == 0
        wait_for("sapo_sampler_key_announcements_total", {"result": result}, 1)

    accepted = []
    with log_path.open("w") as log:
        cmd = [sys.executable, "-m", "services.sampler.main"]
        process = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            accepted.append(send(real_group(next(records), "peer-1"), keys["peer-1"]))
            reader.until(1, timeout_s=60)
            # Hostile traffic, all claiming peer-1:
            send(real_group(next(records), "peer-1"), keys["mallory"])  # an admitted node impersonating
            send(real_group(next(records), "peer-1"), NodeKey.generate())  # a key nobody admitted
            send(real_group(next(records), "peer-1"), None)  # unsigned
            # signed by peer-1 itself, but its task header is not what the body says
            send(real_group(next(records), "peer-1"), keys["peer-1"], claims_task="another_task")
            send(real_group(next(records), "peer-2"), keys["peer-2"])  # not admitted yet

            # Rotation: announced, signed by the old and the new key; both valid for the overlap.
            rotate = ["announce", "--node", "peer-1", "--key", str(files["peer-1-new"])]
            announce(*rotate, "--previous", str(files["peer-1"]), "--overlap", "600", result="rotated")
            accepted.append(send(real_group(next(records), "peer-1"), keys["peer-1-new"]))
            # a group signed before the switch, still in flight: accepted during the overlap
            accepted.append(send(real_group(next(records), "peer-1"), keys["peer-1"]))

            # Admission: an admin vouches for the public key peer-2's operator handed over.
            (tmp_path / "peer-2.pub").write_text(keys["peer-2"].public_text)
            admit = ["announce", "--node", "peer-2", "--public-key", str(tmp_path / "peer-2.pub")]
            announce(*admit, "--admin-key", str(files["admin"]), result="added")
            accepted.append(send(real_group(next(records), "peer-2"), keys["peer-2"]))

            # The old key retired early by its owner: refused from then on.
            revoke = ["revoke", "--node", "peer-1", "--key-id", keys["peer-1"].key_id]
            announce(*revoke, "--signer", str(files["peer-1"]), result="revoked")
            send(real_group(next(records), "peer-1"), keys["peer-1"])
            accepted.append(send(real_group(next(records), "peer-1"), keys["peer-1-new"]))

            batches = reader.batches(len(accepted), timeout_s=60)
            text = wait_for("sapo_sampler_groups_rejected_total", {"reason": "revoked_key"}, 1)
        finally:
            process.send_signal(signal.SIGTERM)
            code = process.wait(20)
            reader.close()
    assert code == 0, log_path.read_text()[-3000:]

    external = [bg.group for b in batches for bg in b.groups if bg.group.node_id != NODE]
    assert [g.group_id for g in external] == [g.group_id for g in accepted]
    assert [g.node_id for g in external] == ["peer-1", "peer-1", "peer-1", "peer-2", "peer-1"]
    rejected = {
        "identity_mismatch": 1,
        "key_conflict": 1,
        "unsigned": 1,
        "header_mismatch": 1,
        "unknown_key": 1,
        "revoked_key": 1,
    }
    for reason, count in rejected.items():
        assert metric(text, "sapo_sampler_groups_rejected_total", {"reason": reason}) == count, reason
        dead = metric(text, "sapo_sampler_messages_dead_lettered_total", {"reason": reason})
        assert dead == (0 if reason == "unknown_key" else count), reason
    for result in ("rotated", "added", "revoked"):
        assert metric(text, "sapo_sampler_key_announcements_total", {"result": result}) == 1, result
    assert metric(text, "sapo_sampler_trusted_keys") == 3  # peer-1's new key, peer-2, peer-m
    assert metric(text, "sapo_sampler_batches_emitted_total") == len(accepted)


def test_sapo_keys_announce_takes_the_cluster_from_its_environment(
    kafka_bootstrap: str,
    topic_prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """PLAINTEXT, the brokers from SAPO_KEYS_KAFKA__BOOTSTRAP_SERVERS: the signed announcement is the
    keys topic's record."""
    assert main(["topics", "--bootstrap", kafka_bootstrap, "--prefix", topic_prefix, "--node", "node-0"]) == 0
    key = NodeKey.generate()
    write_private(tmp_path / "node-0.key", key)
    monkeypatch.setenv("SAPO_KEYS_KAFKA__BOOTSTRAP_SERVERS", kafka_bootstrap)
    capsys.readouterr()
    argv = [
        "keys",
        "announce",
        "--prefix",
        topic_prefix,
        "--node",
        "node-0",
        "--key",
        str(tmp_path / "node-0.key"),
    ]
    assert main(argv) == 0
    out = dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines())
    assert (out["topic"], out["key_id"]) == (f"{topic_prefix}.swarm.keys", key.key_id)
    [record] = read_topic(kafka_bootstrap, out["topic"])
    assert record.key == f"node-0/{key.key_id}".encode()
    envelope = identity_pb2.KeyAnnouncement.FromString(record.value or b"")
    assert [s.key_id for s in envelope.signatures] == [key.key_id]


def test_sapo_keys_announce_over_a_secured_connection_the_listener_does_not_speak_fails_within_the_timeout(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The embedded broker listens in PLAINTEXT only: a SASL_SSL client never gets an answer. The
    command ends after --timeout with what to check, the password (from its file) unprinted."""
    write_private(tmp_path / "node-0.key", NodeKey.generate())
    (tmp_path / "password").write_text("s3cret\n")
    argv = [
        *("keys", "announce", "--bootstrap", kafka_bootstrap, "--prefix", topic_prefix, "--timeout", "2"),
        *("--node", "node-0", "--key", str(tmp_path / "node-0.key"), "--security-protocol", "SASL_SSL"),
        *("--sasl-mechanism", "PLAIN", "--sasl-username", "node-0"),
        *("--sasl-password-file", str(tmp_path / "password")),
    ]
    started = time.monotonic()
    assert main(argv) == 1
    assert time.monotonic() - started < 10.0
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors[-1] == (
        f"no acknowledgement from {topic_prefix}.swarm.keys within 2.0s: check that --bootstrap "
        f"({kafka_bootstrap}) reaches the cluster, that the security settings (--security-protocol, "
        "--sasl-*, --ssl-* or SAPO_KEYS_KAFKA__*) match its listener, and that "
        f"{topic_prefix}.swarm.keys exists (`sapo topics`)"
    )
    assert "s3cret" not in caplog.text
