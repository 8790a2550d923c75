"""One model on one device: the forward/backward (micro-batches, gradient accumulation, data parallelism), the LR
schedule and evaluation, with the optimizer (optim/) behind one interface. Knows nothing of the network or the wire
format, and nothing of which optimizer runs."""

from __future__ import annotations

import math
from contextlib import nullcontext
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .loss_mask import check_mask, counted, lm_loss
from .optim import BuildContext, CommunicatingOptimizer, Optimizer, build_optimizer, shard_rows
from .optim.base import Batch, Stats, sorted_parameters
from .protocol import WorkerError
from .schedule import Constant, schedule_from_config

if TYPE_CHECKING:
    from .parallel import Group
    from .sharding import Sharding


def _check_finite(loss: float, step: int) -> None:
    """A non-finite loss ends training with the one "diverged" error the client reports."""
    if not math.isfinite(loss):
        raise WorkerError(f"loss is {loss} at step {step}: training diverged (lower the learning rate)", kind="diverged")


def _token_count(tokens: torch.Tensor) -> int:
    return int(tokens.shape[0] * (tokens.shape[1] - 1))


@dataclass(frozen=True)
class _PendingRound:
    """begin_round's outcome, waiting for finish_round."""

    step: int
    stats: Stats
    tokens: int
    speculative: bool = False
    saved: Any = None
    """A speculative round's: what discard_round restores (Optimizer.save_round)."""


