"""SparseLoCo (`[model.LLM.optimizer.SparseLoCo]`, arXiv 2508.15706), τemplar's algorithm: local steps with a
sparse, 2-bit, error-feedback pseudo-gradient, behind the optimizer interface. The compressor, its wire format and
the outer step's aggregation are ../sparseloco_codec.py's.

A round of one client:

    begin_round:  θ_start ← θ;  H inner AdamW steps on the round's batch, split into H consecutive parts (the
                  run's lr_schedule at inner step step·H + i, gradients clipped to inner.clip_grad_norm);
                  e ← β·e + (θ_start − θ_H);  θ ← θ_start (bit for bit)
    apply:        θ ← θ − α · aggregate(the round's accepted results)   (τemplar's outer step: SGD at outer_lr)
    produce:      result ← compress(e) (chunk-wise top-k, quantized);  e ← e − what the result decodes to

**Communication behind compute.** A client begins round r+1's inner steps while round r's results are still moving,
and applies them (finish_round) only after, one round late, as DisTrO's one-step lookahead does. So that round r+1
does not start from parameters missing round r's update, produce (with `delay_correction`, the network path) moves
the live parameters by the client's own result alone, with the very routine apply uses — θ_spec = θ − α ·
aggregate([own]) — and keeps the committed θ; apply restores the committed bytes before the real aggregate, so the
speculation never reaches the replicated state. With one client the speculation is the aggregate, so the delayed
trajectory equals the undelayed one bit for bit (tested). What the delay costs with 4 clients: bench/README.md.

**Single-node simulation** (`step`, `psyche train --simulate-peers N`): the round's batch is split among N simulated
clients, each with its own inner AdamW state and error feedback, all from the same parameters; their results are
applied at once, or (with `delay_correction`) each client's inner steps start where the network path starts them:
from the parameters before the previous round's results, moved by its own previous result.

Inner steps: a round's rows split into H parts as evenly as rows allow; a part with no rows is skipped. The inner
AdamW state and the error feedback stay across rounds (τemplar keeps both). Weight decay applies to matrices only.

**A sharded client** (`--shard N`, ../sharding.py): a split tensor's block on each rank is whole chunk rows
(`shard_rows`), so each rank keeps the error feedback and inner AdamW moments of its blocks, selects its chunks'
top-k, and applies the outer step to its chunks; the selections are gathered in chunk order to be quantized and
encoded whole, and the result and the parameters are an unsharded client's, bit for bit. Not with `dct`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from .. import sparseloco_codec as codec
from ..protocol import WorkerError
from .adamw import AdamWConfig, split_decay_groups
from .base import Batch, BuildContext, CommunicatingOptimizer, Gradients, Losses, Stats, clip_grad_norm

STATE_FORMAT = "psyche-sparseloco-v1"
MAX_INNER_STEPS = 10_000
MAX_OUTER_LR = 100.0
DEFAULT_INNER = {"betas": [0.9, 0.95], "weight_decay": 0.1, "eps": 1e-8, "clip_grad_norm": 1.0}
"""τemplar's inner AdamW (hparams/hparams.json): betas (0.9, 0.95), weight decay 0.1, gradients clipped to norm 1."""


