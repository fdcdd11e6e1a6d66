"""A service's catalogue of refusals on its real /metrics: every reason its loops can reject or
dead-letter a record for has its series at 0 before the first record, so `increase()` (the dead-letter
alerts, the dashboard) sees a new reason's first burst."""

from __future__ import annotations

import importlib
import logging
import os
import re
import sys
import urllib.request

import pytest

from sapo.node import generator, sampler, trainer
from sapo.runtime import Runtime, start_runtime
from sapo.settings import ServiceSettings

pytestmark = pytest.mark.integration
CATALOGUES = {"generator": generator.REFUSALS, "sampler": sampler.REFUSALS, "trainer": trainer.REFUSALS}


@pytest.mark.parametrize("service", sorted(CATALOGUES))
def test_a_started_service_shows_each_refusal_of_its_catalogue_at_zero(
    service: str, monkeypatch: pytest.MonkeyPatch, kafka_bootstrap: str
) -> None:
    """The entrypoint's own wiring: its `main` configured from the environment, and what it hands
    `serve` started as `serve` starts it, up to a scrape of /metrics."""
    for name in [n for n in os.environ if n.startswith("SAPO_")]:
        monkeypatch.delenv(name)
    prefix = f"SAPO_{service.upper()}_"
    for name, value in {
        "NODE_ID": "node-0",
        "KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
        "HTTP_HOST": "127.0.0.1",
        "HTTP_PORT": "0",
    }.items():
        monkeypatch.setenv(prefix + name, value)
    monkeypatch.setattr(sys, "argv", [f"sapo-{service}"])
    scraped: list[str] = []

    def serve(name: str, settings: ServiceSettings, prepare: object, refusals: tuple[str, ...]) -> int:
        root = logging.getLogger()
        handlers, level = root.handlers[:], root.level
        runtime: Runtime = start_runtime(name, settings, refusals=refusals, install_signals=False)
        root.handlers[:], root.level = handlers, level  # keep pytest's log capture
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{runtime.ops.port}/metrics", timeout=10
            ) as response:
                scraped.append(response.read().decode())
        finally:
            runtime.close()
        return 0

    main = importlib.import_module(f"services.{service}.main")
    monkeypatch.setattr(main, "serve", serve)
    assert main.main() == 0
    (text,) = scraped
    for counter in ("messages_rejected_total", "messages_dead_lettered_total"):
        shown = dict(
            re.findall(rf'^sapo_{service}_{counter}{{reason="([a-z0-9_]+)"}} (\S+)$', text, re.MULTILINE)
        )
        assert shown == dict.fromkeys(CATALOGUES[service], "0.0"), counter
