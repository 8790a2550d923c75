"""DisTrO (`[model.LLM.optimizer.Distro]`) behind the optimizer interface; the math is ../distro.py's DistroOptimizer.

A round is one forward/backward (begin_round); apply restores the committed parameters and applies the previous
round's results; produce compresses the momentum into this round's result and, with delay correction, speculates
with it (the live parameters then differ from the replicated ones until the next apply).

Single-node training may split each step's batch among simulated peers, each with its own momentum over the same
parameters; the network path needs exactly one (this client's)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ..chunked import chunk_for
from ..distro import DistroConfig, DistroOptimizer, ResultDecodeError
from ..distro_codec import VALUE_FORMAT_NAMES
from ..protocol import WorkerError
from .base import Batch, BuildContext, CommunicatingOptimizer, Gradients, Losses, Stats, clip_grad_norm, read

STATE_FORMAT = "psyche-distro-peers-v1"


class Distro(CommunicatingOptimizer):
    name = "Distro"

    def __init__(self, model: torch.nn.Module, config: DistroConfig, ctx: BuildContext):
        super().__init__(model)
        self.schedule = ctx.schedule
        named = sorted(model.named_parameters(), key=lambda kv: kv[0])
        # one optimizer state (momentum residual) per simulated peer, all over the same parameters; peers[0] applies
        if ctx.sharding is not None and ctx.simulate_peers != 1:
            raise WorkerError("a sharded client trains as one peer: simulate_peers must be 1", kind="unsupported")
        self.sharding = ctx.sharding
        self.peers = [DistroOptimizer(named, config, delay_correction=ctx.delay_correction, sharding=ctx.sharding) for _ in range(ctx.simulate_peers)]

    @classmethod
    def shard_rows(cls, config: dict[str, Any]) -> Callable[[tuple[int, ...]], int]:
        """A shard holds whole DCT chunks: the first dimension's chunk (1 for the leading dimensions of N-D tensors)."""
        try:
            chunk = DistroConfig.from_dict(config or {}).compression_chunk
        except ValueError as exc:
            raise WorkerError(f"optimizer.Distro: {exc}") from None
        return lambda shape: chunk_for(shape, chunk)[0] if len(shape) else 1

    @classmethod
    def build(cls, config: dict[str, Any], ctx: BuildContext) -> Distro:
        try:
            return cls(ctx.model, DistroConfig.from_dict(config), ctx)
        except ValueError as exc:
            raise WorkerError(f"optimizer.Distro: {exc}") from None

    def _peer(self, op: str) -> DistroOptimizer:
        """The network path's ops need exactly one (this client's) peer."""
        if len(self.peers) != 1:
            raise WorkerError(f"{op} needs the Distro optimizer configured with one peer", kind="state")
        return self.peers[0]

    # -- single node

    def step(self, batch: Batch, step: int, gradients: Gradients) -> Stats:
        """One step without network delay: the batch is split among the simulated peers (rows in order), each
        computes its gradient at the same parameters and produces its compressed result, then every result is
        applied. With one peer this is single-node DisTrO."""
        peers = self.peers
        rows = batch.rows
        if rows % len(peers):
            raise WorkerError(f"batch of {rows} sequences does not split evenly among {len(peers)} simulated peers")
        lr = self.schedule(step)
        per_peer = rows // len(peers)
        results, measured = [], []
        for i, peer in enumerate(peers):
            measured.append(gradients(batch.rows_between(i * per_peer, (i + 1) * per_peer)))
            measured.append(clip_grad_norm(self.model, None))  # DisTrO clips inside produce(): this only measures
            results.append(peer.produce(lr))
        peers[0].apply(results, lr)  # the parameters are shared: apply once
        values = read(*measured)  # the step's one read of them
        losses, norms = values[0::2], values[1::2]
        return {
            "loss": sum(losses) / len(losses),
            "grad_norm": sum(norms) / len(norms),
            "lr": lr,
            "result_bytes": sum(len(r) for r in results) // len(results),
        }

    # -- rounds

    def begin_round(self, batch: Batch, step: int, gradients: Gradients) -> Stats:
        """The forward/backward at the live (speculative) parameters; the gradients wait in .grad for produce."""
        self._peer("train_round")
        loss = gradients(batch)
        norm = clip_grad_norm(self.model, None) if self.sharding is None else self.peers[0].grad_norm()
        loss, grad_norm = read(loss, norm)  # the round's reply needs them now
        return {"loss": loss, "grad_norm": grad_norm}

    def apply(self, results: list[bytes], step: int) -> None:
        peer = self._peer("apply_results")
        try:
            peer.apply(results, self.schedule(step))
        except ResultDecodeError as exc:
            if exc.index is None:  # about the list, not one result (too many)
                raise WorkerError(f"apply_results: {exc}") from None
            raise WorkerError(f"rejected result: {exc}", kind="bad_result", index=exc.index) from None

    def produce(self, step: int) -> tuple[bytes, Stats]:
        lr = self.schedule(step)
        return self._peer("train_round").produce(lr), {"lr": lr}

    @torch.no_grad()
    def score(self, results: list[bytes], step: int, losses: Losses) -> Stats:
        """Each result alone at step `step`'s LR, as apply would for one peer. Changes nothing: the parameters, any
        speculation, the momentum and the lookahead scales are as before."""
        peer = self._peer("score_results")
        lr = self.schedule(step)
        current = [p.detach().clone() for p in peer.params]
        base = [c.detach().clone() for _, c in peer.committed_parameters()]
        try:
            for p, b in zip(peer.params, base):
                p.data.copy_(b)
            before = losses(None)
            after: list[list[float] | None] = []
            for j, result in enumerate(results):
                try:
                    decoded = peer.decode(result)
                except ResultDecodeError:
                    after.append(None)
                    continue
                peer.update_from(base, [decoded], lr)
                after.append(losses(j))
        finally:
            for p, c in zip(peer.params, current):
                p.data.copy_(c)
        return {"before": before, "after": after, "lr": lr}

    # -- replicated parameters

    def replicated_parameters(self) -> list[tuple[str, torch.Tensor]]:
        """Without a pending speculation."""
        return sorted(self.peers[0].committed_parameters(), key=lambda kv: kv[0])

    @contextmanager
    def replicated(self) -> Iterator[None]:
        peer = self.peers[0]
        if not peer.speculating:
            yield
            return
        speculative = [p.detach().clone() for p in peer.params]
        try:
            for p, (_, c) in zip(peer.params, peer.committed_parameters()):
                p.data.copy_(c)
            yield
        finally:
            for p, s in zip(peer.params, speculative):
                p.data.copy_(s)

    def restore_replicated(self) -> None:
        self.peers[0].discard_speculation()

    def result_format(self) -> dict[str, Any]:
        peer = self.peers[0]
        return {
            "value_format": VALUE_FORMAT_NAMES[peer.value_format],
            "tensors": [{"name": s.name, "shape": list(s.shape), "chunk": list(s.chunk), "topk": s.topk} for s in peer.specs],
        }

    # -- checkpointing

    def state_dict(self) -> dict[str, Any]:
        """Every simulated peer's DisTrO state (momentum, lookahead scales, a pending speculation's committed values)."""
        return {"format": STATE_FORMAT, "peers": [peer.state_dict() for peer in self.peers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"Distro state: missing or unknown 'format' (expected {STATE_FORMAT})")
        peers = state.get("peers")
        if not isinstance(peers, list) or len(peers) != len(self.peers):
            raise ValueError(f"Distro state: expected {len(self.peers)} peers' states, got {len(peers) if isinstance(peers, list) else peers!r}")
        for peer, peer_state in zip(self.peers, peers):
            peer.load_state_dict(peer_state)
