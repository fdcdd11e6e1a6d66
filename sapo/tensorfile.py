"""Safetensors files written straight from tensor memory and read back as views of a verified buffer.

The format is the one `safetensors` defines (8-byte little-endian header length, a JSON header of
name -> dtype, shape, data offsets, then the raw bytes); files written here load with
`safetensors.torch.load_file` and files it writes parse here (both checked by the tests). The library
itself only saves or loads whole files or byte strings, so it cannot hash bytes as they are produced
or hand out tensors over a buffer whose digest was just checked; doing that here saves a full copy of
the weights on each side (write: no `.clone()`, no second read for the digest; read: no intermediate
bytes object).

Tied weights (SmolLM2 ties `lm_head.weight` to `model.embed_tokens.weight`) share storage; `dedupe`
keeps the first name of each group and returns the others as aliases, which the checkpoint manifest
records and `restore_ties` re-links on load (the same tensor under every name).
"""

from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Mapping
from typing import Final

import torch

from sapo.digests import Sink

_DTYPES: Final[dict[str, torch.dtype]] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_NAMES: Final = {dtype: name for name, dtype in _DTYPES.items()}
_HEADER_LIMIT: Final = 100 * 1024 * 1024  # the safetensors library's own bound
METADATA: Final = {"format": "pt"}  # what transformers expects in a PyTorch safetensors file


class TensorFileError(ValueError):
    """Bytes that are not a well-formed safetensors file."""


def dedupe(state: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors to store (one per storage view) and aliases (dropped name -> kept name)."""
    kept: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[object, ...], str] = {}
    for name, tensor in state.items():
        key = (
            tensor.device,
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tensor.dtype,
            tuple(tensor.shape),
            tensor.stride(),
        )
        if tensor.numel() and key in seen:
            aliases[name] = seen[key]
        else:
            seen[key] = name
            kept[name] = tensor
    return kept, aliases


def restore_ties(tensors: Mapping[str, torch.Tensor], aliases: Mapping[str, str]) -> dict[str, torch.Tensor]:
    state = dict(tensors)
    for alias, target in aliases.items():
        state[alias] = state[target]
    return state


def _raw(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes in C order, without a copy when it is already contiguous on the CPU."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().data.cast("B")


def write_tensors(out: Sink, tensors: Mapping[str, torch.Tensor]) -> None:
    """Write one safetensors file to `out`, tensor bytes streamed from memory in the given order."""
    header: dict[str, object] = {"__metadata__": METADATA}
    offset = 0
    for name, tensor in tensors.items():
        dtype = _NAMES.get(tensor.dtype)
        if dtype is None:
            raise ValueError(f"tensor {name} has dtype {tensor.dtype}, which checkpoints do not store")
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": dtype, "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the tensor data starts 8-byte aligned, as the library does
    out.write(struct.pack("<Q", len(encoded)))
    out.write(encoded)
    for tensor in tensors.values():
        if tensor.numel():
            out.write(_raw(tensor))


def parse_tensors(buffer: bytearray | mmap.mmap) -> dict[str, torch.Tensor]:
    """Tensors viewing `buffer` (no copy). `buffer` must be writable (torch.frombuffer) and the caller
    must not change it while the tensors are in use."""
    view = memoryview(buffer)
    if len(view) < 8:
        raise TensorFileError("shorter than a safetensors header")
    (length,) = struct.unpack("<Q", view[:8])
    if length > min(_HEADER_LIMIT, len(view) - 8):
        raise TensorFileError(f"header length {length} exceeds the file")
    try:
        header = json.loads(bytes(view[8 : 8 + length]))
    except ValueError as exc:
        raise TensorFileError(f"unreadable header: {exc}") from None
    if not isinstance(header, dict):
        raise TensorFileError("header is not a JSON object")
    base, end = 8 + length, len(view)
    tensors: dict[str, torch.Tensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        tensors[name] = _tensor_at(buffer, name, info, base, end)
    return tensors


def _tensor_at(buffer: bytearray | mmap.mmap, name: str, info: object, base: int, end: int) -> torch.Tensor:
    if not isinstance(info, dict):
        raise TensorFileError(f"tensor {name}: header entry is not an object")
    try:
        dtype = _DTYPES[info["dtype"]]
        shape = [int(d) for d in info["shape"]]
        begin, stop = (int(o) for o in info["data_offsets"])
    except (KeyError, TypeError, ValueError):
        raise TensorFileError(f"tensor {name}: bad header entry {info!r}") from None
    count = 1
    for dim in shape:
        count *= dim
    size = count * torch.empty((), dtype=dtype).element_size()
    if min(shape, default=0) < 0 or begin < 0 or stop - begin != size or base + stop > end:
        raise TensorFileError(f"tensor {name}: offsets {begin}..{stop} do not hold {shape} {dtype}")
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(buffer, dtype=dtype, count=count, offset=base + begin).view(shape)