@dataclass
class SparseLoCoConfig:
    """`[model.LLM.optimizer.SparseLoCo]`; defaults are τemplar's (hparams/hparams.json). The run config's validator
    (src/core/config/run-config.ts) enforces the same bounds (test/config/run-config.test.ts compares them)."""

    inner_steps: int = 30
    error_feedback_decay: float = 0.95
    chunk: int = 64
    topk: int = 64
    value_bits: int = 2
    outer_lr: float = 0.4
    dct: bool = False
    inner: AdamWConfig = field(default_factory=lambda: AdamWConfig.from_dict(DEFAULT_INNER))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SparseLoCoConfig:
        if not isinstance(d, dict):
            raise ValueError(f"expected a table, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        values = dict(d)
        if "inner" in values:
            inner = values["inner"]
            if not isinstance(inner, dict):
                raise ValueError("inner must be a table of AdamW settings")
            try:
                values["inner"] = AdamWConfig.from_dict({**DEFAULT_INNER, **inner})
            except WorkerError as exc:
                raise ValueError(f"inner: {exc}") from None
        cfg = cls(**values)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        def integer(name: str, low: int, high: int) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{name} must be an integer from {low} to {high}, got {value!r}")

        def number(name: str, low: float, high: float, open_low: bool = False) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
            if value < low or value > high or (open_low and value == low):
                raise ValueError(f"{name} must be in {'(' if open_low else '['}{low}, {high}], got {value}")

        integer("inner_steps", 1, MAX_INNER_STEPS)
        number("error_feedback_decay", 0.0, 1.0)
        integer("chunk", 1, codec.MAX_CHUNK)
        integer("topk", 1, self.chunk * self.chunk)
        integer("value_bits", 1, codec.MAX_VALUE_BITS)
        number("outer_lr", 0.0, MAX_OUTER_LR, open_low=True)
        if not isinstance(self.dct, bool):
            raise ValueError(f"dct must be true or false, got {self.dct!r}")


class _Peer:
    """One client's own state: its inner AdamW and its error feedback (a simulated client in single-node training)."""

    def __init__(self, model: torch.nn.Module, params: list[torch.Tensor], config: SparseLoCoConfig, device: torch.device):
        fused = True if device.type == "cuda" else None
        self.adamw = torch.optim.AdamW(
            split_decay_groups(model, config.inner.weight_decay), lr=0.0, betas=config.inner.betas, eps=config.inner.eps, fused=fused
        )
        self.error = [torch.zeros_like(p, dtype=torch.float32, memory_format=torch.contiguous_format) for p in params]
        self.own: bytes | None = None
        """Single-node simulation with delay: this client's result of the previous round."""


class SparseLoCo(CommunicatingOptimizer):
    name = "SparseLoCo"

    def __init__(self, model: torch.nn.Module, config: SparseLoCoConfig, ctx: BuildContext):
        super().__init__(model)
        self.config = config
        self.schedule = ctx.schedule
        self.delayed = ctx.delay_correction
        sharding = ctx.sharding
        if sharding is not None and ctx.simulate_peers != 1:
            raise WorkerError("a sharded client trains as one peer: simulate_peers must be 1", kind="unsupported")
        self.sharding = sharding
        named = sorted(model.named_parameters(), key=lambda kv: kv[0])
        self.names = [n for n, _ in named]
        # the parameters as the model holds them (FSDP's DTensors when sharded) and the blocks this rank works on:
        # its error feedback, inner AdamW moments and outer step are over those blocks alone
        self.sources = [p for _, p in named]
        self.params = [p if sharding is None else sharding.local(p) for p in self.sources]
        self.layouts = [codec.layout_for(n, tuple(p.shape) or (1,), config.chunk, config.topk) for n, p in named]
        self.layout_id = codec.layout_id(self.layouts, config.value_bits, config.dct)
        # Sharded: a split tensor's block on this rank is whole chunk rows (shard_rows), its chunks one run of the
        # tensor's; a tensor that is not split is one block of itself
        self._split = [sharding is not None and sharding.is_split(p) for p in self.sources]
        self.blocks = [t.block(sharding.rank, sharding.world) if split and sharding else (t, 0) for t, split in zip(self.layouts, self._split)]
        self.device = ctx.device
        self.peers = [_Peer(model, self.params, config, ctx.device) for _ in range(ctx.simulate_peers)]
        self._committed: list[torch.Tensor] | None = None
        """The network path: the replicated parameters while the live ones hold a speculation."""
        self._previous: list[torch.Tensor] | None = None
        """Single-node simulation with delay: the parameters before the previous round's results."""

    @classmethod
    def shard_rows(cls, config: dict[str, Any]) -> Callable[[tuple[int, ...]], int]:
        """A shard holds whole chunks: the rows of the first dimension one chunk spans (TensorLayout.block_rows).
        Not with `dct`: a matrix product over a block's chunks need not give the bytes of the same product over the
        whole tensor's (BLAS kernels differ with the batch), so a sharded client's result would differ."""
        try:
            cfg = SparseLoCoConfig.from_dict(config or {})
        except ValueError as exc:
            raise WorkerError(f"optimizer.SparseLoCo: {exc}") from None
        if cfg.dct:
            raise WorkerError("optimizer.SparseLoCo.dct = true is not supported on a sharded client (--shard): set dct = false", kind="unsupported")
        return lambda shape: codec.layout_for("", shape, cfg.chunk, cfg.topk).block_rows() if len(shape) else 1

    @classmethod
    def build(cls, config: dict[str, Any], ctx: BuildContext) -> SparseLoCo:
        try:
            return cls(ctx.model, SparseLoCoConfig.from_dict(config), ctx)
        except ValueError as exc:
            raise WorkerError(f"optimizer.SparseLoCo: {exc}") from None

    def _peer(self, op: str) -> _Peer:
        if len(self.peers) != 1:
            raise WorkerError(f"{op} needs the SparseLoCo optimizer configured with one peer", kind="state")
        return self.peers[0]

    # -- the parts of a round

    def _inner_steps(self, peer: _Peer, batch: Batch, step: int, gradients: Gradients) -> tuple[float, float]:
        """H inner AdamW steps from the live parameters, accumulated into the peer's error feedback; the live
        parameters end where they started, bit for bit. Returns the mean loss and gradient norm of the steps."""
        cfg = self.config
        h = cfg.inner_steps
        start = [p.detach().clone() for p in self.params]
        losses, norms = [], []
        rows = batch.rows
        for i in range(h):
            a, b = i * rows // h, (i + 1) * rows // h
            if a == b:
                continue
            losses.append(torch.as_tensor(gradients(batch.rows_between(a, b)), dtype=torch.float64))
            norms.append(torch.as_tensor(clip_grad_norm(self.model, cfg.inner.clip_grad_norm, self.sharding), dtype=torch.float64))
            lr = self.schedule(step * h + i)
            for group in peer.adamw.param_groups:
                group["lr"] = lr
            peer.adamw.step()
        with torch.no_grad():
            for e, s, p in zip(peer.error, start, self.params):
                e.mul_(cfg.error_feedback_decay).add_(s - p)  # the pseudo-gradient θ_start − θ_H
                p.copy_(s)
            for p in self.sources:
                p.grad = None
        if not losses:
            return math.nan, 0.0
        loss, norm = torch.stack([torch.stack(losses).cpu().mean(), torch.stack(norms).cpu().mean()]).tolist()
        return loss, norm

    @torch.no_grad()
    def _produce(self, peer: _Peer) -> tuple[bytes, list[codec.Compressed]]:
        """The result compressed from the error feedback, which keeps what it did not transmit. Sharded, each rank
        selects its own chunks' top-k, and the ranks' selections are gathered in chunk order, to be quantized and
        encoded whole (the quantizer's statistics are over the whole tensor's selection): every rank holds the
        result, and subtracts what its own chunks transmit."""
        cfg = self.config
        compressed = []
        for e, t, (block, first), split in zip(peer.error, self.layouts, self.blocks, self._split):
            indices, values = codec.select(e.reshape(block.shape), block, cfg.dct)
            if split and self.sharding is not None:
                every = self.sharding.gather_rows(values).reshape(t.n_chunks, -1)
                every_indices = None if indices is None else self.sharding.gather_rows(indices).reshape(t.n_chunks, -1)
            else:
                every, every_indices = values, indices
            codes, levels = codec.quantize(every, cfg.value_bits)
            mine = codec.Compressed(block, indices, codes[first : first + block.n_chunks], levels)
            e.sub_(codec.transmitted(mine, cfg.dct).reshape(e.shape))
            compressed.append(codec.Compressed(t, every_indices, codes, levels))
        return codec.encode(compressed, cfg.value_bits, cfg.dct, self.layout_id), compressed

    def decode(self, result: bytes) -> list[codec.Decoded]:
        cfg = self.config
        return codec.decode(result, self.layouts, cfg.value_bits, cfg.dct, self.layout_id, self.device)

    def _decode_all(self, results: list[bytes]) -> list[list[codec.Decoded]]:
        """Every result decoded, in canonical order (by the SHA-256 of its bytes); the first bad one raises with
        its index in `results`."""
        decoded = []
        for i, result in enumerate(results):
            try:
                decoded.append((hashlib.sha256(result).digest(), self.decode(result)))
            except codec.ResultDecodeError as exc:
                raise WorkerError(f"rejected result: result {i}: {exc}", kind="bad_result", index=i) from None
            except TypeError:
                raise WorkerError(f"rejected result: result {i}: must be bytes, got {type(result).__name__}", kind="bad_result", index=i) from None
        decoded.sort(key=lambda pair: pair[0])
        return [d for _, d in decoded]

    @torch.no_grad()
    def _outer(self, base: list[torch.Tensor], results: list[list[codec.Decoded]], median: list[float] | None = None) -> None:
        """params ← base − α · aggregate(results): the outer step, also the speculation's and verification's update.
        α · direction is rounded before the subtraction (no fused multiply-add: the same bytes on every device)."""
        cfg = self.config
        # sharded: the directions of this rank's blocks only (the clipping norms are the whole results')
        directions = codec.aggregate(results, cfg.value_bits, cfg.dct, median, self.blocks if self.sharding is not None else None)
        for p, b, d in zip(self.params, base, directions):
            if b is not p:
                p.copy_(b)
            p.sub_((d * cfg.outer_lr).reshape(p.shape).to(p.dtype))

    def _own(self, compressed: list[codec.Compressed]) -> list[codec.Decoded]:
        """This client's result as apply decodes it, without decoding (the same tensors, bit for bit)."""
        return [codec.Decoded(c.layout, c.indices, c.codes.long(), c.levels) for c in compressed]

    # -- single node

    def step(self, batch: Batch, step: int, gradients: Gradients) -> Stats:
        """One round without a network (module docstring): the batch split among the simulated clients (rows in
        order), each runs its inner steps and produces its result, and the results are applied."""
        peers = self.peers
        if batch.rows % len(peers):
            raise WorkerError(f"batch of {batch.rows} sequences does not split evenly among {len(peers)} simulated peers")
        per_peer = batch.rows // len(peers)
        current = [p.detach().clone() for p in self.params]
        previous = self._previous
        losses, norms, results = [], [], []
        for i, peer in enumerate(peers):
            with torch.no_grad():
                if self.delayed and previous is not None and peer.own is not None:
                    self._outer(previous, self._decode_all([peer.own]))
                else:
                    for p, c in zip(self.params, current):
                        p.copy_(c)
            loss, norm = self._inner_steps(peer, batch.rows_between(i * per_peer, (i + 1) * per_peer), step, gradients)
            losses.append(loss)
            norms.append(norm)
        with torch.no_grad():
            for p, c in zip(self.params, current):
                p.copy_(c)
        for peer in peers:
            result, _ = self._produce(peer)
            results.append(result)
            peer.own = result
        if self.delayed:
            self._previous = current
        self._outer(self.params, self._decode_all(results))
        return {
            "loss": sum(losses) / len(losses),
            "grad_norm": sum(norms) / len(norms),
            "lr": self.schedule(step * self.config.inner_steps),
            "result_bytes": sum(len(r) for r in results) // len(results),
        }

    # -- rounds

    def begin_round(self, batch: Batch, step: int, gradients: Gradients) -> Stats:
        """The round's H inner steps from the live (speculative) parameters; the pseudo-gradient waits in the error
        feedback for produce."""
        loss, norm = self._inner_steps(self._peer("train_round"), batch, step, gradients)
        return {"loss": loss, "grad_norm": norm}

    @torch.no_grad()
    def save_round(self) -> Any:
        """The inner steps change the error feedback and the inner AdamW's moments: a copy of both (on the device,
        as much memory again as they hold, while a speculative round is pending)."""
        peer = self._peer("begin_round")
        adamw = {p: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()} for p, state in peer.adamw.state.items()}
        return [e.clone() for e in peer.error], adamw

    @torch.no_grad()
    def discard_round(self, saved: Any) -> None:
        peer = self._peer("discard_round")
        error, adamw = saved
        for e, s in zip(peer.error, error):
            e.copy_(s)
        peer.adamw.state.clear()
        for p, state in adamw.items():
            peer.adamw.state[p] = state

    def apply(self, results: list[bytes], step: int) -> None:
        self._peer("apply_results")
        decoded = self._decode_all(results)
        committed, self._committed = self._committed, None
        if not decoded:
            if committed is not None:
                with torch.no_grad():
                    for p, c in zip(self.params, committed):
                        p.copy_(c)
            return
        self._outer(committed if committed is not None else self.params, decoded)

    def produce(self, step: int) -> tuple[bytes, Stats]:
        peer = self._peer("train_round")
        self.restore_replicated()
        result, compressed = self._produce(peer)
        if self.delayed:
            self._committed = [p.detach().clone() for p in self.params]
            self._outer(self.params, [self._own(compressed)])
        return result, {"lr": self.schedule(step * self.config.inner_steps)}

    @torch.no_grad()
    def score(self, results: list[bytes], step: int, losses: Losses) -> Stats:
        """Each result alone on the replicated parameters, as τemplar's validator applies a peer's contribution:
        its values clipped to the median norm (per tensor) of the results given, at the outer LR. Changes nothing."""
        self._peer("score_results")
        current = [p.detach().clone() for p in self.params]
        base = [c.clone() for _, c in self.replicated_parameters()]
        try:
            for p, b in zip(self.params, base):
                p.copy_(b)
            before = losses(None)
            decoded: list[list[codec.Decoded] | None] = []
            for result in results:
                try:
                    decoded.append(self.decode(result))
                except (codec.ResultDecodeError, TypeError):
                    decoded.append(None)
            valid = [d for d in decoded if d is not None]
            median = codec.median_norms(valid, self.config.value_bits) if valid else None
            after: list[list[float] | None] = []
            for j, d in enumerate(decoded):
                if d is None:
                    after.append(None)
                    continue
                self._outer(base, [d], median)
                after.append(losses(j))
        finally:
            for p, c in zip(self.params, current):
                p.copy_(c)
        return {"before": before, "after": after, "lr": self.config.outer_lr}

    # -- replicated parameters

    def replicated_parameters(self) -> list[tuple[str, torch.Tensor]]:
        """Without a pending speculation, sorted by name."""
        source = self._committed if self._committed is not None else [p.detach() for p in self.params]
        return list(zip(self.names, source))

    @contextmanager
    def replicated(self) -> Iterator[None]:
        if self._committed is None:
            yield
            return
        live = [p.detach().clone() for p in self.params]
        try:
            with torch.no_grad():
                for p, c in zip(self.params, self._committed):
                    p.copy_(c)
            yield
        finally:
            with torch.no_grad():
                for p, s in zip(self.params, live):
                    p.copy_(s)

    def restore_replicated(self) -> None:
        if self._committed is not None:
            with torch.no_grad():
                for p, c in zip(self.params, self._committed):
                    p.copy_(c)
            self._committed = None

    def result_format(self) -> dict[str, Any]:
        cfg = self.config
        return {
            "format": "sparseloco",
            "value_bits": cfg.value_bits,
            "dct": cfg.dct,
            "layout_id": self.layout_id.hex(),
            "tensors": [t.spec() for t in self.layouts],
        }

    # -- checkpointing

    def state_dict(self) -> dict[str, Any]:
        """Each client's inner AdamW state, error feedback and (simulation) last result; a pending speculation's
        committed parameters; the simulation's previous parameters."""

        def table(tensors: list[torch.Tensor] | None) -> dict[str, torch.Tensor] | None:
            return None if tensors is None else {n: t.detach().clone() for n, t in zip(self.names, tensors)}

        return {
            "format": STATE_FORMAT,
            "peers": [{"adamw": peer.adamw.state_dict(), "error": table(peer.error), "own": peer.own} for peer in self.peers],
            "committed": table(self._committed),
            "previous": table(self._previous),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"SparseLoCo state: missing or unknown 'format' (expected {STATE_FORMAT})")
        peers = state.get("peers")
        if not isinstance(peers, list) or len(peers) != len(self.peers):
            raise ValueError(f"SparseLoCo state: expected {len(self.peers)} peers' states, got {len(peers) if isinstance(peers, list) else peers!r}")

        def tensors(label: str, t: Any, optional: bool = False) -> list[torch.Tensor] | None:
            if t is None and optional:
                return None
            if not isinstance(t, dict) or set(t) != set(self.names):
                raise ValueError(f"SparseLoCo state: {label} does not match the model's parameters")
            out = []
            for name, p in zip(self.names, self.params):
                v = t[name]
                if not isinstance(v, torch.Tensor) or tuple(v.shape) != tuple(p.shape):
                    raise ValueError(f"SparseLoCo state: {label} tensor {name!r} missing or has the wrong shape (expected {list(p.shape)})")
                out.append(v.to(device=p.device, dtype=torch.float32 if label == "error" else p.dtype).clone())
            return out

        errors = [tensors("error", s.get("error") if isinstance(s, dict) else None) for s in peers]
        committed = tensors("committed", state.get("committed"), optional=True)
        previous = tensors("previous", state.get("previous"), optional=True)
        for peer, s, error in zip(self.peers, peers, errors):
            peer.adamw.load_state_dict(s["adamw"])
            peer.error = error  # type: ignore[assignment]
            own = s.get("own")
            peer.own = bytes(own) if isinstance(own, (bytes, bytearray)) else None
        self._committed, self._previous = committed, previous
