"""Settings of `sapo inspect`: the cluster to read (`SAPO_INSPECT_KAFKA__*`, the same typed connection
the services use, with SASL and TLS) and how reading behaves. Command-line flags override them; the
secrets (SASL password, TLS key password) come only from the environment or from files named by flags,
so they never appear in a process list, and are never printed."""

from __future__ import annotations

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from sapo.settings import KafkaConnection


class InspectSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SAPO_INSPECT_", frozen=True, extra="forbid", env_nested_delimiter="__"
    )

    kafka: KafkaConnection = Field(
        default_factory=lambda: KafkaConnection(client_id="sapo-inspect"), description="The cluster to read."
    )
    topic_prefix: str = Field("sapo", pattern=r"^[A-Za-z0-9._-]{1,64}$", description="Prefix of topic names.")
    fetch_wait_max_ms: int = Field(
        100, ge=1, le=60_000, description="Longest a fetch waits for data (>= 2000 for tansu on s3://)."
    )
    idle_s: float = Field(
        2.0,
        gt=0,
        le=600,
        description="A read without --follow ends when nothing arrived for this long (the embedded "
        "broker's high watermark is wrong, so the end is found by idleness). Keep it well above the "
        "fetch wait.",
    )
    timeout_s: float = Field(
        10.0, gt=0, le=600, description="Metadata and offset requests give up after this."
    )
    max_message_bytes: int = Field(
        64 * 1024 * 1024, ge=1024, description="Larger payloads are shown by size and headers, not decoded."
    )

    @field_validator("idle_s")
    @classmethod
    def _idle_above_fetch_wait(cls, idle_s: float, info: ValidationInfo) -> float:
        fetch_wait_ms = info.data.get("fetch_wait_max_ms", 0)
        if idle_s * 1000 < 2 * fetch_wait_ms:
            raise ValueError(
                f"{idle_s} s is shorter than two fetch waits ({fetch_wait_ms} ms each): a read would end "
                "before the broker answered; raise --idle or lower SAPO_INSPECT_FETCH_WAIT_MAX_MS"
            )
        return idle_s

    def consumer_config(self) -> dict[str, str]:
        """The librdkafka configuration of the reader (secrets unwrapped only here)."""
        return self.kafka.to_librdkafka() | {"fetch.wait.max.ms": str(self.fetch_wait_max_ms)}
