"""Binary format of one client's DisTrO result for one step (version 1).

Layout (all integers little-endian):

    header   magic b"PSDR" | u8 version (=1) | u8 value_format | u32 tensor_count
    per tensor, in the model's parameter order:
             u16 name_len | name (UTF-8)
             u8 ndim | u32 shape[ndim] | u32 chunk[ndim]
             u32 topk                                  (coefficients kept per chunk)
             i8 exponent                               (value_format FP16 only: values are fp16 * 2**-exponent)
             indices: n_chunks*topk indices, each in ceil(log2(chunk elements)) bits (at least 1),
                      packed LSB-first into bytes; the padding bits of the last byte are zero
             values:  SIGN: one bit per coefficient (1 = negative), packed LSB-first, zero padding
                      FP16 / BF16: n_chunks*topk little-endian 16-bit floats, finite
    nothing after the last tensor.

Indices address the row-major (row frequency, column frequency) position inside a chunk and are
distinct within a chunk. Chunks are numbered row-major over the grid shape[d] / chunk[d]. A 1-D tensor
[N] has chunks [c]; a 2-D tensor [R, C] chunks [cr, cc]; a tensor of more dimensions (the fused experts
[E, R, C] of a mixture of experts) is a stack of independent matrices: chunk [1, ..., 1, cr, cc], each
matrix with its own chunks. The same layout serves every rank, so ranks 1 and 2 are as they always were. The encoding is canonical (zero padding, exact length), so one content has
exactly one byte string and a commitment hash over the bytes identifies the content.

Decoding never trusts a length from the wire: every size is derived from the expected model layout
(`TensorSpec`) after the header fields have been checked against it, so hostile input cannot make
the decoder allocate more than the expected result's size.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np
import torch

MAGIC = b"PSDR"
FORMAT_VERSION = 1

VALUE_SIGN = 0  # 1-bit: sign bits only
VALUE_FP16 = 1  # fp16 mantissas with a per-tensor power-of-two exponent (keeps tiny momenta out of fp16 subnormals)
VALUE_BF16 = 2
VALUE_FORMAT_NAMES = {VALUE_SIGN: "sign", VALUE_FP16: "fp16", VALUE_BF16: "bf16"}

MAX_NAME_BYTES = 1024


class ResultDecodeError(ValueError):
    """Bytes that are not a valid DisTrO result for this model; the message says what is wrong, and `index`
    (set by DistroOptimizer.apply) is the position of the bad result in the list it was given."""

    def __init__(self, message: str, index: int | None = None):
        super().__init__(message)
        self.index = index


@dataclass(frozen=True)
class TensorSpec:
    """What the model expects of one tensor in a result."""

    name: str
    shape: tuple[int, ...]
    chunk: tuple[int, ...]
    topk: int

    @property
    def n_chunks(self) -> int:
        return math.prod(s // c for s, c in zip(self.shape, self.chunk))

    @property
    def chunk_elems(self) -> int:
        return math.prod(self.chunk)

    @property
    def index_bits(self) -> int:
        return max(1, math.ceil(math.log2(self.chunk_elems)))


@dataclass
class DecodedTensor:
    """One tensor of a decoded result: indices [n_chunks, topk] (int64) and values [n_chunks, topk]
    (float64, exact: ±1 for sign results, the transmitted fp16/bf16 numbers otherwise)."""

    spec: TensorSpec
    indices: np.ndarray
    values: np.ndarray


# ---- value quantization (shared by the encoder and the optimizer's own speculative update) ----


def quantize_values(values: torch.Tensor, value_format: int) -> tuple[bytes, int, np.ndarray]:
    """Quantize float values for the wire. Returns (payload bytes, fp16 exponent or 0, the exact
    float64 values a decoder will read back)."""
    flat = values.detach().reshape(-1).to(device="cpu", dtype=torch.float32)
    if value_format == VALUE_SIGN:
        negative = (flat < 0).numpy()
        decoded = np.where(negative, -1.0, 1.0)
        return np.packbits(negative, bitorder="little").tobytes(), 0, decoded
    if value_format == VALUE_BF16:
        raw = flat.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).astype("<u2")
        return raw.tobytes(), 0, _bf16_bits_to_float64(raw)
    if value_format == VALUE_FP16:
        max_abs = float(flat.abs().max()) if flat.numel() else 0.0
        if max_abs == 0.0 or not math.isfinite(max_abs):
            exponent = 0
        else:
            # max_abs < 2**e2, so max_abs * 2**(15 - e2) < 2**15 < 65504 (fp16 max).
            exponent = max(-128, min(127, 15 - math.frexp(max_abs)[1]))
        scaled = torch.ldexp(flat.to(torch.float64), torch.tensor(float(exponent), dtype=torch.float64))
        half = scaled.clamp(-65504.0, 65504.0).to(torch.float16).numpy().astype("<f2")
        decoded = np.ldexp(half.astype(np.float64), -exponent)
        return half.tobytes(), exponent, decoded
    raise ValueError(f"unknown value_format {value_format}")


def _bf16_bits_to_float64(raw: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # NaN payloads are caught by the caller's isfinite check
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _value_bytes(value_format: int, count: int) -> int:
    return (count + 7) // 8 if value_format == VALUE_SIGN else 2 * count


# ---- index packing ----


def pack_indices(indices: np.ndarray, bits: int) -> bytes:
    flat = indices.reshape(-1).astype(np.uint64)
    bit_matrix = ((flat[:, None] >> np.arange(bits, dtype=np.uint64)) & np.uint64(1)).astype(np.uint8)
    return np.packbits(bit_matrix.reshape(-1), bitorder="little").tobytes()


def unpack_indices(data: bytes | memoryview, count: int, bits: int) -> np.ndarray:
    """Inverse of pack_indices; `data` must be exactly ceil(count*bits/8) bytes (checked by caller)."""
    raw = np.frombuffer(data, dtype=np.uint8)
    bit_stream = np.unpackbits(raw, bitorder="little")
    if bit_stream[count * bits :].any():
        raise ResultDecodeError("nonzero padding bits after the indices")
    weights = np.uint64(1) << np.arange(bits, dtype=np.uint64)
    return (bit_stream[: count * bits].reshape(count, bits).astype(np.uint64) * weights).sum(axis=1).astype(np.int64)


# ---- layout ----


def result_header(value_format: int, tensor_count: int) -> bytes:
    return MAGIC + struct.pack("<BBI", FORMAT_VERSION, value_format, tensor_count)


def tensor_header(spec: TensorSpec) -> bytes:
    """A tensor's fixed part: name, ndim, shape, chunk and topk (the fp16 exponent follows it)."""
    name = spec.name.encode("utf-8")
    if len(name) > MAX_NAME_BYTES:
        raise ValueError(f"tensor name {spec.name[:64]!r}... longer than {MAX_NAME_BYTES} bytes")
    ndim = len(spec.shape)
    return struct.pack("<H", len(name)) + name + struct.pack(f"<B{ndim}I{ndim}II", ndim, *spec.shape, *spec.chunk, spec.topk)


