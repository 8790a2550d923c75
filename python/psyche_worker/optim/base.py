"""The one interface every optimizer of the worker implements, so that the trainer never branches on which one runs.

The trainer owns the model's forward/backward (micro-batches, autocast, data parallelism, the loss) and hands it to
the optimizer as a `Gradients` callable; the optimizer owns everything from gradients to parameters: clipping, the
update rule, the results that cross the network, and which parameters every replica holds.

Two kinds:

* `Optimizer`: trains alone. `step` is one single-node training step.
* `CommunicatingOptimizer`: a round's update is exchanged. Each client's round is `begin_round` (its local compute,
  which may overlap with the download of the previous round's results) then `apply` (the previous round's accepted
  results, as every replica applies them) and `produce` (this round's result for its peers). Verification scores a
  result with `score`. DisTrO (one forward/backward per round, the compressed momentum as result) is one; an optimizer
  with local steps (H inner steps per round in `begin_round`, a compressed pseudo-gradient from `produce`, the outer
  step from every contribution in `apply`) is another.

Step numbers are the coordinator's: an optimizer maps them to learning rates with the run's schedule
(`BuildContext.schedule`). Methods return their reply fields as a plain dict (`Stats`) of host numbers: `loss` and
`grad_norm` where gradients were taken, `lr`, and whatever else the optimizer reports (`result_bytes`).

One sync per step: `Gradients` returns the loss as a tensor on the device and `clip_grad_norm` the norm, both unread.
An optimizer reads them together, with `read`, once it has queued what the step needs of them (the update): a read
waits for the device, and a read in the middle of a step leaves the device idle while the host queues the rest.

A result that does not decode is refused as data: `WorkerError(kind="bad_result", index=i)`, `i` its position in the
list given, with nothing changed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

if TYPE_CHECKING:
    from ..sharding import Sharding


@dataclass(frozen=True)
class Batch:
    """Token rows ([rows, seq_len + 1]) and their loss mask (loss_mask.py; None: every target counts). An optimizer
    only splits a batch by rows (simulated peers, inner steps); what the rows hold is the trainer's business."""

    tokens: torch.Tensor
    mask: torch.Tensor | None = None

    @property
    def rows(self) -> int:
        return int(self.tokens.shape[0]) if self.tokens.ndim == 2 else 0

    def rows_between(self, start: int, end: int) -> Batch:
        return Batch(self.tokens[start:end], None if self.mask is None else self.mask[start:end])


Gradients = Callable[[Batch], torch.Tensor]
"""The trainer's forward/backward on a batch: fills every parameter's `.grad` with the batch's mean gradient (zeroed
first; identical on every data-parallel rank) and returns the mean loss, a 0-d tensor on the device (unread: `read`
it with the step's other numbers)."""

Losses = Callable[[int | None], list[float]]
"""Verification's measurement at the parameters in place: the losses on the batches the trainer holds for result `j`
(None: the batches measured before any result)."""

Stats = dict[str, Any]


@dataclass(frozen=True)
class BuildContext:
    """What an optimizer is built for, besides its own config table."""

    model: torch.nn.Module
    device: torch.device
    schedule: Callable[[int], float]
    """The run's learning-rate schedule: step -> lr."""
    simulate_peers: int = 1
    """Single-node training split among this many simulated clients (an optimizer that cannot refuses > 1)."""
    delay_correction: bool = False
    """The network path: a round's results are applied one round late, during the next round."""
    sharding: Sharding | None = None
    """The model is sharded across this client's ranks (sharding.py): the parameters are FSDP's DTensors, and the
    optimizer keeps state for this rank's blocks only."""


def clip_grad_norm(model: torch.nn.Module, max_norm: float | None, sharding: Sharding | None = None) -> torch.Tensor:
    """The total norm of the gradients, a 0-d tensor on the device (unread); scales them down to `max_norm` if it
    is exceeded (None: only measures, without a pass over the gradients to scale them by 1).

    Sharded (every rank calls it): the norm and the scaling of an unsharded client, bit for bit, as torch computes
    them: each gradient's norm over the whole tensor (a split one gathered, one at a time), their norm in the
    model's order, and each rank's blocks scaled by min(1, max_norm / (norm + 1e-6))."""
    params = [p for p in model.parameters() if p.grad is not None]
    if sharding is None:
        if max_norm is None:
            return torch.nn.utils.get_total_norm([p.grad for p in params])
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    if not params:
        return torch.tensor(0.0)
    norms = [torch._foreach_norm([sharding.whole(sharding.local(p.grad), p)], 2)[0] for p in params]
    total = torch.linalg.vector_norm(torch.stack(norms), 2)
    if max_norm is not None:
        coefficient = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)
        for p in params:
            sharding.local(p.grad).mul_(coefficient)
    return total


