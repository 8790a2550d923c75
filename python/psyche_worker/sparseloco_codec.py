"""SparseLoCo's compressor and its wire format (version 1), on the device: only packed bytes cross to the host.

Compressor semantics are τemplar's (one-covenant/templar at commit 142666f0dd91888dd1e240c38860e042f0364d45:
src/tplr/compress.py ChunkingTransformer, TopKCompressor._quantize_values / _dequantize_values / batch_decompress,
and src/tplr/neurons.py outer_step), re-implemented here, and tested against vectors derived from running that code
(python/tests/fixtures/templar_vectors.json, python/tests/test_sparseloco.py):

* **Chunking.** A tensor is a stack of matrices [B, R, C] (1-D [N] is [1, 1, N]; N-D [..., R, C], such as a mixture
  of experts' fused [E, R, C], is prod(...) matrices). Each matrix is cut into chunks [cr, cc], cr and cc the largest
  divisors of R and C that are at most `chunk` (1-D: chunks of cc elements). Chunks are numbered row-major over
  [B, R/cr, C/cc], an element inside a chunk by its row-major (row, column) position: τemplar's
  "(y h) (x w) -> y x (h w)". With `dct`, the chunks are first transformed by the orthonormal 2-D DCT-II.
* **Top-k.** Per chunk the k largest magnitudes, k = τemplar's clamp of `topk`: at most the chunk's elements, at least
  2, even. Where τemplar fails — a chunk of one element (a 1-D tensor of prime length > chunk), whose clamp of 2 makes
  torch.topk raise — k is 1.
* **Quantizer.** Per tensor over its selected values v: shift = mean(v), c = v − shift, σ = ‖c‖ / √(n − 1),
  scale = 6σ / 2^b (1 when it is 0 or not finite), code = clamp(round(c / scale + 2^b / 2), 0, 2^b − 1), and each
  code decodes to the mean of the centred values that got it, plus the shift (0 + shift for an empty bin).
* **Outer step.** Per tensor, each contribution's decoded values are scaled by min(1, m / (‖values‖ + 1e-8)), m the
  median (the lower one for an even count, as torch.median) of the contributions' norms; each position takes the
  mean over the contributions that selected it; θ ← θ − α · that.

Wire format, all integers little-endian; every size is derived from the run's layout (`TensorLayout`s), never read:

    header   magic b"PSSL" | u8 version (=1) | u8 value_bits | u8 flags (bit 0: dct) | u8 0 | 8 bytes layout id
             (the first 8 bytes of SHA-256 over the layout: tensor names, shapes, chunks, top-k, value_bits, dct)
    levels   for each tensor in model order: 2^value_bits float32, what each code decodes to (finite)
    then for each tensor in model order, each section padded with zero bits to a whole byte:
      sparse (k < chunk elements):
        uppers  per chunk, L = k + ((E − 1) >> l) bits: the Elias-Fano high parts of its k indices, ascending (bit
                h_i + i set for the i-th index's high part h_i = index >> l; exactly k bits set)
        lows    per chunk, k fields of l = floor(log2(E / k)) bits: each index's low bits (index & (2^l − 1))
        codes   per chunk, k fields of value_bits bits, in the same (ascending index) order
      dense (k = chunk elements: every element is selected, so no index is sent):
        codes   every element's code, chunk after chunk
    Bits are packed LSB-first. Indices within a chunk are strictly increasing and below E (the chunk's elements).

One content has exactly one byte string (canonical: sorted indices, zero padding, exact length), so a commitment
hash over the bytes identifies the content. Against τemplar's format (12-bit indices and one byte per code, per
value): 64 of 4,096 take l = 6 low bits and 127 upper bits per chunk, about 8 bits per index, and 2-bit codes
travel as 2 bits; a chunk whose every element is selected (a 1-D tensor of at most `chunk` elements) travels as
codes only, with no index; every shape has a layout.

Determinism of `aggregate`: results in the caller's canonical order; each result adds its (scaled) values into a
float32 sum one result at a time (positions are distinct within a chunk, so no two writes of one scatter collide),
counts are integers, the scale factors are computed on the host in float64 from exact per-code counts; the update is
α · mean computed and then subtracted as two separate roundings (no fused multiply-add), so every replica on any
device ends with the same bytes (the DCT option adds an inverse transform, exact per device kind only).
"""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass, replace