@dataclass(frozen=True)
class TensorRegion:
    """Where one tensor's parts lie in a result of a given layout (byte offsets from the start)."""

    header: int  # tensor_header(spec)
    exponent: int | None  # the fp16 exponent byte, None for other value formats
    indices: int
    index_bytes: int
    values: int
    value_bytes: int


@dataclass(frozen=True)
class ResultLayout:
    """Every result of one model layout and value format has exactly this size and these offsets: all but the
    exponents, indices and values are fixed bytes (`fixed`: (offset, bytes) pieces)."""

    value_format: int
    size: int
    regions: tuple[TensorRegion, ...]
    fixed: tuple[tuple[int, bytes], ...]


def result_layout(specs: list[TensorSpec], value_format: int) -> ResultLayout:
    if value_format not in VALUE_FORMAT_NAMES:
        raise ValueError(f"unknown value_format {value_format}")
    fixed = [(0, result_header(value_format, len(specs)))]
    pos = len(fixed[0][1])
    regions = []
    for spec in specs:
        header = tensor_header(spec)
        fixed.append((pos, header))
        start = pos
        pos += len(header)
        exponent = None
        if value_format == VALUE_FP16:
            exponent = pos
            pos += 1
        n = spec.n_chunks * spec.topk
        index_bytes = (n * spec.index_bits + 7) // 8
        value_bytes = _value_bytes(value_format, n)
        regions.append(TensorRegion(start, exponent, pos, index_bytes, pos + index_bytes, value_bytes))
        pos += index_bytes + value_bytes
    return ResultLayout(value_format, pos, tuple(regions), tuple(fixed))


# ---- encode ----


@dataclass
class EncodedTensor:
    """A tensor's part of a result, ready to write: indices [n_chunks, topk] and quantized values."""

    spec: TensorSpec
    indices: np.ndarray
    value_payload: bytes
    exponent: int = 0


def encode_result(tensors: list[EncodedTensor], value_format: int) -> bytes:
    if value_format not in VALUE_FORMAT_NAMES:
        raise ValueError(f"unknown value_format {value_format}")
    parts = [result_header(value_format, len(tensors))]
    for t in tensors:
        spec = t.spec
        parts.append(tensor_header(spec))
        if value_format == VALUE_FP16:
            parts.append(struct.pack("<b", t.exponent))
        parts.append(pack_indices(t.indices, spec.index_bits))
        parts.append(t.value_payload)
    return b"".join(parts)


# ---- decode ----


class _Reader:
    def __init__(self, data: bytes):
        self.view = memoryview(data)
        self.pos = 0

    def take(self, n: int, what: str) -> memoryview:
        if n > len(self.view) - self.pos:
            raise ResultDecodeError(f"truncated: {what} needs {n} bytes at offset {self.pos}, only {len(self.view) - self.pos} left")
        out = self.view[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str, what: str) -> tuple:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))


