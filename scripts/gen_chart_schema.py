"""Write the chart's schema of each service's `settings` map from the services' settings classes.

    python scripts/gen_chart_schema.py           # update deploy/k8s/sapo-node/values.schema.json
    python scripts/gen_chart_schema.py --check   # exit 1 when the committed schema has drifted

The settings classes (`sapo.<service>.settings`) declare every setting once, with its bound and
default; the chart takes a service's settings as env variables without the service prefix
(`<service>.settings: {LOCAL_GROUPS: 4}`). This script lists exactly those names in the values schema
(nested fields joined with `__`, enums as enums, numbers with their bounds), so `helm install` refuses
a misspelt or unknown setting, or a number out of bounds, instead of a crash loop. What the chart
sets itself (`CHART_OWNED`) is refused there.
`tests/deploy/test_settings_schema.py` fails when the committed schema drifts from the classes.
"""

from __future__ import annotations

import argparse
import enum
import json
import sys
import typing
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sapo.generator.settings import GeneratorSettings  # noqa: E402
from sapo.sampler.settings import SamplerSettings  # noqa: E402
from sapo.settings import ServiceSettings, env_fields, field_bounds, field_types  # noqa: E402
from sapo.trainer.settings import TrainerSettings  # noqa: E402

SCHEMA = ROOT / "deploy/k8s/sapo-node/values.schema.json"
SERVICES: dict[str, type[ServiceSettings]] = {
    "generator": GeneratorSettings,
    "sampler": SamplerSettings,
    "trainer": TrainerSettings,
}
CHART_OWNED = frozenset(
    {"NODE_ID", "TOPIC_PREFIX", "HTTP_HOST", "HTTP_PORT", "HTTP_PORT_FILE", "LOG_FORMAT", "LOG_LEVEL"}
    | {"CHECKPOINT_ROOT", "MAX_MESSAGE_BYTES"}
)
"""Set by the chart from its own values (node id, ports, logging, the checkpoint volume, the message size
limit that its KafkaTopics share); the Kafka
connections and the node's identity too (`kafka`, `swarmKafka`, `identity` values: the key Secret and
trust list ConfigMap are mounted by the chart). `MODEL` stays settable per service: the chart's
`model` value sets it for both, and refuses to be given twice."""
CHART_OWNED_PREFIXES = ("KAFKA__", "SWARM_KAFKA__", "IDENTITY__")


NUMBER_TYPES: dict[type, str] = {int: "integer", float: "number"}
JSON_BOUNDS = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}
"""The settings' numeric bounds (`sapo.settings.field_bounds`) as JSON Schema keywords."""


def _bounds(info: FieldInfo) -> dict[str, Any]:
    return {JSON_BOUNDS[kind]: bound for kind, bound in field_bounds(info).items()}


def _value_schema(info: FieldInfo) -> dict[str, Any]:
    """Env values are strings; YAML may hand the chart numbers or booleans, which it prints as text.
    A number is checked against the setting's bounds and type here, so `helm install` refuses what the
    service would refuse at start; a number given as a string is left to the service (JSON Schema
    cannot bound a string's value). A boolean is never a valid number."""
    members = [m for m in field_types(info) if m is not type(None)]
    schema: dict[str, Any] = {"type": ["string", "number", "integer", "boolean"]}
    enums = [m for m in members if isinstance(m, type) and issubclass(m, enum.Enum)]
    literals = [v for m in members if typing.get_origin(m) is typing.Literal for v in typing.get_args(m)]
    if enums or literals:
        schema = {"enum": [str(e.value) for m in enums for e in m] + [str(v) for v in literals]}
    elif len(members) == 1 and members[0] in NUMBER_TYPES:
        schema = {"type": ["string", NUMBER_TYPES[members[0]]], **_bounds(info)}
    if info.description:
        schema["description"] = info.description
    return schema


def settings_schema(settings: type[ServiceSettings]) -> dict[str, Any]:
    """The values schema of one service's `settings` map."""
    properties = {
        env: _value_schema(info)
        for env, info in sorted(env_fields(settings).items())
        if env not in CHART_OWNED and not env.startswith(CHART_OWNED_PREFIXES)
    }
    prefix = str(settings.model_config.get("env_prefix", ""))
    return {
        "type": "object",
        "description": f"{settings.__name__} as env variables without the {prefix} prefix (generated from "
        "the settings class by scripts/gen_chart_schema.py); the chart's own settings are refused here.",
        "properties": properties,
        "additionalProperties": False,
    }


def updated(schema: dict[str, Any]) -> dict[str, Any]:
    for service, settings in SERVICES.items():
        schema["properties"][service]["properties"]["settings"] = settings_schema(settings)
    return schema


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description="Generate the chart's schema of the services' settings.")
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed schema has drifted")
    args = parser.parse_args()
    current = SCHEMA.read_text()
    fresh = render(updated(json.loads(current)))
    if args.check:
        if fresh != current:
            print(f"{SCHEMA} is out of date: run python scripts/gen_chart_schema.py", file=sys.stderr)
            return 1
        return 0
    SCHEMA.write_text(fresh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