import torch

from .distro import dct_matrix, largest_divisor_at_most

__all__ = [
    "MAGIC",
    "FORMAT_VERSION",
    "HEADER_BYTES",
    "MAX_CHUNK",
    "MAX_VALUE_BITS",
    "QUANTIZATION_RANGE",
    "ResultDecodeError",
    "TensorLayout",
    "Decoded",
    "Compressed",
    "layout_for",
    "layout_id",
    "result_size",
    "select",
    "compress",
    "encode",
    "decode",
    "aggregate",
    "median_norms",
    "clamp_topk",
]

MAGIC = b"PSSL"
FORMAT_VERSION = 1
HEADER_BYTES = 16
FLAG_DCT = 1
MAX_CHUNK = 4096
MAX_VALUE_BITS = 8
QUANTIZATION_RANGE = 6
"""τemplar's quantization_range: the codes span ±3σ of the centred values (6σ in all)."""
CLIP_EPS = 1e-8
"""τemplar's batch_decompress: clip factor min(1, median / (norm + 1e-8))."""


class ResultDecodeError(ValueError):
    """Bytes that are not a valid SparseLoCo result for this layout; `index`: the result's position in the list given."""

    def __init__(self, message: str, index: int | None = None):
        super().__init__(message)
        self.index = index


def clamp_topk(topk: int, elements: int) -> int:
    """τemplar's TopKCompressor._clamp_topk (at most the chunk, at least 2, even), and 1 for a one-element chunk."""
    if elements == 1:
        return 1
    k = max(min(topk, elements), 2)
    return k - (k % 2)