def decode_result(data: bytes, expected: list[TensorSpec], value_format: int | None = None) -> list[DecodedTensor]:
    """Parse and validate `data` against the model layout `expected`. If `value_format` is given the
    result must use it (for 1-bit runs; FP16 and BF16 are both accepted when it is VALUE_FP16 or
    VALUE_BF16, as they carry the same information). Raises ResultDecodeError on anything wrong."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ResultDecodeError(f"result must be bytes, got {type(data).__name__}")
    r = _Reader(bytes(data))
    magic = bytes(r.take(4, "magic"))
    if magic != MAGIC:
        raise ResultDecodeError(f"bad magic {magic!r}, expected {MAGIC!r}")
    version, fmt, count = r.unpack("<BBI", "header")
    if version != FORMAT_VERSION:
        raise ResultDecodeError(f"unsupported version {version}, this decoder reads version {FORMAT_VERSION}")
    if fmt not in VALUE_FORMAT_NAMES:
        raise ResultDecodeError(f"unknown value format {fmt}")
    if value_format is not None:
        want_sign = value_format == VALUE_SIGN
        if (fmt == VALUE_SIGN) != want_sign:
            raise ResultDecodeError(f"value format {VALUE_FORMAT_NAMES[fmt]} does not match the run's {'1-bit' if want_sign else 'full-value'} configuration")
    if count != len(expected):
        raise ResultDecodeError(f"result has {count} tensors, the model has {len(expected)}")

    out: list[DecodedTensor] = []
    for position, spec in enumerate(expected):
        where = f"tensor {position} ({spec.name!r})"
        (name_len,) = r.unpack("<H", f"{where} name length")
        if name_len > MAX_NAME_BYTES:
            raise ResultDecodeError(f"{where}: name length {name_len} exceeds {MAX_NAME_BYTES}")
        raw_name = bytes(r.take(name_len, f"{where} name"))
        try:
            name = raw_name.decode("utf-8")
        except UnicodeDecodeError:
            raise ResultDecodeError(f"{where}: name is not valid UTF-8") from None
        if name != spec.name:
            raise ResultDecodeError(f"tensor {position}: name {name[:80]!r} does not match the model's {spec.name!r}")
        (ndim,) = r.unpack("<B", f"{where} ndim")
        if ndim != len(spec.shape):
            raise ResultDecodeError(f"{where}: ndim {ndim} does not match the model's {len(spec.shape)}")
        dims = r.unpack(f"<{2 * ndim}I", f"{where} shape and chunk")
        shape, chunk = tuple(dims[:ndim]), tuple(dims[ndim:])
        if shape != spec.shape:
            raise ResultDecodeError(f"{where}: shape {list(shape)} does not match the model's {list(spec.shape)}")
        if chunk != spec.chunk:
            raise ResultDecodeError(f"{where}: chunk {list(chunk)} does not match the expected {list(spec.chunk)}")
        (topk,) = r.unpack("<I", f"{where} topk")
        if topk != spec.topk:
            raise ResultDecodeError(f"{where}: topk {topk} does not match the expected {spec.topk}")
        exponent = 0
        if fmt == VALUE_FP16:
            (exponent,) = r.unpack("<b", f"{where} value exponent")

        n = spec.n_chunks * topk
        bits = spec.index_bits
        idx_bytes = r.take((n * bits + 7) // 8, f"{where} indices")
        try:
            indices = unpack_indices(idx_bytes, n, bits).reshape(spec.n_chunks, topk)
        except ResultDecodeError as e:
            raise ResultDecodeError(f"{where}: {e}") from None
        if n and int(indices.max()) >= spec.chunk_elems:
            bad = int(np.argmax(indices.reshape(-1) >= spec.chunk_elems))
            raise ResultDecodeError(
                f"{where}: index {int(indices.reshape(-1)[bad])} at chunk {bad // topk} is out of range (chunk has {spec.chunk_elems} elements)"
            )
        if topk > 1:
            ordered = np.sort(indices, axis=1)
            dup_rows = np.nonzero((ordered[:, 1:] == ordered[:, :-1]).any(axis=1))[0]
            if dup_rows.size:
                raise ResultDecodeError(f"{where}: duplicate index in chunk {int(dup_rows[0])}")

        val_raw = r.take(_value_bytes(fmt, n), f"{where} values")
        if fmt == VALUE_SIGN:
            bit_stream = np.unpackbits(np.frombuffer(val_raw, dtype=np.uint8), bitorder="little")
            if bit_stream[n:].any():
                raise ResultDecodeError(f"{where}: nonzero padding bits after the sign bits")
            values = np.where(bit_stream[:n].astype(bool), -1.0, 1.0)
        elif fmt == VALUE_FP16:
            half = np.frombuffer(val_raw, dtype="<f2")
            if not np.isfinite(half).all():
                raise ResultDecodeError(f"{where}: non-finite fp16 value")
            values = np.ldexp(half.astype(np.float64), -exponent)
        else:
            values = _bf16_bits_to_float64(np.frombuffer(val_raw, dtype="<u2"))
            if not np.isfinite(values).all():
                raise ResultDecodeError(f"{where}: non-finite bf16 value")
        out.append(DecodedTensor(spec, indices, values.reshape(spec.n_chunks, topk)))

    if r.pos != len(r.view):
        raise ResultDecodeError(f"{len(r.view) - r.pos} trailing bytes after the last tensor")
    return out
