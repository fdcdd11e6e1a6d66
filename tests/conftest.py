"""Shared fixtures: one Kafka per test session, a unique topic prefix per test, and a real S3 API
(moto's server on 127.0.0.1, started once per session on first use) with a fresh bucket per test.

Set SAPO_TEST_KAFKA_BOOTSTRAP=host:port to run the integration tests against an existing Kafka (for
example a real Apache Kafka, to check that nothing depends on tansu's quirks); otherwise one embedded
tansu broker is started for the session. Tests never share topics, so they can also share a cluster.
"""

from __future__ import annotations

import os

# Two cores shared by torch's intra-op pool, the broker and subprocesses: one thread per process is
# several times faster than oversubscription (measured). Set before anything imports torch.
os.environ.setdefault("OMP_NUM_THREADS", "1")
import re
import uuid
from collections.abc import Callable, Iterator

import pytest
from s3fs import S3FileSystem

from sapo.broker import EmbeddedBroker
from tests.s3 import S3Server, moto_server

BOOTSTRAP_ENV = "SAPO_TEST_KAFKA_BOOTSTRAP"


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """bootstrap.servers of the session's Kafka: $SAPO_TEST_KAFKA_BOOTSTRAP or an embedded broker."""
    existing = os.environ.get(BOOTSTRAP_ENV)
    if existing:
        yield existing
        return
    with EmbeddedBroker() as broker:
        yield broker.bootstrap


@pytest.fixture
def topic_prefix(request: pytest.FixtureRequest) -> str:
    """A topic prefix no other test uses: readable test name plus a random suffix."""
    name = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40]
    return f"test.{name}.{uuid.uuid4().hex[:8]}"


@pytest.fixture
def kafka_client_config(kafka_bootstrap: str) -> dict[str, str]:
    """Base librdkafka config for tests; consumers add `sapo.settings.ConsumerProfile.local()` on top."""
    return {"bootstrap.servers": kafka_bootstrap}


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3 server on a free loopback port, for the whole session."""
    with moto_server() as server:
        yield server


@pytest.fixture
def s3_url(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """`s3://<fresh bucket>/checkpoints`, with this test's AWS_* variables pointing at the server."""
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    return f"s3://{s3_server.create_bucket()}/checkpoints"


@pytest.fixture
def no_s3_credentials(s3_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """`s3_url` for a process that finds no credentials (none in the environment, no files, no role)."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    S3FileSystem.clear_instance_cache()  # a client made earlier in this process holds credentials
    yield s3_url
    S3FileSystem.clear_instance_cache()


@pytest.fixture
def elsewhere(s3_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Points this test's S3 clients at another endpoint; fsspec's cached clients keep the endpoint they
    were made with, so none made before or during the test is reused."""

    def point(endpoint: str) -> None:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        S3FileSystem.clear_instance_cache()

    yield point
    S3FileSystem.clear_instance_cache()
