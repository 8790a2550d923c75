"""One model on one device: train steps (micro-batches, gradient accumulation, clipping, AdamW,
LR schedule) and evaluation. Knows nothing of the network or the wire format."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .distro import DistroConfig, DistroOptimizer, ResultDecodeError
from .loss_mask import check_mask, counted, lm_loss
from .protocol import WorkerError
from .schedule import Constant, schedule_from_config

if TYPE_CHECKING:
    from .parallel import Group


@dataclass
class AdamWConfig:
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    eps: float = 1e-8
    clip_grad_norm: float | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "AdamWConfig":
        unknown = set(d) - {"betas", "weight_decay", "eps", "clip_grad_norm"}
        if unknown:
            raise WorkerError(f"optimizer.AdamW: unknown field(s) {sorted(unknown)}")
        betas = tuple(d.get("betas", (0.9, 0.95)))
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise WorkerError(f"optimizer.AdamW.betas = {list(betas)}: expected two numbers in [0, 1)")
        clip = d.get("clip_grad_norm")
        return cls(
            betas=(float(betas[0]), float(betas[1])),
            weight_decay=float(d.get("weight_decay", 0.0)),
            eps=float(d.get("eps", 1e-8)),
            clip_grad_norm=None if clip is None else float(clip),
        )


def split_decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on matrices only; norms and biases are not decayed (the usual practice for LLMs)."""
    decay, no_decay = [], []
    for _, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _check_finite(loss: float, step: int) -> None:
    """A non-finite loss ends training with the one "diverged" error the client reports."""
    if not math.isfinite(loss):
        raise WorkerError(f"loss is {loss} at step {step}: training diverged (lower the learning rate)", kind="diverged")


