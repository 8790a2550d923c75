"""DisTrO / DeMo optimizer: chunked-DCT top-k compression of a momentum residual, sign-SGD on the
average of every peer's compressed momentum.

Per parameter tensor each client keeps a residual buffer m. One step:

    produce(lr):  g <- clip(grad);  m <- decay * m + lr * g
                  C <- DCT(m) per chunk;  q <- top-k |C| per chunk (indices + values or sign bits)
                  m <- m - IDCT(q)            (the unquantized values that were selected)
                  -> encoded q (distro_codec format)
    apply(qs, lr): for each coefficient, mean of the values of the peers that sent it;
                  x <- x * (1 - lr * weight_decay) - lr * sign(IDCT(mean))

Weight decay is applied in apply(), not produce(), so that every replica (including ones that did
not produce this step) applies exactly the same operations to the same bytes.

Delay correction (one-step lookahead). The client's result for step t is gossiped while the client
computes step t+1's gradient, so that gradient would be taken at parameters missing step t's update
(a stale gradient). Psyche (shared/modeling/src/distro.rs) corrects for this with a lookahead: after
generating its result the client subtracts lr * sign(its full momentum) from the parameters
(`error_correction`) and adds it back at the start of the next step, before the aggregate is applied.
We keep the idea and change three things:

  * the speculative update is computed by the very same routine as apply() with the client's own
    result as the only input: x_spec = x_t * (1 - lr*wd) - a * lr * sign(IDCT(q_own)), where a is a
    per-tensor lookahead scale in [0, 1]: the least-squares fit of the last step's aggregate sign step
    onto the client's own (a = <s_own, s_agg> / <s_own, s_own>). A full (a = 1) own-sign lookahead
    made the gradient error *worse* than no lookahead with 4+ heterogeneous peers in our toy
    experiment (the aggregate's signs agree with one client's on too few coordinates); the fitted
    scale made it better for 2, 4 and 8 peers (gradient error vs. the undelayed gradient 0.85x,
    0.94x, 0.97x of the stale one). With one peer a stays exactly 1.0 and the speculation IS the
    aggregated update, so the delayed trajectory equals the non-delayed one bit for bit (tested).
  * instead of adding the speculative step back (float add/sub does not round-trip), the
    committed parameters x_t are kept in a copy and restored bit-exactly by apply(). So speculation
    never leaks into the replicated state: after apply() every replica holds identical bytes
    whether or not (and with whatever result) it speculated.

Expected call order per step: [forward/backward at x_spec] -> apply(results of t-1) -> produce(lr_t).
Calling apply() before the forward/backward also works (no lookahead benefit, same bytes). Between
produce() and apply() the live parameters are speculative: call `discard_speculation()` (or read
`committed_parameters()`) before exporting/hashing parameters at that point. Memory cost: one copy of
the parameters plus one int8 per parameter. Disable with `DistroOptimizer(..., delay_correction=False)`.

Where the work runs: on the parameters' device. Tensors of one (shape, chunk, topk) form a group (chunked.py)
with one momentum buffer, so a step is a few batched operations per shape. produce() encodes on the device and
copies the result's bytes to the host once; apply() copies the results of one value format to the device at once,
decodes and validates them there (distro_wire.py; one sync for every result's validity flag), then, per group,
aggregates them in the coefficient domain and runs one inverse DCT, however many results there are. Tensors of
more than two dimensions (fused experts [E, R, C]) are stacks of matrices, each with its own chunks.

Determinism of apply(): results are put in a canonical order (by the SHA-256 of their bytes, as before the work
moved to the device, so that replicas of either version agree bit for bit). Each coefficient's entries are
counted in integers; 1-bit results' ±1 are summed in float32, exact for any order of the adds; value results are
summed in float64 one result at a time in the canonical order, so no two adds to one coefficient race on any
device. The mean (sum / count) is rounded once to float32 and the inverse DCT is a fixed algorithm. With few
entries per chunk the sparse inverse sums each entry divided by its coefficient's count, entries in canonical
order. Nothing depends on arrival order (tested by shuffling, 64 results, on CPU and CUDA).
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numpy as np
import torch

from .chunked import ChunkedDCT, Group, chunk_for, dct_matrix, group_layouts, largest_divisor_at_most, topk_per_chunk
from .distro_codec import (
    VALUE_BF16,
    VALUE_FP16,
    VALUE_SIGN,
    DecodedTensor,
    ResultDecodeError,
    TensorSpec,
    decode_result,
)
from .distro_wire import MAX_RESULTS, Coefficients, WireCodec, cat_coefficients

if TYPE_CHECKING:
    from .sharding import Sharding

__all__ = ["DistroConfig", "DistroOptimizer", "ResultDecodeError", "dct_matrix", "largest_divisor_at_most", "ChunkedDCT", "topk_per_chunk"]


MAX_CHUNK = 4096


@dataclass
class DistroConfig:
    """`[model.LLM.optimizer.Distro]` of a Psyche run config; field names exactly as in the TOML."""

    compression_decay: float = 0.999
    compression_chunk: int = 64
    compression_topk: int = 8
    quantize_1bit: bool = True
    clip_grad_norm: float | None = None
    weight_decay: float | None = None

    @classmethod
    def from_dict(cls, d: dict) -> "DistroConfig":
        if not isinstance(d, dict):
            raise ValueError(f"Distro config must be a table, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"Distro config: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        cfg = cls(**d)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        def number(name, value, optional=False):
            if value is None and optional:
                return
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"Distro config: {name} must be a finite number, got {value!r}")

        number("compression_decay", self.compression_decay)
        if not 0.0 <= self.compression_decay <= 1.0:
            raise ValueError(f"Distro config: compression_decay must be in [0, 1], got {self.compression_decay}")
        for name in ("compression_chunk", "compression_topk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Distro config: {name} must be an integer >= 1, got {value!r}")
        # The run-config validator enforces the same limits (src/core/config/run-config.ts DISTRO_MAX_CHUNK).
        if self.compression_chunk > MAX_CHUNK:
            raise ValueError(f"Distro config: compression_chunk must be <= {MAX_CHUNK}, got {self.compression_chunk}")
        if self.compression_topk > self.compression_chunk:
            raise ValueError(f"Distro config: compression_topk must be <= compression_chunk ({self.compression_chunk}), got {self.compression_topk}")
        if not isinstance(self.quantize_1bit, bool):
            raise ValueError(f"Distro config: quantize_1bit must be true or false, got {self.quantize_1bit!r}")
        number("clip_grad_norm", self.clip_grad_norm, optional=True)
        if self.clip_grad_norm is not None and self.clip_grad_norm <= 0:
            raise ValueError(f"Distro config: clip_grad_norm must be > 0, got {self.clip_grad_norm}")
        number("weight_decay", self.weight_decay, optional=True)
        if self.weight_decay is not None and self.weight_decay < 0:
            raise ValueError(f"Distro config: weight_decay must be >= 0, got {self.weight_decay}")


# ---------------------------------------------------------------- optimizer


@functools.cache
def _hashing_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="distro-sha256")


def _digests(blobs: dict[int, bytes]) -> dict[int, bytes]:
    """The SHA-256 of each result, whose order is apply's canonical order (as it always was), hashed on several
    threads when there is much to hash (hashlib releases the GIL)."""
    if len(blobs) < 2:
        return dict.fromkeys(blobs, b"")
    keys = list(blobs)
    if sum(len(blobs[i]) for i in keys) < 1 << 22:
        return {i: hashlib.sha256(blobs[i]).digest() for i in keys}
    return dict(zip(keys, _hashing_pool().map(lambda i: hashlib.sha256(blobs[i]).digest(), keys)))


class DistroOptimizer:
    def __init__(
        self,
        named_params: list[tuple[str, torch.nn.Parameter]],
        config: DistroConfig,
        *,
        delay_correction: bool = True,
        value_format: str = "bf16",
        sharding: Sharding | None = None,
    ):
        """`value_format` ("bf16" or "fp16") is the wire type of values when quantize_1bit is false. `sharding`: the
        parameters are FSDP shards (sharding.py); this rank works on its own chunks of each split tensor (below)."""
        config.validate()
        self.config = config
        self.delay_correction = delay_correction
        if config.quantize_1bit:
            self.value_format = VALUE_SIGN
        elif value_format in ("bf16", "fp16"):
            self.value_format = VALUE_BF16 if value_format == "bf16" else VALUE_FP16
        else:
            raise ValueError(f"value_format must be 'bf16' or 'fp16', got {value_format!r}")
        names = [n for n, _ in named_params]
        if len(set(names)) != len(names):
            raise ValueError("named_params has duplicate names")
        self.names = names
        self.sharding = sharding
        # the parameters as the model holds them (FSDP's DTensors when sharded), and the blocks this rank works on
        self.sources = [p for _, p in named_params]
        self.params = [p if sharding is None else sharding.local(p) for _, p in named_params]
        self.specs: list[TensorSpec] = []
        for name, p in named_params:
            if p.dim() == 0:
                raise ValueError(f"tensor {name!r}: DisTrO compresses tensors of one or more dimensions, got a scalar")
            shape = tuple(int(s) for s in p.shape)
            if 0 in shape:
                raise ValueError(f"tensor {name!r}: DisTrO cannot compress an empty tensor (shape {list(shape)})")
            chunk = chunk_for(shape, config.compression_chunk)
            self.specs.append(TensorSpec(name, shape, chunk, min(config.compression_topk, math.prod(chunk))))
        devices = {p.device for p in self.params}
        if len(devices) > 1:
            raise ValueError(f"DisTrO: every parameter must be on one device, got {sorted(map(str, devices))}")
        self.device = devices.pop() if devices else torch.device("cpu")
        # Tensors of one shape are one group: one momentum buffer, one DCT, one top-k per step.
        self.groups = group_layouts([(s.shape, s.chunk, s.topk) for s in self.specs])
        # Sharded: a split tensor's block on this rank is whole chunk rows (sharding.py), so its chunks are one run of
        # the tensor's chunk numbering; every member of a group (one shape) is split alike.
        self._split = [sharding is not None and sharding.is_split(self.sources[g.members[0]]) for g in self.groups]
        local_shapes = [tuple(int(s) for s in self.params[g.members[0]].shape) for g in self.groups]
        self._transforms = [ChunkedDCT(shape, g.chunk, self.device) for g, shape in zip(self.groups, local_shapes)]
        self._momentum = [torch.zeros((len(g.members), *shape), dtype=torch.float32, device=self.device) for g, shape in zip(self.groups, local_shapes)]
        self.transforms: list[ChunkedDCT] = [None] * len(self.params)  # type: ignore[list-item]
        self.momentum: list[torch.Tensor] = [None] * len(self.params)  # type: ignore[list-item]
        for g, transform, buffer in zip(self.groups, self._transforms, self._momentum):
            for j, m in enumerate(g.members):
                self.transforms[m] = transform
                self.momentum[m] = buffer[j]  # a view: the group's buffer is what the step works on
        self.wire = WireCodec(self.specs, self.groups, self.device)
        self._committed: list[torch.Tensor] | None = None  # params before the speculative update, if any
        self._committed_buffers: list[torch.Tensor] | None = None  # kept from one step to the next
        self._own_signs: list[torch.Tensor] | None = None  # sign step of the pending speculation (int8, per group)
        # Per-tensor lookahead scale: the least-squares fit of the last aggregate sign step onto our own
        # (1.0 = peers agreed with us everywhere; 0 = no correlation). Starts optimistic at 1.0.
        self.lookahead_scales = [1.0] * len(self.params)

    # ---- produce

    @torch.no_grad()
    def produce(self, lr: float) -> bytes:
        """Called after backward (p.grad holds this step's gradient; a missing grad counts as zero):
        clip, momentum update, compress, subtract what was sent from the momentum. Returns the encoded
        result. With delay_correction, first restores the committed parameters if a previous
        speculation was never resolved by apply(), then applies this result speculatively (module
        docstring)."""
        self._check_lr(lr)
        self.discard_speculation()
        cfg = self.config
        present = [(m, self._grad(p)) for m, p in zip(self.momentum, self.sources) if p.grad is not None]
        if cfg.compression_decay != 1.0:
            torch._foreach_mul_(self._momentum, cfg.compression_decay)
        if present:
            momenta = [m for m, _ in present]
            grads = [g.to(torch.float32) for _, g in present]
            if cfg.clip_grad_norm is None:
                torch._foreach_add_(momenta, grads, alpha=lr)
            else:
                # clipping folds into the momentum update (p.grad is left untouched), without a sync: the
                # norm stays on the device
                total = torch.linalg.vector_norm(torch.stack(self._norms(grads, [p for p in self.sources if p.grad is not None], torch.float64)))
                scale = torch.where(total > cfg.clip_grad_norm, cfg.clip_grad_norm / (total + 1e-6), 1.0)
                step = (lr * scale).to(torch.float32)
                torch._foreach_addcmul_(momenta, grads, [step] * len(grads))
        parts = []
        for g, split, transform, momentum in zip(self.groups, self._split, self._transforms, self._momentum):
            indices, values = topk_per_chunk(transform.forward(momentum), g.topk)
            momentum.sub_(transform.inverse_sparse(indices, values).view_as(momentum))
            if split:  # every rank's chunks of each member, in the tensor's chunk order
                indices, values = (self._assemble(g, t) for t in (indices, values))
            parts.append((indices, values))
        result, own = self.wire.encode(self.value_format, parts)
        own = self._local_coefficients(own)
        if self.delay_correction:
            if self._committed_buffers is None:
                self._committed_buffers = [torch.empty_like(p, memory_format=torch.contiguous_format) for p in self.params]
            torch._foreach_copy_(self._committed_buffers, self._data())
            self._own_signs, _ = self._step(own, lr, self.lookahead_scales, keep_signs=True)
            self._committed = self._committed_buffers
        return result

    # ---- apply

    def decode(self, result: bytes) -> list[DecodedTensor]:
        """Decode and validate one result against this model and config on the host (ResultDecodeError if bad):
        the reference decoder (distro_codec), for inspection and tests; apply() decodes on the device."""
        return decode_result(result, self.specs, self.value_format)

    @torch.no_grad()
    def apply(self, results: list[bytes], lr: float) -> None:
        """Validate every result (ResultDecodeError naming the first bad result's index, nothing
        changed), restore the committed parameters if speculating, then x <- x*(1 - lr*wd) -
        lr*sign(IDCT(per-coefficient mean over peers)). Order of `results` does not matter. An empty
        list only discards the speculation."""
        self._check_lr(lr)
        coefficients = self._decode_all(results)
        committed, own_signs = self._committed, self._own_signs
        self._committed = self._own_signs = None
        if coefficients is None:
            if committed is not None:
                torch._foreach_copy_(self._data(), committed)
            return
        _, dots = self._step(self._local_coefficients(coefficients), lr, None, base=committed, own_signs=own_signs)
        if own_signs is not None:
            self._fit_lookahead(own_signs, dots)

    def _decode_all(self, results: list[bytes]) -> list[Coefficients] | None:
        """Every result's coefficients per group, in canonical order (by the SHA-256 of the results' bytes), on the
        device: one host-to-device copy per value format, one sync for the validity flags of all of them. The first
        bad result (by position) raises ResultDecodeError with its `index`."""
        if len(results) > MAX_RESULTS:
            raise ResultDecodeError(f"{len(results)} results in one apply; at most {MAX_RESULTS}")  # no one result's fault
        allowed = (VALUE_SIGN,) if self.value_format == VALUE_SIGN else (VALUE_FP16, VALUE_BF16)
        blobs: list[bytes] = []
        by_format: dict[int, list[int]] = {}
        bad: list[int] = []
        for i, r in enumerate(results):
            blob = bytes(r) if isinstance(r, (bytearray, memoryview)) else r
            blobs.append(blob)
            fmt = blob[5] if isinstance(blob, bytes) and len(blob) > 5 else None
            if fmt in allowed and len(blob) == self.wire.layout(fmt)[0].size:
                by_format.setdefault(fmt, []).append(i)
            else:
                bad.append(i)  # the reference decoder says why, below
        if not results:
            return None
        digests = _digests({i: blobs[i] for members in by_format.values() for i in members})
        decoded, flags, rows = [], [], []
        for fmt in sorted(by_format):
            order = sorted(by_format[fmt], key=digests.__getitem__)
            size = self.wire.layout(fmt)[0].size
            host = torch.empty((len(order), size), dtype=torch.uint8, pin_memory=self.device.type == "cuda")
            view = host.numpy()
            for row, i in enumerate(order):
                view[row, :size] = np.frombuffer(blobs[i], dtype=np.uint8)
            groups, invalid = self.wire.decode(fmt, host.to(self.device, non_blocking=True))
            decoded.append(groups)
            flags.append(invalid)
            rows.extend(order)
        if flags:
            invalid = torch.cat(flags).cpu().tolist()
            bad.extend(i for i, flag in zip(rows, invalid) if flag)
        if bad:
            self._reject(min(bad), results[min(bad)])
        coefficients = [cat_coefficients([groups[k] for groups in decoded]) for k in range(len(self.groups))]
        canonical = sorted(range(len(rows)), key=lambda row: digests[rows[row]])
        if canonical != list(range(len(rows))):  # results of both value formats: one order for all of them
            at = torch.tensor(canonical, device=self.device)
            coefficients = [Coefficients(c.indices[at], values=c.signed_values()[at]) for c in coefficients]
        return coefficients

    def _reject(self, index: int, result) -> None:
        """Raises the ResultDecodeError of result `index`: the reference decoder's reason, with the index."""
        if not isinstance(result, (bytes, bytearray, memoryview)):
            raise ResultDecodeError(f"result {index}: must be bytes, got {type(result).__name__}", index=index)
        try:
            decode_result(result, self.specs, self.value_format)
        except ResultDecodeError as e:
            raise ResultDecodeError(f"result {index}: {e}", index=index) from None
        raise ResultDecodeError(f"result {index}: rejected by the device decoder but not by the reference decoder", index=index)

    def _step(
        self,
        coefficients: list[Coefficients],
        lr: float,
        scales: list[float] | None,
        base: list[torch.Tensor] | None = None,
        keep_signs: bool = False,
        own_signs: list[torch.Tensor] | None = None,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """params <- base * (1 - lr*wd) - lr * scale * sign(IDCT(per-coefficient mean)); base None: the params as
        they are. scale is 1 for apply(), the lookahead scale for speculation. The same operations for both, so a
        one-peer speculation (scale exactly 1.0) equals apply bit for bit. Returns per group the int8 sign steps
        (if `keep_signs`) and, given the speculation's `own_signs`, each member's <own, this step's signs>."""
        wd = self.config.weight_decay or 0.0
        if base is not None:
            torch._foreach_copy_(self._data(), base)
        signs, dots = [], []
        for i, (g, transform, coeff) in enumerate(zip(self.groups, self._transforms, coefficients)):
            sign = self._direction(g, transform, coeff).sign_()
            if keep_signs:
                signs.append(sign.to(torch.int8))
            if own_signs is not None:  # integers below 2**53: exact in float64
                dots.append((sign.view(len(g.members), -1) * own_signs[i].view(len(g.members), -1)).sum(dim=1, dtype=torch.float64))
            params = [self.params[m].data for m in g.members]
            if wd:
                torch._foreach_mul_(params, 1.0 - lr * wd)
            # alpha * sign is exact (sign is -1, 0 or 1): the same bytes however the add is grouped
            steps = [-lr * (scales[m] if scales is not None else 1.0) for m in g.members]
            if len(set(steps)) == 1:
                torch._foreach_add_(params, list(sign.unbind(0)), alpha=steps[0])
            else:
                for p, s, step in zip(params, sign.unbind(0), steps):
                    p.add_(s, alpha=step)
        return signs, dots

    def _direction(self, g: Group, transform: ChunkedDCT, coeff: Coefficients) -> torch.Tensor:
        """IDCT of the per-coefficient mean over the results that sent each coefficient: [members, *shape]."""
        results, rows, k = coeff.indices.shape
        shape = (len(g.members), *transform.shape)  # this rank's block of each member when sharded
        # The sparse inverse costs an entry's multiply-add per element, the dense one cr + cc (c for 1-D): the
        # sparse one below that many entries per chunk, as the module always chose (the same bytes).
        sparse = results * k < sum(transform.chunk[-2:])
        if results == 1 and sparse:
            return transform.inverse_sparse(coeff.indices[0], coeff.signed_values()[0]).view(shape)
        # Entries chunk by chunk (each chunk's results in canonical order), so the accumulation below walks the
        # coefficients in memory order.
        by_chunk = lambda t: t.transpose(0, 1).reshape(rows, results * k)  # noqa: E731
        offsets = torch.arange(rows, device=self.device)[:, None] * transform.chunk_elems
        keys = (by_chunk(coeff.indices) + offsets).reshape(-1)
        # Count the entries of each coefficient (and for sign results sum their ±1) in exact arithmetic: the same
        # on every replica whatever the order of the adds.
        size = rows * transform.chunk_elems
        counts = torch.zeros(size, dtype=torch.int32, device=self.device)
        counts.scatter_add_(0, keys, torch.ones_like(keys, dtype=torch.int32))
        if sparse:
            # Few entries per chunk: the sparse inverse of every entry weighted by 1/count (it sums a
            # coefficient's entries: their mean)
            weights = (by_chunk(coeff.signed_values()).reshape(-1) / counts.take(keys)).to(torch.float32)
            return transform.inverse_sparse(keys.view(rows, -1) - offsets, weights.view(rows, -1)).view(shape)
        if coeff.negative is not None:
            # Many entries per chunk, so every coefficient at once: sum / count (integers below 2**24, exact in
            # float32: one rounding, of the quotient), 0 where no result sent one
            dense = torch.zeros(size, dtype=torch.float32, device=self.device)
            dense.scatter_add_(0, keys, 1.0 - 2.0 * by_chunk(coeff.negative).reshape(-1).to(torch.float32))
            dense.div_(counts.clamp_min_(1))
            return transform.inverse(dense.view(rows, transform.chunk_elems)).view(shape)
        # Value results are summed one result at a time, in canonical order: no two adds to one coefficient in one
        # call, so the sum is in the same order on every device.
        sums = torch.zeros(size, dtype=torch.float64, device=self.device)
        for values, at in zip(coeff.values.reshape(results, -1), (coeff.indices + offsets[None]).reshape(results, -1)):
            sums.index_add_(0, at, values)
        dense = (sums / counts.clamp_min_(1)).to(torch.float32)
        return transform.inverse(dense.view(rows, transform.chunk_elems)).view(shape)

    def _fit_lookahead(self, own_signs: list[torch.Tensor], dots: list[torch.Tensor]) -> None:
        """Each tensor's lookahead scale: <own, aggregate> / <own, own> of the sign steps, clamped to [0, 1]; one
        device-to-host copy for all of them."""
        # sign entries are -1, 0, 1: <own, own> counts the nonzero ones
        norms = [torch.count_nonzero(own.view(len(g.members), -1), dim=1) for g, own in zip(self.groups, own_signs)]
        both = torch.stack([torch.cat(dots), torch.cat(norms).to(torch.float64)])
        if self.sharding is not None:
            # a split tensor's sums are its blocks' sums (integers: exact in float64); a whole one counts once
            once = [1.0 if split or self.sharding.rank == 0 else 0.0 for g, split in zip(self.groups, self._split) for _ in g.members]
            both = self.sharding.all_reduce_sum_(both * torch.tensor(once, dtype=torch.float64, device=both.device))
        dot, norm = both.cpu().tolist()
        members = [m for g in self.groups for m in g.members]
        for m, d, n in zip(members, dot, norm):
            if n:
                self.lookahead_scales[m] = min(1.0, max(0.0, d / n))

    def _host_coefficients(self, results: list[list[DecodedTensor]]) -> list[Coefficients]:
        """Per group, the coefficients of results decoded on the host (decode()), in the order given."""
        coefficients = []
        for g in self.groups:
            indices = torch.from_numpy(np.stack([np.concatenate([r[m].indices for m in g.members]) for r in results])).to(self.device)
            values = torch.from_numpy(np.stack([np.concatenate([r[m].values for m in g.members]) for r in results])).to(self.device)
            if self.value_format == VALUE_SIGN:
                coefficients.append(Coefficients(indices, negative=values < 0))
            else:
                coefficients.append(Coefficients(indices, values=values))
        return coefficients

    def _data(self) -> list[torch.Tensor]:
        return [p.data for p in self.params]

    # ---- shards

    def _grad(self, p: torch.Tensor) -> torch.Tensor:
        """This rank's block of a parameter's gradient."""
        return p.grad if self.sharding is None else self.sharding.local(p.grad)

    def _norms(self, grads: list[torch.Tensor], sources: list[torch.Tensor], dtype: torch.dtype | None) -> list[torch.Tensor]:
        """Each gradient's L2 norm, computed as an unsharded client computes it: over the whole tensor, so a split
        one is gathered (one tensor at a time: a transient copy of the largest gradient)."""
        if self.sharding is None:
            return list(torch._foreach_norm(grads, 2, dtype=dtype))
        norms = []
        for g, p in zip(grads, sources):
            whole = self.sharding.gather_rows(g).reshape(p.shape) if self.sharding.is_split(p) else g
            norms.append(torch._foreach_norm([whole], 2, dtype=dtype)[0])
        return norms

    def grad_norm(self) -> torch.Tensor:
        """The total gradient norm as torch.nn.utils.get_total_norm gives it for an unsharded client (unread)."""
        present = [p for p in self.sources if p.grad is not None]
        if not present:
            return torch.zeros((), device=self.device)
        return torch.linalg.vector_norm(torch.stack(self._norms([self._grad(p) for p in present], present, None)), 2)

    def _assemble(self, g: Group, t: torch.Tensor) -> torch.Tensor:
        """A split group's per-chunk rows [members * local chunks, K] of this rank -> those of the whole tensors
        [members * chunks, K], each member's chunks in order (rank 0's run first)."""
        assert self.sharding is not None
        members, k = len(g.members), t.shape[-1]
        every = self.sharding.gather_rows(t.reshape(members, -1, k))  # [world, members, local chunks, K]
        return every.transpose(0, 1).reshape(-1, k)

    def _local_coefficients(self, coefficients: list[Coefficients]) -> list[Coefficients]:
        """Per group, the coefficients of this rank's chunks (a split group's run of each member's chunks)."""
        if self.sharding is None:
            return coefficients
        rank, world = self.sharding.rank, self.sharding.world
        out = []
        for g, split, c in zip(self.groups, self._split, coefficients):
            if not split:
                out.append(c)
                continue

            def cut(t: torch.Tensor | None, members: int = len(g.members)) -> torch.Tensor | None:
                if t is None:
                    return None
                return t.reshape(t.shape[0], members, world, -1, t.shape[-1])[:, :, rank].reshape(t.shape[0], -1, t.shape[-1])

            out.append(Coefficients(cut(c.indices), negative=cut(c.negative), values=cut(c.values)))
        return out

    @torch.no_grad()
    def update_from(self, base: list[torch.Tensor], results: list[list[DecodedTensor]], lr: float) -> None:
        """params <- `base` updated by the decoded `results` (in canonical order) exactly as apply() would, and
        nothing else: the momentum, a pending speculation and the lookahead scales stay as they are (the caller
        puts the live parameters back). Verification measures one result alone on the committed parameters."""
        self._step(self._local_coefficients(self._host_coefficients(results)), lr, None, base=base)

    # ---- speculation

    @property
    def speculating(self) -> bool:
        """Whether a speculative update is in place: the live parameters are not the committed ones."""
        return self._committed is not None

    def discard_speculation(self) -> None:
        """Restore the committed parameters if a speculative update is in place (no-op otherwise)."""
        if self._committed is not None:
            torch._foreach_copy_(self._data(), self._committed)
            self._committed = self._own_signs = None

    def committed_parameters(self) -> list[tuple[str, torch.Tensor]]:
        """The replicated (non-speculative) parameter values, in model order."""
        source = self._committed if self._committed is not None else [p.detach() for p in self.params]
        return list(zip(self.names, source))

    # ---- checkpointing

    def state_dict(self) -> dict:
        return {
            "format": "psyche-distro-state-v1",
            "config": {f.name: getattr(self.config, f.name) for f in fields(DistroConfig)},
            "momentum": {n: m.clone() for n, m in zip(self.names, self.momentum)},
            "lookahead_scales": list(self.lookahead_scales),
            "committed": None if self._committed is None else {n: c.clone() for n, c in zip(self.names, self._committed)},
        }

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get("format") != "psyche-distro-state-v1":
            raise ValueError("DisTrO state: missing or unknown 'format' (expected psyche-distro-state-v1)")
        momentum = state.get("momentum")
        if not isinstance(momentum, dict) or set(momentum) != set(self.names):
            missing = sorted(set(self.names) - set(momentum or {}))
            extra = sorted(set(momentum or {}) - set(self.names))
            raise ValueError(f"DisTrO state: momentum tensors do not match the model (missing {missing[:5]}, unexpected {extra[:5]})")
        committed = state.get("committed")
        for label, table in (("momentum", momentum), ("committed", committed)):
            if table is None:
                continue
            for name, p in zip(self.names, self.params):
                t = table.get(name) if isinstance(table, dict) else None
                if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(p.shape):
                    raise ValueError(f"DisTrO state: {label} tensor {name!r} missing or has the wrong shape (expected {list(p.shape)})")
        scales = state.get("lookahead_scales", [1.0] * len(self.params))
        if not isinstance(scales, list) or len(scales) != len(self.params) or not all(isinstance(a, (int, float)) and 0.0 <= a <= 1.0 for a in scales):
            raise ValueError(f"DisTrO state: lookahead_scales must be {len(self.params)} numbers in [0, 1]")
        for m, name in zip(self.momentum, self.names):
            m.copy_(momentum[name].to(m.device))
        self.lookahead_scales = [float(a) for a in scales]
        self._own_signs = None
        self._committed = None if committed is None else [committed[n].to(device=p.device, dtype=p.dtype).clone() for n, p in zip(self.names, self.params)]

    @staticmethod
    def _check_lr(lr: float) -> None:
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr < 0:
            raise ValueError(f"lr must be a finite number >= 0, got {lr!r}")
