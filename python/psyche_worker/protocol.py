"""Wire format between the TypeScript client and this worker (ZeroMQ multipart messages).

A message is ``[header, *frames]``: ``header`` is a small UTF-8 JSON object (op, request id, scalar
arguments, and a ``frames`` list describing each following binary frame: name, dtype, shape); the
frames are raw little-endian bytes of tensors or token ids. Numbers in bulk never travel as JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

MAX_HEADER_BYTES = 1 << 20

# dtype names on the wire <-> numpy / torch
NP_DTYPES = {
    "uint8": np.uint8,
    "uint16": np.uint16,
    "uint32": np.uint32,
    "int32": np.int32,
    "int64": np.int64,
    "float16": np.float16,
    "float32": np.float32,
    "float64": np.float64,
}
TORCH_DTYPES = {
    "uint8": torch.uint8,
    "int32": torch.int32,
    "int64": torch.int64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}
TORCH_DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}


class ProtocolError(Exception):
    """A request that does not follow the wire format; answered with an error reply."""


class WorkerError(Exception):
    """A request that is well-formed but cannot be served (bad argument, wrong state, bad data).

    It crosses to the client as data, never as text to parse: the reply's ``error`` holds ``kind`` (one of the error
    kinds of ops.json), the message for people, and the structured ``fields`` the kind carries there (a ``bad_result``
    names the refused result's ``index`` in the list the client sent)."""

    def __init__(self, message: str, kind: str = "bad_request", **fields: Any):
        super().__init__(message)
        reserved = {"kind", "message"} & set(fields)
        if reserved:
            raise ValueError(f"WorkerError fields may not be named {sorted(reserved)}")
        self.kind = kind
        self.fields = fields

    def reply(self) -> dict[str, Any]:
        """The ``error`` object of the reply."""
        return {"kind": self.kind, "message": str(self), **self.fields}


@dataclass
class FrameSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]


def decode_header(raw: bytes | memoryview) -> dict[str, Any]:
    if len(raw) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {len(raw)} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        header = json.loads(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"header is not UTF-8 JSON: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("op"), str):
        raise ProtocolError("header must be a JSON object with a string 'op'")
    return header


def encode_header(header: dict[str, Any]) -> bytes:
    return json.dumps(header, separators=(",", ":")).encode("utf-8")


def frame_specs(header: dict[str, Any], count: int) -> list[FrameSpec]:
    specs = header.get("frames", [])
    if not isinstance(specs, list) or len(specs) != count:
        raise ProtocolError(f"header describes {len(specs) if isinstance(specs, list) else '?'} frames but {count} arrived")
    out = []
    for i, s in enumerate(specs):
        if not isinstance(s, dict):
            raise ProtocolError(f"frames[{i}] must be an object")
        dtype, shape = s.get("dtype"), s.get("shape")
        if dtype not in NP_DTYPES and dtype != "bfloat16":
            raise ProtocolError(f"frames[{i}].dtype {dtype!r} is not supported")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ProtocolError(f"frames[{i}].shape must be a list of non-negative integers")
        out.append(FrameSpec(str(s.get("name", i)), dtype, tuple(shape)))
    return out


def frame_to_tensor(spec: FrameSpec, buf: memoryview | bytes) -> torch.Tensor:
    """A CPU tensor viewing the frame's bytes (validated against the declared dtype and shape)."""
    itemsize = 2 if spec.dtype == "bfloat16" else np.dtype(NP_DTYPES[spec.dtype]).itemsize
    expected = int(np.prod(spec.shape, dtype=np.int64)) * itemsize
    if len(buf) != expected:
        raise ProtocolError(f"frame {spec.name!r}: {len(buf)} bytes, expected {expected} for {spec.dtype}{list(spec.shape)}")
    if spec.dtype == "bfloat16":
        arr = np.frombuffer(buf, dtype=np.uint16).reshape(spec.shape)
        return torch.from_numpy(arr.copy()).view(torch.bfloat16)
    arr = np.frombuffer(buf, dtype=NP_DTYPES[spec.dtype]).reshape(spec.shape)
    # frombuffer views read-only memory; torch wants writable storage, so tokens are copied once here
    return torch.from_numpy(arr.copy())


def tensor_to_frame(name: str, tensor: torch.Tensor) -> tuple[dict[str, Any], memoryview]:
    t = tensor.detach().to("cpu").contiguous()
    dtype = TORCH_DTYPE_NAMES.get(t.dtype)
    if dtype is None:
        raise WorkerError(f"tensor {name!r} has unsupported dtype {t.dtype}")
    raw = t.view(torch.uint8).numpy() if t.dtype == torch.bfloat16 else t.numpy()
    return {"name": name, "dtype": dtype, "shape": list(t.shape)}, memoryview(raw).cast("B")
