"""The DisTrO result format (distro_codec) on the device: encode a step's coefficients to wire bytes and decode and
validate a batch of results with tensor ops, a few per tensor group rather than per tensor, so only the bytes cross
between host and device: one copy per result each way.

distro_codec stays the reference: its NumPy decoder is the specification this one is fuzzed against
(python/tests/test_distro_wire.py), and it writes the error message of a rejected result.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from .chunked import Group
from .distro_codec import VALUE_FP16, VALUE_SIGN, ResultLayout, TensorSpec, result_layout

if sys.byteorder != "little":  # pragma: no cover - every platform torch ships for is little-endian
    raise ImportError("distro_wire reads 16-bit values in the host's byte order, which must be little-endian")

MAX_RESULTS = 65535  # per apply: the sign aggregation counts each sign in 16 bits


@dataclass
class Coefficients:
    """One group's coefficients of P results (P = 1 for a result being produced), in canonical result order:
    `indices` [P, chunks, K] (int64, the position inside the chunk) and either `negative` [P, chunks, K] (bool,
    sign results) or `values` [P, chunks, K] (float64, exact: what the wire says)."""

    indices: torch.Tensor
    negative: torch.Tensor | None = None
    values: torch.Tensor | None = None

    @property
    def results(self) -> int:
        return self.indices.shape[0]

    def signed_values(self) -> torch.Tensor:
        """The values as float64 (±1 for sign results)."""
        if self.negative is not None:
            return 1.0 - 2.0 * self.negative.to(torch.float64)
        assert self.values is not None
        return self.values


def cat_coefficients(parts: list[Coefficients]) -> Coefficients:
    if len(parts) == 1:
        return parts[0]
    indices = torch.cat([p.indices for p in parts])
    if all(p.negative is not None for p in parts):
        return Coefficients(indices, negative=torch.cat([p.negative for p in parts]))
    return Coefficients(indices, values=torch.cat([p.signed_values() for p in parts]))


class _GroupWire:
    """Where a group's tensors lie in a result of one layout: each member's offsets (host ints: the regions are
    cut as slices and stacked, one copy per group)."""

    def __init__(self, layout: ResultLayout, group: Group, spec: TensorSpec, device: torch.device):
        regions = [layout.regions[m] for m in group.members]
        self.members = len(regions)
        self.topk = spec.topk
        self.n = spec.n_chunks * spec.topk  # coefficients per tensor
        self.bits = spec.index_bits
        self.chunk_elems = spec.chunk_elems
        self.index_bytes = regions[0].index_bytes
        self.value_bytes = regions[0].value_bytes
        self.index_at = [r.indices for r in regions]
        self.value_at = [r.values for r in regions]
        self.exponent_at = [r.exponent for r in regions] if layout.value_format == VALUE_FP16 else None
        self.bit_weights = torch.tensor([1 << j for j in range(8)], dtype=torch.uint8, device=device)
        self.shifts = torch.arange(8, dtype=torch.uint8, device=device)
        self.index_bit = torch.arange(self.bits, dtype=torch.int32, device=device)


def _regions(data: torch.Tensor, starts: list[int], length: int) -> torch.Tensor:
    """[P, len(starts), length]: the byte runs of each row of data that begin at `starts`."""
    return torch.stack([data[:, s : s + length] for s in starts], dim=1)


def _unpack_indices(raw: torch.Tensor, n: int, bits: int) -> torch.Tensor:
    """[..., ceil(n * bits / 8)] packed bytes -> [..., n] indices (int64). Every 8 indices fill exactly `bits`
    bytes, so index j of each such run starts at a fixed byte and bit: a few strided reads per j."""
    runs = (n + 7) // 8
    pad = runs * bits - raw.shape[-1]
    if pad:
        raw = torch.cat([raw, raw.new_zeros(*raw.shape[:-1], pad)], dim=-1)
    runs_view = raw.reshape(*raw.shape[:-1], runs, bits)
    out = []
    for j in range(8):
        first, shift = (j * bits) >> 3, (j * bits) & 7
        word = runs_view[..., first].to(torch.int32)
        for k in range(1, (shift + bits + 7) // 8):
            word = word | (runs_view[..., first + k].to(torch.int32) << (8 * k))
        out.append((word >> shift) & ((1 << bits) - 1))
    return torch.stack(out, dim=-1).reshape(*raw.shape[:-1], runs * 8)[..., :n].to(torch.int64)


class WireCodec:
    """Encodes and decodes the results of one model layout (`specs`, grouped as `groups`) on `device`."""

    def __init__(self, specs: list[TensorSpec], groups: list[Group], device: torch.device):
        self.specs, self.groups, self.device = specs, groups, device
        self._layouts: dict[int, tuple[ResultLayout, list[_GroupWire], torch.Tensor, torch.Tensor, list[torch.Tensor]]] = {}

    def layout(self, value_format: int):
        """(layout, per-group offsets, positions of the fixed bytes, the fixed bytes, each fixed piece), built on
        first use."""
        if value_format not in self._layouts:
            layout = result_layout(self.specs, value_format)
            wires = [_GroupWire(layout, g, self.specs[g.members[0]], self.device) for g in self.groups]
            positions, fixed = [], bytearray()
            for offset, piece in layout.fixed:
                positions.extend(range(offset, offset + len(piece)))
                fixed += piece
            pieces = [torch.frombuffer(bytearray(piece), dtype=torch.uint8).to(self.device) for _, piece in layout.fixed]
            self._layouts[value_format] = (
                layout,
                wires,
                torch.tensor(positions, dtype=torch.int64, device=self.device),
                torch.frombuffer(bytearray(fixed), dtype=torch.uint8).to(self.device),
                pieces,
            )
        return self._layouts[value_format]

    # ---- encode

    def encode(self, value_format: int, parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[bytes, list[Coefficients]]:
        """The result of one step: per group, indices [chunks of all members, K] and values (float32) of the same
        shape. Returns the wire bytes (one device-to-host copy) and, per group, the coefficients exactly as a
        decoder will read them back (for the sender's own speculative update)."""
        layout, wires, _, _, pieces = self.layout(value_format)
        tensor_parts: list[torch.Tensor | None] = [None] * len(self.specs)
        readback = []
        for g, wire, (indices, values) in zip(self.groups, wires, parts):
            members = wire.members
            idx = indices.reshape(members, wire.n).to(torch.int32)
            index_bytes = self._pack_bits(((idx[..., None] >> wire.index_bit) & 1).reshape(members, -1).to(torch.uint8), wire)
            vals = values.reshape(members, wire.n).to(torch.float32)
            shape = (1, -1, wire.topk)
            if value_format == VALUE_SIGN:
                negative = vals < 0
                dynamic = [index_bytes, self._pack_bits(negative.to(torch.uint8), wire)]
                readback.append(Coefficients(indices.reshape(shape), negative=negative.reshape(shape)))
            elif value_format == VALUE_FP16:
                max_abs = vals.abs().amax(dim=1)
                _, e2 = torch.frexp(max_abs)
                # max_abs < 2**e2, so max_abs * 2**(15 - e2) < 2**15 < 65504 (fp16 max); 0 or non-finite: exponent 0
                exponent = torch.where((max_abs > 0) & torch.isfinite(max_abs), (15 - e2).clamp(-128, 127), 0).to(torch.float64)[:, None]
                half = torch.ldexp(vals.to(torch.float64), exponent).clamp(-65504.0, 65504.0).to(torch.float16)
                dynamic = [exponent.to(torch.int8).view(torch.uint8), index_bytes, half.view(torch.uint8)]
                readback.append(Coefficients(indices.reshape(shape), values=torch.ldexp(half.to(torch.float64), -exponent).reshape(shape)))
            else:
                bf16 = vals.to(torch.bfloat16)
                dynamic = [index_bytes, bf16.view(torch.uint8)]
                readback.append(Coefficients(indices.reshape(shape), values=bf16.to(torch.float64).reshape(shape)))
            dynamic = torch.cat(dynamic, dim=1)
            for j, m in enumerate(g.members):
                tensor_parts[m] = dynamic[j]
        out = torch.cat([pieces[0], *(x for header, part in zip(pieces[1:], tensor_parts) for x in (header, part))])
        if out.device.type == "cpu":
            return out.numpy().tobytes(), readback
        host = torch.empty(out.shape, dtype=torch.uint8, pin_memory=True)
        host.copy_(out)
        return host.numpy().tobytes(), readback

    @staticmethod
    def _pack_bits(bits: torch.Tensor, wire: _GroupWire) -> torch.Tensor:
        """[G, M] of 0/1 -> [G, ceil(M / 8)] bytes, LSB first, zero padding."""
        g, m = bits.shape
        pad = (-m) % 8
        if pad:
            bits = torch.cat([bits, bits.new_zeros(g, pad)], dim=1)
        return (bits.reshape(g, -1, 8) * wire.bit_weights).sum(dim=2, dtype=torch.uint8)

    # ---- decode

    def decode(self, value_format: int, data: torch.Tensor) -> tuple[list[Coefficients], torch.Tensor]:
        """`data` [P, layout size] (uint8 on the device): P results of this value format. Returns per group their
        coefficients and a bool [P] marking the results that are not valid (wrong fixed bytes, an index out of
        range or repeated in a chunk, nonzero padding, a non-finite value). Nothing is synchronized: the caller
        reads the flags once for all formats."""
        layout, wires, fixed_at, fixed, _ = self.layout(value_format)
        p = data.shape[0]
        bad = (data[:, fixed_at] != fixed).any(dim=1)
        groups = []
        for wire in wires:
            raw = _regions(data, wire.index_at, wire.index_bytes)  # [P, G, index bytes]
            bad |= _padding_nonzero(raw, wire.n * wire.bits)
            indices = _unpack_indices(raw, wire.n, wire.bits)  # [P, G, n]
            bad |= (indices >= wire.chunk_elems).flatten(1).any(dim=1)
            per_chunk = indices.reshape(p, -1, wire.topk)
            bad |= _repeated(per_chunk, wire.chunk_elems)
            raw = _regions(data, wire.value_at, wire.value_bytes)
            if value_format == VALUE_SIGN:
                bad |= _padding_nonzero(raw, wire.n)
                negative = ((raw[..., None] >> wire.shifts) & 1).reshape(p, wire.members, -1)[..., : wire.n].to(torch.bool)
                groups.append(Coefficients(per_chunk, negative=negative.reshape(p, -1, wire.topk)))
                continue
            if value_format == VALUE_FP16:
                exponent = _regions(data, wire.exponent_at, 1).view(torch.int8).to(torch.float64)  # [P, G, 1]
                values = torch.ldexp(raw.view(torch.float16).to(torch.float64), -exponent)
            else:
                values = raw.view(torch.bfloat16).to(torch.float64)
            bad |= ~torch.isfinite(values).flatten(1).all(dim=1)
            groups.append(Coefficients(per_chunk, values=values.reshape(p, -1, wire.topk)))
        return groups, bad


def _repeated(indices: torch.Tensor, chunk_elems: int) -> torch.Tensor:
    """[P]: whether any chunk of indices [P, chunks, K] (each below `chunk_elems`, else the result is rejected
    anyway) holds an index twice. For a small K, every pair of positions compared across all chunks at once
    (cheaper than sorting K-element rows); else sorted."""
    p, _, k = indices.shape
    if k == 1:
        return torch.zeros(p, dtype=torch.bool, device=indices.device)
    if k > 16:
        ordered = indices.sort(dim=2).values
        return (ordered[:, :, 1:] == ordered[:, :, :-1]).flatten(1).any(dim=1)
    columns = indices.permute(2, 0, 1).to(torch.int16 if chunk_elems <= 1 << 15 else torch.int32)  # [K, P, chunks]
    repeated = torch.zeros(indices.shape[:2], dtype=torch.bool, device=indices.device)
    for a in range(k):
        for b in range(a + 1, k):
            repeated |= columns[a] == columns[b]
    return repeated.any(dim=1)


def _padding_nonzero(raw: torch.Tensor, bits: int) -> torch.Tensor:
    """[P]: whether any bit after the first `bits` of the runs raw [P, G, bytes] is set."""
    used = bits % 8
    if used == 0:
        return torch.zeros(raw.shape[0], dtype=torch.bool, device=raw.device)
    return ((raw[..., -1] >> used) != 0).any(dim=1)