@dataclass(frozen=True)
class TensorLayout:
    """One tensor's place in a result: its chunking and top-k, and everything sized from them."""

    name: str
    shape: tuple[int, ...]
    chunk: tuple[int, ...]
    """The chunk as the result format names it: (cc,) for 1-D, (cr, cc) for 2-D, (1, ..., 1, cr, cc) above."""
    topk: int

    @property
    def matrices(self) -> int:
        return 1 if len(self.shape) < 3 else math.prod(self.shape[:-2])

    @property
    def rows(self) -> int:
        return 1 if len(self.shape) == 1 else self.shape[-2]

    @property
    def cols(self) -> int:
        return self.shape[-1]

    @property
    def cr(self) -> int:
        return 1 if len(self.chunk) == 1 else self.chunk[-2]

    @property
    def cc(self) -> int:
        return self.chunk[-1]

    @property
    def n_chunks(self) -> int:
        return self.matrices * (self.rows // self.cr) * (self.cols // self.cc)

    @property
    def chunk_elems(self) -> int:
        return self.cr * self.cc

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def dense(self) -> bool:
        return self.topk == self.chunk_elems

    @property
    def low_bits(self) -> int:
        """l = floor(log2(E / k)) (0 for a dense tensor)."""
        if self.dense:
            return 0
        return max(0, (self.chunk_elems // self.topk).bit_length() - 1)

    @property
    def upper_bits(self) -> int:
        """L: the Elias-Fano upper bits of one chunk (0 for a dense tensor)."""
        return 0 if self.dense else self.topk + ((self.chunk_elems - 1) >> self.low_bits)

    def section_bytes(self, value_bits: int) -> tuple[int, int, int]:
        """Bytes of the (uppers, lows, codes) sections."""
        if self.dense:
            return 0, 0, (self.numel * value_bits + 7) // 8
        n, k = self.n_chunks, self.topk
        return (n * self.upper_bits + 7) // 8, (n * k * self.low_bits + 7) // 8, (n * k * value_bits + 7) // 8

    def spec(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "chunk": list(self.chunk), "topk": self.topk}

    def block_rows(self) -> int:
        """The rows of the first dimension that one chunk spans: a block of whole such rows is whole chunks."""
        return self.cc if len(self.shape) == 1 else self.cr if len(self.shape) == 2 else 1

    def block(self, index: int, count: int) -> tuple[TensorLayout, int]:
        """Block `index` of `count` equal blocks along the first dimension (a sharded client's rank, sharding.py):
        its layout (the same chunks) and the number of its first chunk. The blocks' chunks are consecutive runs of
        the tensor's chunk numbering, in block order, so a block's chunks are compressed and applied as the whole
        tensor's are. ValueError if a block would cut a chunk."""
        rows, extra = divmod(self.shape[0], count)
        if extra or rows % self.block_rows():
            raise ValueError(f"tensor {self.name!r}: {count} blocks of shape {list(self.shape)} would cut its chunks {list(self.chunk)}")
        part = replace(self, shape=(rows, *self.shape[1:]))
        return part, index * part.n_chunks


def layout_for(name: str, shape: tuple[int, ...], chunk: int, topk: int) -> TensorLayout:
    """τemplar's chunking of a tensor of `shape` (module docstring), for tensors of any rank but 0."""
    if len(shape) == 0:
        raise ValueError(f"tensor {name!r}: a scalar has no chunks")
    if len(shape) == 1:
        wire = (largest_divisor_at_most(shape[0], chunk),)
    else:
        last = tuple(largest_divisor_at_most(s, chunk) for s in shape[-2:])
        wire = (1,) * (len(shape) - 2) + last
    return TensorLayout(name, tuple(int(s) for s in shape), wire, clamp_topk(topk, math.prod(wire)))


def layout_id(layouts: list[TensorLayout], value_bits: int, dct: bool) -> bytes:
    """The 8-byte layout id of the header: results of another model or configuration are told apart at once."""
    h = hashlib.sha256(b"psyche/sparseloco/1\0")
    h.update(struct.pack("<BB", value_bits, int(dct)))
    for t in layouts:
        name = t.name.encode("utf-8")
        h.update(struct.pack("<I", len(name)) + name)
        h.update(struct.pack(f"<B{len(t.shape)}I{len(t.chunk)}II", len(t.shape), *t.shape, *t.chunk, t.topk))
    return h.digest()[:8]


def result_size(layouts: list[TensorLayout], value_bits: int) -> int:
    """The exact size of every valid result for this layout."""
    return HEADER_BYTES + 4 * (1 << value_bits) * len(layouts) + sum(sum(t.section_bytes(value_bits)) for t in layouts)


# ---------------------------------------------------------------- chunks


def to_chunks(x: torch.Tensor, t: TensorLayout) -> torch.Tensor:
    """A tensor of t.shape -> [n_chunks, chunk_elems] (a copy), in chunk order."""
    b, r, c, cr, cc = t.matrices, t.rows, t.cols, t.cr, t.cc
    return x.reshape(b, r // cr, cr, c // cc, cc).permute(0, 1, 3, 2, 4).reshape(t.n_chunks, cr * cc)


def from_chunks(chunks: torch.Tensor, t: TensorLayout) -> torch.Tensor:
    """to_chunks' inverse."""
    b, r, c, cr, cc = t.matrices, t.rows, t.cols, t.cr, t.cc
    return chunks.reshape(b, r // cr, c // cc, cr, cc).permute(0, 1, 3, 2, 4).reshape(t.shape)


def _dct_bases(t: TensorLayout, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return dct_matrix(t.cr).to(device), dct_matrix(t.cc).to(device)


def dct_chunks(chunks: torch.Tensor, t: TensorLayout) -> torch.Tensor:
    """Each chunk's orthonormal 2-D DCT-II, D_r X D_c^T (1-D chunks: D_c x)."""
    d_r, d_c = _dct_bases(t, chunks.device)
    blocks = chunks.reshape(-1, t.cr, t.cc)
    return torch.matmul(torch.matmul(d_r, blocks), d_c.T).reshape(chunks.shape)


def idct_chunks(coeffs: torch.Tensor, t: TensorLayout) -> torch.Tensor:
    """dct_chunks' inverse, D_r^T C D_c."""
    d_r, d_c = _dct_bases(t, coeffs.device)
    blocks = coeffs.reshape(-1, t.cr, t.cc)
    return torch.matmul(torch.matmul(d_r.T, blocks), d_c).reshape(coeffs.shape)


# ---------------------------------------------------------------- compress


@dataclass
class Compressed:
    """One tensor compressed: sorted indices [n, k] (None when dense), codes [n, k] (uint8), levels [2^b] (float32)."""

    layout: TensorLayout
    indices: torch.Tensor | None
    codes: torch.Tensor
    levels: torch.Tensor

    def values(self) -> torch.Tensor:
        """What the codes decode to ([n, k], float32)."""
        return self.levels[self.codes.long()]

    def dense_chunks(self) -> torch.Tensor:
        """The decoded values scattered into [n_chunks, chunk_elems] (zeros where nothing was selected)."""
        values = self.values()
        if self.indices is None:
            return values.reshape(self.layout.n_chunks, self.layout.chunk_elems)
        out = torch.zeros(self.layout.n_chunks, self.layout.chunk_elems, dtype=torch.float32, device=values.device)
        return out.scatter_(1, self.indices, values)


def quantize(values: torch.Tensor, value_bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """τemplar's _quantize_values (module docstring) on the device: codes (uint8, values' shape) and the 2^b levels
    they decode to (float32: the bin's mean centred value plus the shift, as _dequantize_values adds them)."""
    n_bins = 1 << value_bits
    offset = n_bins // 2
    values = values.to(torch.float32)
    shift = values.mean()
    centred = values - shift
    if centred.numel() > 1:
        std = centred.norm() / math.sqrt(centred.numel() - 1)
        scale = QUANTIZATION_RANGE * std / n_bins
        scale = torch.where(torch.isfinite(scale) & (scale != 0), scale, torch.ones_like(scale))
    else:
        scale = torch.ones((), dtype=torch.float32, device=values.device)
    codes = (centred / scale + offset).round().clamp(0, n_bins - 1).to(torch.uint8)
    flat, bins = centred.reshape(-1), codes.reshape(-1).long()
    sums = torch.zeros(n_bins, dtype=torch.float32, device=values.device).scatter_add_(0, bins, flat)
    counts = torch.zeros(n_bins, dtype=torch.float32, device=values.device).scatter_add_(0, bins, torch.ones_like(flat))
    lookup = torch.where(counts > 0, sums / counts, torch.zeros_like(sums))
    return codes, lookup + shift


def select(x: torch.Tensor, t: TensorLayout, dct: bool) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The top-k of each chunk of `x` (a tensor of t.shape, or its DCT): sorted indices [n, k] (None when dense) and
    their values [n, k] (float32). Chunk by chunk: a block of a tensor (TensorLayout.block) selects its chunks' rows
    of the whole tensor's."""
    chunks = to_chunks(x.to(torch.float32), t)
    if dct:
        chunks = dct_chunks(chunks, t)
    if t.dense:
        return None, chunks
    selected = torch.topk(chunks.abs(), t.topk, dim=1, largest=True, sorted=False).indices
    indices, _ = torch.sort(selected, dim=1)
    return indices, torch.gather(chunks, 1, indices)


def compress(x: torch.Tensor, t: TensorLayout, value_bits: int, dct: bool) -> Compressed:
    """The top-k of each chunk of `x` (a tensor of t.shape, or its DCT), quantized: τemplar's compress."""
    indices, values = select(x, t, dct)
    codes, levels = quantize(values, value_bits)
    return Compressed(t, indices, codes, levels)


def transmitted(c: Compressed, dct: bool) -> torch.Tensor:
    """What the peers decode from `c`, as a tensor of its shape (error feedback subtracts it)."""
    chunks = c.dense_chunks()
    if dct:
        chunks = idct_chunks(chunks, c.layout)
    return from_chunks(chunks, c.layout)


# ---------------------------------------------------------------- bits

_BIT_WEIGHTS: dict[torch.device, torch.Tensor] = {}


def _pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """A flat 0/1 tensor -> uint8 bytes, LSB-first, the last byte padded with zeros."""
    bits = bits.reshape(-1).to(torch.uint8)
    pad = (-bits.numel()) % 8
    if pad:
        bits = torch.cat([bits, torch.zeros(pad, dtype=torch.uint8, device=bits.device)])
    shifts = torch.arange(8, dtype=torch.uint8, device=bits.device)
    return (bits.reshape(-1, 8) << shifts).sum(dim=1, dtype=torch.int32).to(torch.uint8)


def _field_bits(values: torch.Tensor, width: int) -> torch.Tensor:
    """Each value's low `width` bits, LSB-first: [m] -> [m * width] (0/1, uint8)."""
    if width == 0:
        return torch.zeros(0, dtype=torch.uint8, device=values.device)
    shifts = torch.arange(width, dtype=torch.int32, device=values.device)
    return ((values.reshape(-1, 1).to(torch.int32) >> shifts) & 1).to(torch.uint8).reshape(-1)


def _unpack_bits(data: torch.Tensor) -> torch.Tensor:
    """uint8 bytes -> their bits, LSB-first (uint8 0/1)."""
    shifts = torch.arange(8, dtype=torch.uint8, device=data.device)
    return ((data.reshape(-1, 1) >> shifts) & 1).reshape(-1)


def _fields(bits: torch.Tensor, count: int, width: int) -> torch.Tensor:
    """`count` fields of `width` bits from a bit tensor -> int64."""
    if width == 0:
        return torch.zeros(count, dtype=torch.int64, device=bits.device)
    weights = torch.ones(width, dtype=torch.int64, device=bits.device) << torch.arange(width, dtype=torch.int64, device=bits.device)
    return (bits[: count * width].reshape(count, width).to(torch.int64) * weights).sum(dim=1)


# ---------------------------------------------------------------- encode


def encode(tensors: list[Compressed], value_bits: int, dct: bool, layout: bytes) -> bytes:
    """The wire bytes of a result, packed on the tensors' device and copied to the host once."""
    device = tensors[0].codes.device if tensors else torch.device("cpu")
    header = MAGIC + struct.pack("<BBBB", FORMAT_VERSION, value_bits, FLAG_DCT if dct else 0, 0) + layout
    levels = torch.cat([c.levels.to(torch.float32).reshape(-1) for c in tensors]).contiguous().view(torch.uint8)
    parts = [torch.frombuffer(bytearray(header), dtype=torch.uint8).to(device), levels]
    for c in tensors:
        t = c.layout
        if c.indices is None:
            parts.append(_pack_bits(_field_bits(c.codes, value_bits)))
            continue
        n, k, low = t.n_chunks, t.topk, t.low_bits
        positions = (c.indices >> low) + torch.arange(k, device=device)
        uppers = torch.zeros(n, t.upper_bits, dtype=torch.uint8, device=device).scatter_(1, positions, 1)
        parts.append(_pack_bits(uppers))
        parts.append(_pack_bits(_field_bits(c.indices & ((1 << low) - 1), low)))
        parts.append(_pack_bits(_field_bits(c.codes, value_bits)))
    return torch.cat(parts).cpu().numpy().tobytes()


# ---------------------------------------------------------------- decode


@dataclass
class Decoded:
    """One tensor of a decoded result: indices [n, k] (None when dense), codes [n, k] (int64), levels [2^b] (float32)."""

    layout: TensorLayout
    indices: torch.Tensor | None
    codes: torch.Tensor
    levels: torch.Tensor


def decode(data: bytes, layouts: list[TensorLayout], value_bits: int, dct: bool, layout: bytes, device: torch.device | str = "cpu") -> list[Decoded]:
    """Validates `data` against the layout and decodes it on `device` (one copy to it, one read of the checks back).
    ResultDecodeError on anything wrong; never allocates more than a valid result's size from hostile input."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ResultDecodeError(f"result must be bytes, got {type(data).__name__}")
    data = bytes(data)
    expected = result_size(layouts, value_bits)
    if len(data) < HEADER_BYTES:
        raise ResultDecodeError(f"truncated: {len(data)} bytes is shorter than the {HEADER_BYTES}-byte header")
    if data[:4] != MAGIC:
        raise ResultDecodeError(f"bad magic {data[:4]!r}, expected {MAGIC!r}")
    version, bits, flags, reserved = struct.unpack_from("<BBBB", data, 4)
    if version != FORMAT_VERSION:
        raise ResultDecodeError(f"unsupported version {version}, this decoder reads version {FORMAT_VERSION}")
    if bits != value_bits:
        raise ResultDecodeError(f"value_bits {bits} does not match the run's {value_bits}")
    if flags != (FLAG_DCT if dct else 0) or reserved != 0:
        raise ResultDecodeError(f"flags {flags}, {reserved} do not match the run's (dct {'on' if dct else 'off'})")
    if data[8:16] != layout:
        raise ResultDecodeError(f"layout id {data[8:16].hex()} is not this run's {layout.hex()} (another model or configuration)")
    if len(data) != expected:
        raise ResultDecodeError(f"result is {len(data)} bytes, a result for this model is exactly {expected}")
    device = torch.device(device)
    buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    n_bins = 1 << value_bits
    pos = HEADER_BYTES
    level_table = buf[pos : pos + 4 * n_bins * len(layouts)].clone().view(torch.float32).reshape(len(layouts), n_bins)
    pos += 4 * n_bins * len(layouts)
    checks: list[tuple[torch.Tensor, str]] = [(torch.isfinite(level_table).all(), "non-finite level")]
    out: list[Decoded] = []
    for i, t in enumerate(layouts):
        where = f"tensor {i} ({t.name!r})"
        upper_bytes, low_bytes, code_bytes = t.section_bytes(value_bits)
        if t.dense:
            code_bits = _unpack_bits(buf[pos : pos + code_bytes])
            pos += code_bytes
            checks.append((~code_bits[t.numel * value_bits :].bool().any(), f"{where}: nonzero padding bits after the codes"))
            codes = _fields(code_bits, t.numel, value_bits).reshape(t.n_chunks, t.chunk_elems)
            out.append(Decoded(t, None, codes, level_table[i]))
            continue
        n, k, low = t.n_chunks, t.topk, t.low_bits
        upper = _unpack_bits(buf[pos : pos + upper_bytes])
        pos += upper_bytes
        low_bits = _unpack_bits(buf[pos : pos + low_bytes])
        pos += low_bytes
        code_bits = _unpack_bits(buf[pos : pos + code_bytes])
        pos += code_bytes
        checks.append((~upper[n * t.upper_bits :].bool().any(), f"{where}: nonzero padding bits after the index high parts"))
        checks.append((~low_bits[n * k * low :].bool().any(), f"{where}: nonzero padding bits after the index low parts"))
        checks.append((~code_bits[n * k * value_bits :].bool().any(), f"{where}: nonzero padding bits after the codes"))
        rows = upper[: n * t.upper_bits].reshape(n, t.upper_bits)
        counts = rows.sum(dim=1, dtype=torch.int32)
        exact = (counts == k).all()
        checks.append((exact, f"{where}: a chunk does not hold exactly {k} indices"))
        # Positions of the set bits of each row, in order (rows that do not hold k set bits are caught above; the
        # stable sort keeps this well-defined for them too, whatever they hold).
        order = torch.sort(rows.to(torch.int8), dim=1, descending=True, stable=True).indices[:, :k]
        highs = order - torch.arange(k, device=device)
        indices = (highs << low) | _fields(low_bits, n * k, low).reshape(n, k)
        checks.append(((indices < t.chunk_elems).all() & (indices >= 0).all(), f"{where}: an index is out of range (chunk has {t.chunk_elems} elements)"))
        if k > 1:
            checks.append(((indices[:, 1:] > indices[:, :-1]).all(), f"{where}: indices of a chunk are not strictly increasing"))
        codes = _fields(code_bits, n * k, value_bits).reshape(n, k)
        out.append(Decoded(t, indices.clamp(0, t.chunk_elems - 1), codes, level_table[i]))
    verdicts = torch.stack([c for c, _ in checks]).cpu().tolist()
    for ok, (_, message) in zip(verdicts, checks):
        if not ok:
            raise ResultDecodeError(message)
    return out


# ---------------------------------------------------------------- aggregate


def code_counts(results: list[list[Decoded]], value_bits: int) -> torch.Tensor:
    """[results, tensors, 2^b] int64 on the host: how many values of each result's tensor took each code."""
    n_bins = 1 << value_bits
    rows = [torch.stack([torch.bincount(d.codes.reshape(-1), minlength=n_bins) for d in r]) for r in results]
    return torch.stack(rows).cpu()


def _norms(results: list[list[Decoded]], value_bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each result's per-tensor norm ([results, tensors], float64, host) from exact code counts, and its levels
    ([results, tensors, 2^b], float64, host)."""
    counts = code_counts(results, value_bits).to(torch.float64)
    levels = torch.stack([torch.stack([d.levels for d in r]) for r in results]).cpu().to(torch.float64)
    return (counts * levels * levels).sum(dim=2).sqrt(), levels


def median_norms(results: list[list[Decoded]], value_bits: int) -> list[float]:
    """Per tensor, the median of the results' norms (the lower middle one for an even count, as torch.median)."""
    norms, _ = _norms(results, value_bits)
    return norms.sort(dim=0).values[(norms.shape[0] - 1) // 2].tolist()


def scaled_levels(results: list[list[Decoded]], value_bits: int, median: list[float] | None = None) -> torch.Tensor:
    """Each result's levels after τemplar's norm clipping, per tensor: levels · min(1, median / (norm + 1e-8)),
    [results, tensors, 2^b] float32 on the results' device; `median` per tensor, by default the results' own
    (median_norms). Norms come from exact code counts and the factors are computed on the host in float64, rounded
    once: the same on every device."""
    norms, levels = _norms(results, value_bits)
    device = results[0][0].levels.device
    m = norms.sort(dim=0).values[(norms.shape[0] - 1) // 2] if median is None else torch.tensor(median, dtype=torch.float64)
    factors = (m / (norms + CLIP_EPS)).clamp(max=1.0)
    return (levels * factors.unsqueeze(-1)).to(torch.float32).to(device)


def aggregate(
    results: list[list[Decoded]], value_bits: int, dct: bool, median: list[float] | None = None, blocks: list[tuple[TensorLayout, int]] | None = None
) -> list[torch.Tensor]:
    """The outer step's direction per tensor (its shape, float32): for each position, the mean of the clipped values
    of the results that selected it (0 where none did). `results` in canonical order (module docstring); `median`:
    the norms to clip to, per tensor (scaled_levels). `blocks`: per tensor, only this block of it (a sharded
    client's: TensorLayout.block's layout and first chunk), computed chunk by chunk as the whole tensor's; the norms
    are still the whole results'."""
    if not results:
        raise ValueError("aggregate needs at least one result")
    scaled = scaled_levels(results, value_bits, median)
    out = []
    for i, whole in enumerate(d.layout for d in results[0]):
        t, first = (whole, 0) if blocks is None else blocks[i]
        rows = slice(first, first + t.n_chunks)
        device = results[0][i].codes.device
        total = torch.zeros(t.n_chunks, t.chunk_elems, dtype=torch.float32, device=device)
        count = torch.zeros(t.n_chunks, t.chunk_elems, dtype=torch.int32, device=device)
        for r, result in enumerate(results):
            d = result[i]
            values = scaled[r, i][d.codes[rows]]
            if d.indices is None:
                total += values
                count += 1
            else:
                indices = d.indices[rows]
                total.scatter_add_(1, indices, values)
                count.scatter_add_(1, indices, torch.ones_like(indices, dtype=torch.int32))
        mean = torch.where(count > 0, total / count.clamp(min=1).to(torch.float32), torch.zeros_like(total))
        if dct:
            mean = idct_chunks(mean, t)
        out.append(from_chunks(mean, t))
    return out
