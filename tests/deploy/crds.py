"""Validation of the chart's custom resources against schemas, with no API server.

Prometheus Operator (ServiceMonitor, PrometheusRule): the npm package
`@kubernetes-models/prometheus-operator`, generated from the operator's own CRDs, installed by
scripts/tools.sh into .tools/crd-models. Two checks on each object: TypeScript's compiler (`tsc`)
type-checks it as an object literal of the generated interface, which refuses any property the CRD
does not declare (a misspelt field) and wrong types or enum values; the package's validators (ajv,
compiled from the CRD's openAPIV3Schema) check required fields and patterns such as durations.

Strimzi (KafkaTopic, KafkaUser): no package on npm or PyPI carries Strimzi's CRD schemas, so
STRIMZI below is a hand-written JSON schema of the `kafka.strimzi.io/v1` fields the chart uses,
closed (`additionalProperties: false`) at every level so that a misspelt field fails too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.deploy.helm import ROOT, tools_required

CRD_MODELS = Path(os.environ.get("SAPO_CRD_MODELS", ROOT / ".tools/crd-models"))
PROMETHEUS_OPERATOR = "@kubernetes-models/prometheus-operator"
MODELS = {
    "ServiceMonitor": f"{PROMETHEUS_OPERATOR}/monitoring.coreos.com/v1/ServiceMonitor",
    "PrometheusRule": f"{PROMETHEUS_OPERATOR}/monitoring.coreos.com/v1/PrometheusRule",
}


def require_crd_models() -> Path:
    tsc = CRD_MODELS / "node_modules/.bin/tsc"
    package = CRD_MODELS / "node_modules" / PROMETHEUS_OPERATOR
    missing = [str(p) for p in (tsc, package) if not p.exists()]
    if shutil.which("node") is None:
        missing.append("node (Node.js)")
    if missing:
        message = f"CRD models missing ({', '.join(missing)}): run scripts/tools.sh"
        if tools_required():
            pytest.fail(message)
        pytest.skip(message)
    return CRD_MODELS


def validate_prometheus_operator(objects: list[dict[str, Any]]) -> tuple[bool, str]:
    """(all valid, compiler and validator output) for ServiceMonitor and PrometheusRule objects."""
    root = require_crd_models()
    kinds = sorted({o["kind"] for o in objects})
    imports = [f'import {{ {k} }} from "{MODELS[k]}";' for k in kinds]
    literals = [
        f"export const o{i}: import('{MODELS[o['kind']]}').I{o['kind']} = {json.dumps(o, indent=1)};"
        for i, o in enumerate(objects)
    ]
    checks = [
        f"try {{ new {o['kind']}(o{i}).validate(); }} catch (e) {{ "
        f"console.log('{o['kind']} {o['metadata']['name']}: ' + (e as Error).message); }}"
        for i, o in enumerate(objects)
    ]
    # Node resolves packages from the file's directory upwards: the file goes under CRD_MODELS.
    with tempfile.TemporaryDirectory(dir=root) as work:
        source = Path(work) / "objects.mts"  # an ES module: emitted as objects.mjs
        source.write_text("\n".join([*imports, *literals, *checks, ""]))
        compiled = subprocess.run(
            [
                str(root / "node_modules/.bin/tsc"),
                "--strict",
                "--skipLibCheck",
                "--module",
                "nodenext",
                "--moduleResolution",
                "nodenext",
                "--target",
                "es2022",
                "--outDir",
                work,
                str(source),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if compiled.returncode != 0:
            return False, compiled.stdout + compiled.stderr
        validated = subprocess.run(
            ["node", str(Path(work) / "objects.mjs")],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        return validated.returncode == 0 and not validated.stdout, validated.stdout + validated.stderr


def _closed(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
        "required": list(required),
    }


_STRING = {"type": "string"}
_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = _closed(
    {"name": _STRING, "namespace": _STRING, "labels": _LABELS, "annotations": _LABELS}, ("name", "labels")
)
_ACL = _closed(
    {
        "resource": _closed(
            {
                "type": {"enum": ["topic", "group", "cluster", "transactionalId"]},
                "name": _STRING,
                "patternType": {"enum": ["literal", "prefix"]},
            },
            ("type",),
        ),
        "type": {"enum": ["allow", "deny"]},
        "host": _STRING,
        "operations": {
            "type": "array",
            "minItems": 1,
            "items": {
                "enum": [
                    "Read",
                    "Write",
                    "Create",
                    "Delete",
                    "Alter",
                    "Describe",
                    "ClusterAction",
                    "AlterConfigs",
                    "DescribeConfigs",
                    "IdempotentWrite",
                    "All",
                ]
            },
        },
    },
    ("resource", "operations"),
)
STRIMZI: dict[str, dict[str, Any]] = {
    "KafkaTopic": _closed(
        {
            "apiVersion": {"enum": ["kafka.strimzi.io/v1", "kafka.strimzi.io/v1beta2"]},
            "kind": {"const": "KafkaTopic"},
            "metadata": _METADATA,
            "spec": _closed(
                {
                    "topicName": _STRING,
                    "partitions": {"type": "integer", "minimum": 1},
                    "replicas": {"type": "integer", "minimum": 1, "maximum": 32767},
                    "config": {
                        "type": "object",
                        "additionalProperties": {"type": ["string", "integer", "boolean"]},
                    },
                }
            ),
        },
        ("apiVersion", "kind", "metadata", "spec"),
    ),
    "KafkaUser": _closed(
        {
            "apiVersion": {"enum": ["kafka.strimzi.io/v1", "kafka.strimzi.io/v1beta2"]},
            "kind": {"const": "KafkaUser"},
            "metadata": _METADATA,
            "spec": _closed(
                {
                    "authentication": _closed(
                        {"type": {"enum": ["tls", "tls-external", "scram-sha-512"]}}, ("type",)
                    ),
                    "authorization": _closed(
                        {"type": {"const": "simple"}, "acls": {"type": "array", "items": _ACL}},
                        ("type", "acls"),
                    ),
                }
            ),
        },
        ("apiVersion", "kind", "metadata", "spec"),
    ),
}


def validate_strimzi(obj: dict[str, Any]) -> list[str]:
    """Every violation of the hand-written Strimzi schema, as `path: message`."""
    validator = jsonschema.Draft202012Validator(STRIMZI[obj["kind"]])
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
