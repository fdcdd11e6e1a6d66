"""Regenerate the Python protobuf code in sapo/v1 from proto/sapo/v1 (one command: `make proto`).

The generated modules and their .pyi stubs are committed so that installs need no code generator;
tests/unit/test_wire.py fails when they drift from the .proto sources.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent


def generate(out_dir: Path) -> None:
    """Write *_pb2.py and *_pb2.pyi for every proto/sapo/v1/*.proto under out_dir/sapo/v1."""
    protos = sorted(str(p.relative_to(ROOT / "proto")) for p in (ROOT / "proto/sapo/v1").glob("*.proto"))
    include = str(Path(protoc.__file__).parent / "_proto")
    args = [
        "protoc",
        f"-I{ROOT / 'proto'}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
    ]
    if protoc.main([*args, *protos]) != 0:
        raise SystemExit("protoc failed; see the messages above")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