class Trainer:
    def __init__(self, model: torch.nn.Module, device: torch.device, group: Group | None = None, precision: str = "fp32"):
        if precision not in ("fp32", "bf16"):
            raise WorkerError(f"precision {precision!r}: expected fp32 or bf16", kind="device")
        self.model = model.to(device)
        self.device = device
        # bf16: forward passes under torch.autocast (matmuls in bfloat16); parameters, gradients and the
        # optimizer stay fp32, so hashes, DisTrO results and applies are exactly as in fp32 given the gradients
        self.precision = precision
        # data parallelism inside this client (parallel.py): this rank's share of each batch, gradients summed
        self.group = group if group is not None and group.world > 1 else None
        self.vocab_size = int(model.config.vocab_size)
        self.max_positions = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self.schedule = Constant(base_lr=1e-3)
        self.optimizer_name: str | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.clip_grad_norm: float | None = None
        self.micro_batch = 8
        # DisTrO: one optimizer state (momentum residual) per simulated peer, all over the same parameters
        self.distro_peers: list[DistroOptimizer] = []

    # -- configuration ---------------------------------------------------------------------------
    def configure(
        self, optimizer: dict[str, Any], lr_schedule: dict[str, Any] | None, micro_batch: int, simulate_peers: int = 1, delay_correction: bool = False
    ) -> None:
        """`simulate_peers` > 1 (DisTrO only): each train step splits its batch among that many simulated
        clients, each with its own momentum, and applies all of their results. `delay_correction`: the
        network path, where results of step t are applied during step t+1 (produce/apply ops)."""
        if not isinstance(optimizer, dict) or len(optimizer) != 1:
            raise WorkerError("optimizer must name exactly one of AdamW, Distro")
        ((name, params),) = optimizer.items()
        if not isinstance(simulate_peers, int) or simulate_peers < 1:
            raise WorkerError(f"simulate_peers = {simulate_peers!r}: must be a positive integer")
        if simulate_peers > 1 and name != "Distro":
            raise WorkerError("simulate_peers needs the Distro optimizer")
        self.distro_peers = []
        self.optimizer = None
        if name == "Distro":
            try:
                cfg = DistroConfig.from_dict(params or {})
            except ValueError as exc:
                raise WorkerError(f"optimizer.Distro: {exc}") from None
            named = sorted(self.model.named_parameters(), key=lambda kv: kv[0])
            try:
                self.distro_peers = [DistroOptimizer(named, cfg, delay_correction=delay_correction) for _ in range(simulate_peers)]
            except ValueError as exc:
                raise WorkerError(f"optimizer.Distro: {exc}") from None
            self.clip_grad_norm = None  # DisTrO clips inside produce()
        elif name == "AdamW":
            cfg = AdamWConfig.from_dict(params or {})
            # fused kernels on CUDA; on CPU torch's default (single-tensor) path, as a plain loop would use
            fused = True if self.device.type == "cuda" else None
            self.optimizer = torch.optim.AdamW(split_decay_groups(self.model, cfg.weight_decay), lr=0.0, betas=cfg.betas, eps=cfg.eps, fused=fused)
            self.clip_grad_norm = cfg.clip_grad_norm
        else:
            raise WorkerError(f"optimizer {name!r} is not supported; expected AdamW or Distro", kind="unsupported")
        self.optimizer_name = name
        if lr_schedule is not None:
            self.schedule = schedule_from_config(lr_schedule)
        if micro_batch < 1:
            raise WorkerError(f"micro_batch = {micro_batch}: must be ≥ 1")
        self.micro_batch = micro_batch

    # -- data ------------------------------------------------------------------------------------
    def to_device_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.ndim != 2 or tokens.shape[1] < 2:
            raise WorkerError(f"tokens must have shape [batch, seq_len + 1], got {list(tokens.shape)}")
        if tokens.shape[1] - 1 > self.max_positions:
            raise WorkerError(f"sequence length {tokens.shape[1] - 1} exceeds the model's max_position_embeddings {self.max_positions}")
        tokens = tokens.to(torch.int64)
        top = int(tokens.max()) if tokens.numel() else 0
        if top >= self.vocab_size or int(tokens.min()) < 0:
            raise WorkerError(f"token id {top} is outside the model's vocabulary (vocab_size {self.vocab_size})", kind="data")
        if self.device.type == "cuda":
            return tokens.pin_memory().to(self.device, non_blocking=True)
        return tokens

    def _loss(self, batch: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16"):
            logits = self.model(input_ids=batch[:, :-1]).logits
        return lm_loss(logits, batch[:, 1:], mask)

    # -- steps -----------------------------------------------------------------------------------
    def forward_backward(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> float:
        """Accumulates gradients over micro-batches into .grad (zeroed first); returns the mean loss.
        With data parallelism each rank takes its shard of the rows; the sum over ranks of the weighted
        gradients is the whole batch's mean gradient, identical on every rank after the all-reduce.
        With a loss `mask` (loss_mask.py) the mean is over the counted targets of the whole batch."""
        batch = self.to_device_tokens(tokens)
        mask = check_mask(mask, batch, self.device)
        self.model.train()
        for p in self.model.parameters():
            p.grad = None
        rows = batch.shape[0]
        first, last = self.group.shard(rows) if self.group else (0, rows)
        total = torch.zeros((), device=self.device)
        denominator = rows if mask is None else max(counted(mask), 1)
        for start in range(first, last, self.micro_batch):
            end = min(start + self.micro_batch, last)
            micro, micro_mask = batch[start:end], None if mask is None else mask[start:end]
            n = micro.shape[0] if micro_mask is None else counted(micro_mask)
            loss = self._loss(micro, micro_mask)
            (loss * (n / denominator)).backward()
            total += loss.detach() * n
        if self.group:
            params = [p for _, p in sorted(self.model.named_parameters(), key=lambda kv: kv[0]) if p.requires_grad]
            for p in params:
                if p.grad is None:  # an empty shard (fewer rows than ranks) still joins the sum
                    p.grad = torch.zeros_like(p)
            self.group.all_reduce_sum([*(p.grad for p in params), total.reshape(1)])
        return float(total) / denominator

    def clip(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.clip_grad_norm if self.clip_grad_norm is not None else math.inf
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))

    def train_step(self, tokens: torch.Tensor, step: int, mask: torch.Tensor | None = None) -> dict[str, Any]:
        if self.distro_peers:
            return self.distro_step(tokens, step, mask)
        if self.optimizer is None:
            raise WorkerError("train_step before configure: send the optimizer first", kind="state")
        lr = self.schedule(step)
        loss = self.forward_backward(tokens, mask)
        grad_norm = self.clip()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        _check_finite(loss, step)
        return {"loss": loss, "grad_norm": grad_norm, "lr": lr, "tokens": int(tokens.shape[0] * (tokens.shape[1] - 1))}

    def distro_step(self, tokens: torch.Tensor, step: int, mask: torch.Tensor | None = None) -> dict[str, Any]:
        """One DisTrO step without network delay: the batch is split among the simulated peers (rows in
        order), each computes its gradient at the same parameters and produces its compressed result,
        then every result is applied. With one peer this is single-node DisTrO."""
        peers = self.distro_peers
        rows = tokens.shape[0] if tokens.ndim == 2 else 0
        if rows % len(peers):
            raise WorkerError(f"batch of {rows} sequences does not split evenly among {len(peers)} simulated peers")
        lr = self.schedule(step)
        per_peer = rows // len(peers)
        results, losses, norms = [], [], []
        for i, peer in enumerate(peers):
            rows_i = slice(i * per_peer, (i + 1) * per_peer)
            losses.append(self.forward_backward(tokens[rows_i], None if mask is None else mask[rows_i]))
            norms.append(self.clip())  # clip_grad_norm is None here: this only measures the norm
            results.append(peer.produce(lr))
        peers[0].apply(results, lr)  # the parameters are shared: apply once
        loss = sum(losses) / len(losses)
        _check_finite(loss, step)
        return {
            "loss": loss,
            "grad_norm": sum(norms) / len(norms),
            "lr": lr,
            "tokens": int(rows * (tokens.shape[1] - 1)),
            "result_bytes": sum(len(r) for r in results) // len(results),
        }

    def _one_distro_peer(self, op: str) -> None:
        """The network path's ops need DisTrO configured with exactly one (this client's) peer."""
        if len(self.distro_peers) != 1:
            raise WorkerError(f"{op} needs the Distro optimizer configured with one peer", kind="state")

    def apply_results(self, results: list[bytes], step: int) -> None:
        self._one_distro_peer("apply_results")
        try:
            self.distro_peers[0].apply(results, self.schedule(step))
        except ResultDecodeError as exc:
            raise WorkerError(f"rejected result: {exc}", kind="bad_result") from None

    def train_round(self, tokens: torch.Tensor, step: int, apply_step: int | None, results: list[bytes]) -> tuple[dict[str, Any], bytes]:
        """Network path, DisTrO's intended order for one round: forward/backward on this round's tokens
        (at the speculative parameters), then apply the previous round's accepted results (`apply_step`'s
        LR; restores the committed parameters first), then produce this round's result (which speculates
        again). `apply_step` None: nothing to apply (the first round of an epoch). The same as begin_round
        then finish_round, which let the client download the previous round's results meanwhile."""
        self.begin_round(tokens, step)
        return self.finish_round(step, apply_step, results)

    def begin_round(self, tokens: torch.Tensor, step: int, mask: torch.Tensor | None = None) -> dict[str, Any]:
        """The first half of train_round: forward/backward (and the gradient norm) for `step`. The gradients
        wait in .grad for finish_round; nothing else changes, so the previous round's results may still be
        on their way."""
        self._one_distro_peer("train_round")
        loss = self.forward_backward(tokens, mask)
        norm = self.clip()
        self.pending_round = {"step": step, "loss": loss, "grad_norm": norm, "tokens": int(tokens.shape[0] * (tokens.shape[1] - 1))}
        return {"loss": loss, "grad_norm": norm}

    def finish_round(self, step: int, apply_step: int | None, results: list[bytes]) -> tuple[dict[str, Any], bytes]:
        """The second half: apply the previous round's accepted results, then produce `step`'s result."""
        pending = getattr(self, "pending_round", None)
        if pending is None or pending["step"] != step:
            raise WorkerError(f"finish_round for step {step} without its begin_round", kind="state")
        self.pending_round = None
        lr = self.schedule(step)
        if apply_step is not None:
            self.apply_results(results, apply_step)
        result = self.distro_peers[0].produce(lr)
        loss = pending["loss"]
        _check_finite(loss, step)
        return {"loss": loss, "grad_norm": pending["grad_norm"], "lr": lr, "tokens": pending["tokens"], "result_bytes": len(result)}, result

    @torch.no_grad()
    def score_results(
        self, results: list[bytes], step: int, batches: list[torch.Tensor], own_batches: bool = False, masks: list[torch.Tensor | None] | None = None
    ) -> dict[str, Any]:
        """Verification (src/core/verify/): the loss on each batch at the committed parameters, and after applying
        each result alone at step `step`'s LR (as apply would, for one peer). Changes nothing: the parameters,
        any speculation, the momentum and the lookahead scales are as before. A result that does not decode
        scores None.

        With `own_batches`, batch j is result j's producer's assigned batch and the last batch is the shared
        comparison batch (len(batches) == len(results) + 1): after[j] is then [loss on batch j, loss on the last
        batch] only, so scoring k results costs 2k + k + 1 evaluations instead of k (k + 1) + k + 1."""
        if own_batches and len(batches) != len(results) + 1:
            raise ValueError(f"score_results: own_batches needs {len(results) + 1} batches, got {len(batches)}")
        self._one_distro_peer("score_results")
        peer = self.distro_peers[0]
        lr = self.schedule(step)
        masks = masks if masks is not None else [None] * len(batches)
        current = [p.detach().clone() for p in peer.params]
        base = [c.detach().clone() for _, c in peer.committed_parameters()]
        try:
            for p, b in zip(peer.params, base):
                p.data.copy_(b)
            before = [self.evaluate(t, m)["loss"] for t, m in zip(batches, masks)]
            after: list[list[float] | None] = []
            for result in results:
                try:
                    decoded = peer.decode(result)
                except ResultDecodeError:
                    after.append(None)
                    continue
                peer._update(base, [decoded], lr)
                wanted = [len(after), len(batches) - 1] if own_batches else range(len(batches))
                after.append([self.evaluate(batches[j], masks[j])["loss"] for j in wanted])
        finally:
            for p, c in zip(peer.params, current):
                p.data.copy_(c)
        return {"before": before, "after": after, "lr": lr}

    def replicated_parameters(self) -> list[tuple[str, torch.Tensor]]:
        """Parameters as every replica holds them (without a pending DisTrO speculation), sorted by name."""
        if self.distro_peers:
            return sorted(self.distro_peers[0].committed_parameters(), key=lambda kv: kv[0])
        return [(n, p.detach()) for n, p in sorted(self.model.named_parameters(), key=lambda kv: kv[0])]

    @torch.no_grad()
    def evaluate_replicated(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> dict[str, Any]:
        """The loss on `tokens` at the replicated parameters (every replica holds the same: a pending DisTrO
        speculation is set aside for the evaluation and put back bit-exactly), so every client that evaluates the
        same held-out batches after the same step gets the same validation loss. Changes nothing."""
        peer = self.distro_peers[0] if self.distro_peers else None
        if peer is None or peer._committed is None:
            return self.evaluate(tokens, mask)
        speculative = [p.detach().clone() for p in peer.params]
        try:
            for p, c in zip(peer.params, peer._committed):
                p.data.copy_(c)
            return self.evaluate(tokens, mask)
        finally:
            for p, c in zip(peer.params, speculative):
                p.data.copy_(c)

    @torch.no_grad()
    def evaluate(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> dict[str, Any]:
        batch = self.to_device_tokens(tokens)
        mask = check_mask(mask, batch, self.device)
        self.model.eval()
        total, rows = 0.0, batch.shape[0]
        for start in range(0, rows, self.micro_batch):
            micro, micro_mask = batch[start : start + self.micro_batch], None if mask is None else mask[start : start + self.micro_batch]
            total += float(self._loss(micro, micro_mask)) * (micro.shape[0] if micro_mask is None else counted(micro_mask))
        return {"loss": total / (rows if mask is None else max(counted(mask), 1)), "tokens": int(rows * (batch.shape[1] - 1))}