def read(*values: torch.Tensor) -> list[float]:
    """0-d device tensors as host floats, in one copy: the step's one sync (module docstring)."""
    return torch.stack([v.detach().reshape(()).to(torch.float64) for v in values]).tolist()


def sorted_parameters(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [(n, p.detach()) for n, p in sorted(model.named_parameters(), key=lambda kv: kv[0])]


class Optimizer(ABC):
    """An optimizer of the worker, built from the `[model.LLM.optimizer.<name>]` table of a run config."""

    name: ClassVar[str]
    """The variant's name in the run config (`AdamW`, `Distro`)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    @classmethod
    @abstractmethod
    def build(cls, config: dict[str, Any], ctx: BuildContext) -> Optimizer:
        """Validates the config table (a WorkerError naming the field) and builds the optimizer over ctx.model."""

    @classmethod
    def shard_rows(cls, config: dict[str, Any]) -> Callable[[tuple[int, ...]], int] | None:
        """For a sharded client (sharding.py): given a tensor shape, the rows of the first dimension that one shard
        must hold whole (a multiple of). None: this optimizer does not train a sharded model."""
        return None

    @abstractmethod
    def step(self, batch: Batch, step: int, gradients: Gradients) -> Stats:
        """One training step without a network (single-node training): gradients on `batch`, then the update.
        Returns loss, grad_norm and lr."""

    def replicated_parameters(self) -> list[tuple[str, torch.Tensor]]:
        """The parameters as every replica holds them, sorted by name: what is hashed, exported and compared."""
        return sorted_parameters(self.model)

    @contextmanager
    def replicated(self) -> Iterator[None]:
        """Inside, the model's parameters hold the replicated values (evaluation reads them there; nothing may change
        them); on exit the live values are back bit for bit."""
        yield

    def restore_replicated(self) -> None:
        """Makes the live parameters the replicated ones for good, dropping a local change not yet replicated (the
        worker saves the model after this). By default the live parameters are the replicated ones."""
        return None

    def result_format(self) -> dict[str, Any] | None:
        """What a peer's result must look like, for the client's validator (src/core/verify/result.ts); None: this
        optimizer exchanges no results."""
        return None

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The optimizer's own state (not the parameters), to resume training bit for bit."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores state_dict()'s output (ValueError if it is not this optimizer's, for this model)."""


class CommunicatingOptimizer(Optimizer):
    """An optimizer whose rounds exchange results between clients (module docstring)."""

    @abstractmethod
    def begin_round(self, batch: Batch, step: int, gradients: Gradients) -> Stats:
        """The local compute of round `step` on this client's batch, while the previous round's results may still be
        arriving: it leaves what `apply` starts from (the replicated parameters) as it is. Returns loss and grad_norm."""

    def save_round(self) -> Any:
        """Before a speculative begin_round (a round whose batches the client predicted before the round began): what
        discard_round needs to undo that begin_round bit for bit. Default None: begin_round changes nothing that
        outlives it (DisTrO's gradients wait in .grad, and the next begin_round overwrites them)."""
        return None

    def discard_round(self, saved: Any) -> None:
        """Undoes a speculative begin_round whose prediction failed, from save_round's value: the optimizer is as
        if it had never run, so nothing is trained twice or on batches that are not this client's."""
        return None

    @abstractmethod
    def apply(self, results: list[bytes], step: int) -> None:
        """Applies the results accepted in round `step`, as every replica does: in any order, with the same bytes
        out. Validates every result first: WorkerError(kind="bad_result", index=i) for the first that does not
        decode, nothing changed."""

    @abstractmethod
    def produce(self, step: int) -> tuple[bytes, Stats]:
        """Round `step`'s result for the peers, from begin_round's work (after the previous round's apply). Returns
        the encoded result and lr."""

    @abstractmethod
    def score(self, results: list[bytes], step: int, losses: Losses) -> Stats:
        """Verification: `losses(None)` at the replicated parameters, then for each result j `losses(j)` at the
        replicated parameters updated by result j alone (as apply would at round `step`). Returns before (the
        first), after (one entry per result; None for a result that does not decode) and lr. Changes nothing."""

    @abstractmethod
    def result_format(self) -> dict[str, Any]:
        """What a peer's result must look like (the base class's result_format)."""
