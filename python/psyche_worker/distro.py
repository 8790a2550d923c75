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

Determinism of apply(): results are sorted by the SHA-256 of their bytes, so every replica builds the
same [chunk, entry] arrays; each entry is divided (float64) by the number of peers that sent its
coefficient, and the inverse DCT sums the entries in that canonical order with a fixed algorithm.
Nothing depends on arrival order (tested by shuffling).
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass, fields

import numpy as np
import torch

from .distro_codec import (
    VALUE_BF16,
    VALUE_FP16,
    VALUE_SIGN,
    DecodedTensor,
    EncodedTensor,
    ResultDecodeError,
    TensorSpec,
    decode_result,
    encode_result,
    quantize_values,
)

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


# ---------------------------------------------------------------- chunked DCT


def largest_divisor_at_most(n: int, limit: int) -> int:
    """The chunk length of a dimension of size n: its largest divisor <= limit (n itself if n <= limit)."""
    if n <= limit:
        return n
    best = 1
    i = 1
    while i * i <= n:
        if n % i == 0:
            if i <= limit:
                best = max(best, i)
            if n // i <= limit:
                best = max(best, n // i)
        i += 1
    return best


@functools.lru_cache(maxsize=None)
def dct_matrix(n: int) -> torch.Tensor:
    """Orthonormal DCT-II matrix D (float32) with D[k, j] = a_k cos(pi (2j+1) k / (2n)); D @ D.T = I.
    Built in float64, rounded once."""
    k = np.arange(n, dtype=np.float64)[:, None]
    j = np.arange(n, dtype=np.float64)[None, :]
    d = np.cos(np.pi * (2 * j + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
    d[0, :] = math.sqrt(1.0 / n)
    return torch.from_numpy(d.astype(np.float32))


class ChunkedDCT:
    """DCT of one tensor's shape over its chunks, as batched matmuls.

    2-D [R, C] with chunk [cr, cc]: coefficients[chunk, i*cc + j] where chunks are numbered row-major
    over the [R/cr, C/cc] grid, C_chunk = D_r @ X_chunk @ D_c^T. 1-D [N] with chunk [c]: [N/c, c]."""

    def __init__(self, shape: tuple[int, ...], chunk: tuple[int, ...], device: torch.device | str = "cpu"):
        self.shape, self.chunk = shape, chunk
        self.bases = [dct_matrix(c).to(device) for c in chunk]
        if len(shape) == 2:
            self.grid = (shape[0] // chunk[0], shape[1] // chunk[1])
        else:
            self.grid = (shape[0] // chunk[0],)
        self.n_chunks = math.prod(self.grid)
        self.chunk_elems = math.prod(chunk)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x of `shape` -> coefficients [n_chunks, chunk_elems] (float32)."""
        x = x.to(torch.float32)
        if len(self.shape) == 1:
            return x.reshape(self.n_chunks, self.chunk[0]) @ self.bases[0].T
        (rows, cols), (cr, cc) = self.shape, self.chunk
        d_r, d_c = self.bases
        # Columns first as one big GEMM, then rows as a batched GEMM over row-blocks.
        y = (x.reshape(rows * cols // cc, cc) @ d_c.T).reshape(rows // cr, cr, cols)
        z = torch.matmul(d_r, y)  # [R/cr, cr, C]
        return z.reshape(rows // cr, cr, cols // cc, cc).permute(0, 2, 1, 3).reshape(self.n_chunks, cr * cc)

    def inverse(self, coeffs: torch.Tensor) -> torch.Tensor:
        """Dense coefficients [n_chunks, chunk_elems] -> tensor of `shape`."""
        coeffs = coeffs.to(torch.float32)
        if len(self.shape) == 1:
            return (coeffs @ self.bases[0]).reshape(self.shape)
        (rows, cols), (cr, cc) = self.shape, self.chunk
        d_r, d_c = self.bases
        blocks = coeffs.reshape(rows // cr, cols // cc, cr, cc).permute(0, 2, 1, 3).reshape(rows // cr, cr, cols)
        y = torch.matmul(d_r.T, blocks)  # [R/cr, cr, C]
        return (y.reshape(rows * cols // cc, cc) @ d_c).reshape(rows, cols)

    def inverse_sparse(self, indices: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Coefficients given as K (index, value) pairs per chunk ([n_chunks, K] each; repeated indices
        add up) -> tensor of `shape`. Costs K multiply-adds per output element instead of cr + cc, so it
        is the fast path for top-k results."""
        values = values.to(torch.float32)
        if len(self.shape) == 1:
            basis_rows = self.bases[0][indices]  # [n, K, c]
            return torch.bmm(values.unsqueeze(1), basis_rows).reshape(self.shape)
        (rows, cols), (cr, cc) = self.shape, self.chunk
        d_r, d_c = self.bases
        left = d_r[indices // cc] * values.unsqueeze(-1)  # [n, K, cr]
        right = d_c[indices % cc]  # [n, K, cc]
        blocks = torch.bmm(left.transpose(1, 2), right)  # [n, cr, cc]
        return blocks.reshape(rows // cr, cols // cc, cr, cc).permute(0, 2, 1, 3).reshape(rows, cols)


def topk_per_chunk(coeffs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices [n, k] (int64) and values [n, k] of the k largest-magnitude coefficients of each chunk."""
    indices = torch.topk(coeffs.abs(), k, dim=1, sorted=False).indices
    return indices, torch.gather(coeffs, 1, indices)


# ---------------------------------------------------------------- optimizer


class DistroOptimizer:
    def __init__(self, named_params: list[tuple[str, torch.nn.Parameter]], config: DistroConfig, *, delay_correction: bool = True, value_format: str = "bf16"):
        """`value_format` ("bf16" or "fp16") is the wire type of values when quantize_1bit is false."""
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
        self.params = [p for _, p in named_params]
        self.specs: list[TensorSpec] = []
        self.transforms: list[ChunkedDCT] = []
        for name, p in named_params:
            if p.dim() not in (1, 2):
                raise ValueError(f"tensor {name!r}: DisTrO supports 1-D and 2-D parameters, got shape {list(p.shape)}")
            shape = tuple(int(s) for s in p.shape)
            chunk = tuple(largest_divisor_at_most(s, config.compression_chunk) for s in shape)
            topk = min(config.compression_topk, math.prod(chunk))
            self.specs.append(TensorSpec(name, shape, chunk, topk))
            self.transforms.append(ChunkedDCT(shape, chunk, p.device))
        self.momentum = [torch.zeros_like(p, dtype=torch.float32, memory_format=torch.contiguous_format) for p in self.params]
        self._committed: list[torch.Tensor] | None = None  # params before the speculative update, if any
        self._own_signs: list[torch.Tensor] | None = None  # sign step of the pending speculation (int8)
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
        grads = [p.grad for p in self.params]
        grad_scale = 1.0  # clipping folds into the momentum update; p.grad itself is left untouched
        if cfg.clip_grad_norm is not None:
            total_sq = sum(float(torch.sum(g.to(torch.float64) ** 2)) for g in grads if g is not None)
            total = math.sqrt(total_sq)
            if total > cfg.clip_grad_norm:
                grad_scale = cfg.clip_grad_norm / (total + 1e-6)
        encoded: list[EncodedTensor] = []
        own: list[DecodedTensor] = []
        for spec, transform, m, g in zip(self.specs, self.transforms, self.momentum, grads):
            if cfg.compression_decay != 1.0:
                m.mul_(cfg.compression_decay)
            if g is not None:
                m.add_(g.to(torch.float32), alpha=lr * grad_scale)
            coeffs = transform.forward(m)
            indices, values = topk_per_chunk(coeffs, spec.topk)
            m.sub_(transform.inverse_sparse(indices, values))
            payload, exponent, decoded = quantize_values(values, self.value_format)
            idx_np = indices.cpu().numpy()
            encoded.append(EncodedTensor(spec, idx_np, payload, exponent))
            own.append(DecodedTensor(spec, idx_np, decoded.reshape(values.shape)))
        result = encode_result(encoded, self.value_format)
        if self.delay_correction:
            committed = [p.detach().clone() for p in self.params]
            self._own_signs = self._update(committed, [own], lr, self.lookahead_scales)
            self._committed = committed
        return result

    # ---- apply

    def decode(self, result: bytes) -> list[DecodedTensor]:
        """Decode and validate one result against this model and config (ResultDecodeError if bad)."""
        return decode_result(result, self.specs, self.value_format)

    @torch.no_grad()
    def apply(self, results: list[bytes], lr: float) -> None:
        """Validate every result (ResultDecodeError naming the first bad result's index, nothing
        changed), restore the committed parameters if speculating, then x <- x*(1 - lr*wd) -
        lr*sign(IDCT(per-coefficient mean over peers)). Order of `results` does not matter. An empty
        list only discards the speculation."""
        self._check_lr(lr)
        decoded = []
        for i, result in enumerate(results):
            try:
                decoded.append((hashlib.sha256(result).digest(), self.decode(result)))
            except ResultDecodeError as e:
                raise ResultDecodeError(f"result {i}: {e}", index=i) from None
            except TypeError:
                raise ResultDecodeError(f"result {i}: must be bytes, got {type(result).__name__}", index=i) from None
        committed, own_signs = self._committed, self._own_signs
        self._committed = self._own_signs = None
        base = committed if committed is not None else self.params
        if not decoded:
            if committed is not None:
                for p, c in zip(self.params, committed):
                    p.data.copy_(c)
            return
        decoded.sort(key=lambda pair: pair[0])
        signs = self._update(base, [d for _, d in decoded], lr)
        if own_signs is not None:
            for t, (own, agg) in enumerate(zip(own_signs, signs)):
                norm = int(own.abs().sum())  # sign entries are -1, 0, 1: |s| = s*s
                if norm:
                    dot = int((own.to(torch.int64) * agg.to(torch.int64)).sum())
                    self.lookahead_scales[t] = min(1.0, max(0.0, dot / norm))

    def _update(self, base: list[torch.Tensor], results: list[list[DecodedTensor]], lr: float, scales: list[float] | None = None) -> list[torch.Tensor]:
        """params <- base * (1 - lr*wd) - lr * scale * sign(IDCT(mean of results)); `results` in canonical
        order; scale is 1 for apply(), the lookahead scale for speculation. Returns the int8 sign steps."""
        wd = self.config.weight_decay or 0.0
        signs = []
        for t, (p, b, transform) in enumerate(zip(self.params, base, self.transforms)):
            indices = np.concatenate([r[t].indices for r in results], axis=1)  # [n, K_total]
            values = np.concatenate([r[t].values for r in results], axis=1)
            if len(results) > 1:
                # Mean over the peers that sent each coefficient: divide each entry by how many
                # entries share its (chunk, index); the IDCT then sums them.
                keys = indices + np.arange(indices.shape[0], dtype=np.int64)[:, None] * transform.chunk_elems
                _, inverse, counts = np.unique(keys.reshape(-1), return_inverse=True, return_counts=True)
                values = values / counts[inverse].reshape(values.shape)
            idx_t = torch.from_numpy(indices).to(p.device)
            val_t = torch.from_numpy(values.astype(np.float32)).to(p.device)
            if indices.shape[1] < sum(transform.chunk):
                direction = transform.inverse_sparse(idx_t, val_t)
            else:
                dense = torch.zeros(transform.n_chunks, transform.chunk_elems, dtype=torch.float64, device=p.device)
                dense.scatter_add_(1, idx_t, torch.from_numpy(values).to(p.device))
                direction = transform.inverse(dense.to(torch.float32))
            sign = torch.sign(direction)
            signs.append(sign.to(torch.int8))
            # Same op sequence for speculation and apply, so a one-peer speculation (scale exactly 1.0)
            # equals apply bit for bit.
            if b is not p:
                p.data.copy_(b)
            if wd:
                p.data.mul_(1.0 - lr * wd)
            p.data.add_(sign.to(p.dtype), alpha=-lr * (scales[t] if scales is not None else 1.0))
        return signs

    @torch.no_grad()
    def update_from(self, base: list[torch.Tensor], results: list[list[DecodedTensor]], lr: float) -> None:
        """params <- `base` updated by the decoded `results` (in canonical order) exactly as apply() would, and
        nothing else: the momentum, a pending speculation and the lookahead scales stay as they are (the caller
        puts the live parameters back). Verification measures one result alone on the committed parameters."""
        self._update(base, results, lr)

    # ---- speculation

    @property
    def speculating(self) -> bool:
        """Whether a speculative update is in place: the live parameters are not the committed ones."""
        return self._committed is not None

    def discard_speculation(self) -> None:
        """Restore the committed parameters if a speculative update is in place (no-op otherwise)."""
        if self._committed is not None:
            for p, c in zip(self.params, self._committed):
                p.data.copy_(c)
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