class Trainer:
    def __init__(self, model: torch.nn.Module, device: torch.device, group: Group | None = None, precision: str = "fp32", sharding: Sharding | None = None):
        if precision not in ("fp32", "bf16"):
            raise WorkerError(f"precision {precision!r}: expected fp32 or bf16", kind="device")
        # sharded (sharding.py): the model stays whole on the host until configure shards it onto the device with the
        # chunk boundaries its optimizer needs
        self.sharding = sharding if sharding is not None and sharding.world > 1 else None
        self.model = model if self.sharding is not None else model.to(device)
        self.device = device
        # bf16: forward passes under torch.autocast (matmuls in bfloat16); parameters, gradients and the
        # optimizer stay fp32, so hashes, DisTrO results and applies are exactly as in fp32 given the gradients
        self.precision = precision
        # data parallelism inside this client (parallel.py): this rank's share of each batch, gradients summed
        self.group = group if group is not None and group.world > 1 else None
        if self.sharding is not None:
            self.group = None  # FSDP sums the gradients (sharding.py)
        self.vocab_size = int(model.config.vocab_size)
        self.max_positions = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self.schedule = Constant(base_lr=1e-3)
        self.optimizer: Optimizer | None = None
        self.micro_batch = 8
        self.pending: _PendingRound | None = None

    # -- configuration ---------------------------------------------------------------------------
    def configure(
        self, optimizer: dict[str, Any], lr_schedule: dict[str, Any] | None, micro_batch: int, simulate_peers: int = 1, delay_correction: bool = False
    ) -> None:
        """`optimizer`: the run config's externally tagged table, e.g. {"Distro": {...}} (optim/ builds it).
        `simulate_peers` > 1: each train step splits its batch among that many simulated clients (an optimizer that
        exchanges results). `delay_correction`: the network path, where results of step t are applied during step
        t+1 (begin_round / finish_round)."""
        if not isinstance(simulate_peers, int) or simulate_peers < 1:
            raise WorkerError(f"simulate_peers = {simulate_peers!r}: must be a positive integer")
        if micro_batch < 1:
            raise WorkerError(f"micro_batch = {micro_batch}: must be ≥ 1")
        self.optimizer = None
        self.pending = None
        schedule = self.schedule if lr_schedule is None else schedule_from_config(lr_schedule)
        if self.sharding is not None:
            self.sharding.shard(self.model, self.device, shard_rows(optimizer))
        ctx = BuildContext(self.model, self.device, schedule, simulate_peers=simulate_peers, delay_correction=delay_correction, sharding=self.sharding)
        self.optimizer = build_optimizer(optimizer, ctx)
        self.schedule = schedule
        self.micro_batch = micro_batch

    def _optimizer(self, op: str) -> Optimizer:
        if self.optimizer is None:
            raise WorkerError(f"{op} before configure: send the optimizer first", kind="state")
        return self.optimizer

    def _communicating(self, op: str) -> CommunicatingOptimizer:
        """The optimizer, for an op of the network path: one whose rounds exchange results."""
        optimizer = self._optimizer(op)
        if not isinstance(optimizer, CommunicatingOptimizer):
            raise WorkerError(f"{op} needs an optimizer that exchanges results; {optimizer.name} trains alone (train_step)", kind="state")
        return optimizer

    @property
    def optimizer_name(self) -> str | None:
        return None if self.optimizer is None else self.optimizer.name

    def result_format(self) -> dict[str, Any] | None:
        """What a peer's result must look like (None: the optimizer exchanges none)."""
        return self._optimizer("result_format").result_format()

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
    def forward_backward(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Accumulates gradients over micro-batches into .grad (zeroed first); returns the mean loss as a 0-d tensor
        on the device (float64), not read: a read is a sync, and a sync in the middle of a step leaves the device
        idle while the host queues what follows (the optimizer reads it with the step's other numbers).
        With data parallelism each rank takes its shard of the rows; the sum over ranks of the weighted
        gradients is the whole batch's mean gradient, identical on every rank after the all-reduce.
        With a loss `mask` (loss_mask.py) the mean is over the counted targets of the whole batch."""
        batch = self.to_device_tokens(tokens)
        checked = check_mask(mask, batch, self.device)
        # the targets each row counts, from the mask as it came (on the host): no sync per micro-batch
        row_targets = None if mask is None else mask.sum(dim=1, dtype=torch.int64).tolist()
        mask = checked
        self.model.train()
        for p in self.model.parameters():
            p.grad = None
        rows = batch.shape[0]
        if self.sharding is not None:
            return self._sharded_forward_backward(batch, mask, row_targets)
        first, last = self.group.shard(rows) if self.group else (0, rows)
        total = torch.zeros((), device=self.device)
        denominator = rows if row_targets is None else max(sum(row_targets), 1)
        for start in range(first, last, self.micro_batch):
            end = min(start + self.micro_batch, last)
            micro, micro_mask = batch[start:end], None if mask is None else mask[start:end]
            n = micro.shape[0] if row_targets is None else sum(row_targets[start:end])
            loss = self._loss(micro, micro_mask)
            (loss * (n / denominator)).backward()
            total += loss.detach() * n
        if self.group:
            params = [p for _, p in sorted(self.model.named_parameters(), key=lambda kv: kv[0]) if p.requires_grad]
            for p in params:
                if p.grad is None:  # an empty shard (fewer rows than ranks) still joins the sum
                    p.grad = torch.zeros_like(p)
            self.group.all_reduce_sum([*(p.grad for p in params), total.reshape(1)])
        return total.to(torch.float64) / denominator

    def _sharded_forward_backward(self, batch: torch.Tensor, mask: torch.Tensor | None, row_targets: list[int] | None) -> torch.Tensor:
        """forward_backward on a sharded model: this rank's rows, as with data parallelism, gradients kept whole on
        the rank until its last micro-batch, then summed into the shards by FSDP (a whole parameter's by an
        all-reduce). Every rank runs the same number of passes (each one all-gathers the shards): a rank with fewer
        rows runs a pass that counts for nothing."""
        sharding = self.sharding
        assert sharding is not None
        rows = batch.shape[0]
        base, extra = divmod(rows, sharding.world)
        first = sharding.rank * base + min(sharding.rank, extra)
        last = first + base + (1 if sharding.rank < extra else 0)
        passes = max(1, -(-(base + (1 if extra else 0)) // self.micro_batch))
        denominator = rows if row_targets is None else max(sum(row_targets), 1)
        total = torch.zeros((), device=self.device)
        for i in range(passes):
            start, end = first + i * self.micro_batch, min(first + (i + 1) * self.micro_batch, last)
            self.model.set_requires_gradient_sync(i == passes - 1)
            if start >= end:  # nothing left on this rank: one row, weighted 0
                loss = self._loss(batch[:1], None if mask is None else mask[:1])
                (loss * 0.0).backward()
                continue
            micro, micro_mask = batch[start:end], None if mask is None else mask[start:end]
            n = micro.shape[0] if row_targets is None else sum(row_targets[start:end])
            loss = self._loss(micro, micro_mask)
            (loss * (n / denominator)).backward()
            total += loss.detach() * n
        whole = [p for _, p in sorted(self.model.named_parameters(), key=lambda kv: kv[0]) if p.requires_grad and not sharding.is_split(p)]
        for p in whole:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([*(p.grad.reshape(-1) for p in whole), total.reshape(1)])
        sharding.all_reduce_sum_(flat)
        offset = 0
        for p in whole:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        return flat[-1].to(torch.float64) / denominator

    def gradients(self, batch: Batch) -> torch.Tensor:
        """forward_backward as the optimizers call it (optim.base.Gradients), as often as their step needs."""
        return self.forward_backward(batch.tokens, batch.mask)

    def train_step(self, tokens: torch.Tensor, step: int, mask: torch.Tensor | None = None) -> dict[str, Any]:
        """One training step without a network (single-node training), by whichever optimizer is configured."""
        stats = self._optimizer("train_step").step(Batch(tokens, mask), step, self.gradients)
        _check_finite(stats["loss"], step)
        return {**stats, "tokens": _token_count(tokens)}

    def apply_results(self, results: list[bytes], step: int) -> None:
        """Applies the results accepted in round `step` (a bad one: WorkerError kind bad_result with its index)."""
        self._communicating("apply_results").apply(results, step)

    def train_round(self, tokens: torch.Tensor, step: int, apply_step: int | None, results: list[bytes]) -> tuple[dict[str, Any], bytes]:
        """Network path, one round: the round's local compute on this round's tokens, then apply the previous
        round's accepted results (`apply_step`: their round; None: nothing to apply, the first round of an epoch),
        then produce this round's result. The same as begin_round then finish_round, which let the client download
        the previous round's results meanwhile."""
        self.begin_round(tokens, step)
        return self.finish_round(step, apply_step, results)

    def begin_round(self, tokens: torch.Tensor, step: int, mask: torch.Tensor | None = None, speculative: bool = False) -> dict[str, Any]:
        """The first half of train_round: the optimizer's local compute for `step` (DisTrO: the forward/backward).
        The replicated parameters do not change, so the previous round's results may still be on their way.
        `speculative`: on batches the client predicted before the round began; discard_round undoes it if the round
        gives it others. Either way the work is the same bytes: only the undo record is kept besides."""
        optimizer = self._communicating("train_round")
        if self.pending is not None and self.pending.speculative:
            self.discard_round(self.pending.step)  # a speculation nobody finished never stays in the state
        self.pending = None
        saved = optimizer.save_round() if speculative else None
        stats = optimizer.begin_round(Batch(tokens, mask), step, self.gradients)
        self.pending = _PendingRound(step, stats, _token_count(tokens), speculative, saved)
        return stats

    def discard_round(self, step: int) -> None:
        """Drops begin_round's work for `step`, which must have been speculative: the optimizer's state is restored
        to what it was before it (Optimizer.discard_round)."""
        pending = self.pending
        if pending is None or pending.step != step or not pending.speculative:
            raise WorkerError(f"discard_round for step {step}, which is not begun speculative", kind="state")
        self.pending = None
        self._communicating("discard_round").discard_round(pending.saved)

    def finish_round(self, step: int, apply_step: int | None, results: list[bytes]) -> tuple[dict[str, Any], bytes]:
        """The second half: apply the previous round's accepted results, then produce `step`'s result."""
        pending = self.pending
        if pending is None or pending.step != step:
            raise WorkerError(f"finish_round for step {step} without its begin_round", kind="state")
        self.pending = None
        optimizer = self._communicating("train_round")
        if apply_step is not None:
            optimizer.apply(results, apply_step)
        result, stats = optimizer.produce(step)
        _check_finite(pending.stats["loss"], step)
        return {**pending.stats, **stats, "tokens": pending.tokens, "result_bytes": len(result)}, result

    @torch.no_grad()
    def score_results(
        self, results: list[bytes], step: int, batches: list[torch.Tensor], own_batches: bool = False, masks: list[torch.Tensor | None] | None = None
    ) -> dict[str, Any]:
        """Verification (src/core/verify/): the loss on each batch at the replicated parameters, and after applying
        each result alone at round `step` (as apply would, for one peer). Changes nothing. A result that does not
        decode scores None.

        With `own_batches`, batch j is result j's producer's assigned batch and the last batch is the shared
        comparison batch (len(batches) == len(results) + 1): after[j] is then [loss on batch j, loss on the last
        batch] only, so scoring k results costs 2k + k + 1 evaluations instead of k (k + 1) + k + 1."""
        if own_batches and len(batches) != len(results) + 1:
            raise ValueError(f"score_results: own_batches needs {len(results) + 1} batches, got {len(batches)}")
        optimizer = self._communicating("score_results")
        masks = masks if masks is not None else [None] * len(batches)

        def losses(j: int | None) -> list[float]:
            wanted = [j, len(batches) - 1] if own_batches and j is not None else range(len(batches))
            return [self.evaluate(batches[i], masks[i])["loss"] for i in wanted]

        return optimizer.score(results, step, losses)

    def replicated_parameters(self) -> list[tuple[str, torch.Tensor]]:
        """Parameters as every replica holds them (without a local change such as DisTrO's speculation), sorted by name.
        Sharded: this rank's blocks (whole_parameters gives the whole tensors)."""
        return sorted_parameters(self.model) if self.optimizer is None else self.optimizer.replicated_parameters()

    def whole_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The replicated parameters, sorted by name, whole. Sharded, each is gathered from the ranks when its turn
        comes (every rank must iterate to the end, in step) and handed over on the host: one whole tensor at a time
        is on the device."""
        if self.sharding is None:
            yield from self.replicated_parameters()
            return
        sources = dict(self.model.named_parameters())
        for name, local in self.replicated_parameters():
            p = sources[name]
            if self.sharding.is_split(p):
                yield name, self.sharding.gather_rows(local).reshape(p.shape).cpu()
            else:
                yield name, local.cpu()

    @torch.no_grad()
    def import_whole(self, named: dict[str, torch.Tensor]) -> None:
        """Sets every parameter from whole tensors (on every rank: each keeps its block)."""
        for name, p in self.model.named_parameters():
            t = named[name]
            if self.sharding is not None and self.sharding.is_split(p):
                local = self.sharding.local(p)
                rows = local.shape[0]
                local.copy_(t[self.sharding.rank * rows : (self.sharding.rank + 1) * rows])
            else:
                p.copy_(t)

    def restore_replicated(self) -> None:
        """Makes the live parameters the replicated ones (before a save: what every replica holds)."""
        if self.optimizer is not None:
            self.optimizer.restore_replicated()

    @torch.no_grad()
    def evaluate_replicated(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> dict[str, Any]:
        """The loss on `tokens` at the replicated parameters (a local change is set aside for the evaluation and put
        back bit-exactly), so every client that evaluates the same held-out batches after the same step gets the same
        validation loss. Changes nothing."""
        with self.optimizer.replicated() if self.optimizer is not None else nullcontext():
            return self.evaluate(tokens, mask)

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
