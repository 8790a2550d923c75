"""A model sharded across the ranks of one client (``--shard N``): PyTorch's FSDP2 (``fully_shard``), NCCL between
GPUs, gloo on CPU (the ranks and their group are parallel.py's).

Each rank holds 1/N of every sharded parameter, of its gradient and of the optimizer's state for it. Each rank also
trains on its share of each batch's rows, as with data parallelism, and FSDP sums the gradients (reduce-scatter,
plain SUM: the trainer weights each rank's loss so that the sum is the batch's mean gradient, as parallel.py does).

Shards on chunk boundaries. A parameter is split along its first dimension into N equal row blocks (FSDP's
``Shard(0)``), and only when each block is whole DCT chunks of DisTrO (``chunk_rows``): then the chunks of rank r are
one contiguous run of the tensor's chunk numbering (chunked.py numbers chunks row-major), so each rank compresses and
applies its own chunks with the very operations an unsharded client runs on them, and the result is assembled from
the ranks' coefficients in the canonical order. A parameter that cannot be split so (a first dimension that N chunk
rows do not divide) is not sharded: every rank holds it whole (``ignored_params``) and its gradient is summed by an
all-reduce.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .protocol import WorkerError


def _is_dtensor(t: Any) -> bool:
    return type(t).__name__ in ("DTensor", "Parameter") and hasattr(t, "to_local") and hasattr(t, "placements")


@dataclass
class Sharding:
    """This rank's place in a sharded client, and the few collectives the optimizer and the trainer need."""

    rank: int
    world: int
    #: the ranks' group (NCCL on GPUs, gloo on CPU)
    group: Any
    #: set once the model is sharded: for each parameter name, whether it is split across the ranks
    split: dict[str, bool] | None = None
    #: what the model was sharded for: the first dimension's chunk of each shape (so a later configure can check)
    chunk_rows: Callable[[tuple[int, ...]], int] | None = None

    # -- sharding the model -----------------------------------------------------------------------

    def splittable(self, shape: tuple[int, ...], rows_per_chunk: int) -> bool:
        """Whether a tensor of `shape` splits into `world` equal row blocks of whole chunks."""
        return len(shape) >= 1 and shape[0] % (self.world * rows_per_chunk) == 0

    def shard(self, model: torch.nn.Module, device: torch.device, chunk_rows: Callable[[tuple[int, ...]], int]) -> None:
        """Shards `model` (on the host, whole, the same bytes on every rank) onto `device`: every decoder layer is one
        FSDP unit, the rest (embeddings, final norm, head) the root's. `chunk_rows(shape)`: the rows of one chunk of
        the first dimension (1 where the optimizer does not care)."""
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import Shard

        named = dict(model.named_parameters())
        split = {n: self.splittable(tuple(p.shape), chunk_rows(tuple(p.shape))) for n, p in named.items()}
        if self.split is not None:
            if split != self.split:
                raise WorkerError("the model is sharded for another chunk size: reload the model before changing the optimizer's chunks", kind="state")
            return
        ignored = {p for n, p in named.items() if not split[n]}
        # FSDP moves what it shards to the mesh's device one unit at a time (never the whole model at once); a whole
        # parameter is moved here
        for p in ignored:
            p.data = p.data.to(device)
        mesh = torch.distributed.device_mesh.init_device_mesh(device.type, (self.world,))

        def placement(_: torch.nn.Parameter):
            return Shard(0)

        layers = getattr(getattr(model, "model", None), "layers", None)
        units = list(layers) if layers is not None else []
        for unit in [*units, model]:
            # every unit, the root too, frees its gathered parameters after each forward: a forward without backward
            # (evaluation, verification) must not leave a gathered copy that a later change of the shards misses
            fully_shard(unit, mesh=mesh, reshard_after_forward=True, shard_placement_fn=placement, ignored_params=ignored or None)
        for unit in [*units, model]:
            # the trainer weights each rank's loss: FSDP sums the gradients, and divides by nothing, in rank order
            unit.set_force_sum_reduction_for_comms(True)
            unit.set_gradient_divide_factor(1.0)
            unit.set_custom_reduce_scatter(_InRankOrder(self))
        self.split = {n: split[n] for n in named}
        self.chunk_rows = chunk_rows

    # -- tensors ----------------------------------------------------------------------------------

    @staticmethod
    def local(t: torch.Tensor) -> torch.Tensor:
        """This rank's block of a sharded tensor (a view: writing it writes the parameter); a whole one as it is."""
        return t.to_local() if hasattr(t, "to_local") else t

    def is_split(self, t: torch.Tensor) -> bool:
        return hasattr(t, "to_local") and self.world > 1

    def whole(self, local: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        """The whole tensor of which `local` is this rank's block, `source` the parameter it belongs to (every rank
        must call this, in the same order); a parameter that is not split as it is."""
        return self.gather_rows(local).reshape(source.shape) if self.is_split(source) else local

    def full(self, t: torch.Tensor) -> torch.Tensor:
        """The whole tensor (every rank must call this, in the same order)."""
        if hasattr(t, "full_tensor"):
            return t.full_tensor()
        return t

    def gather_rows(self, local: torch.Tensor) -> torch.Tensor:
        """[world, *local.shape]: every rank's `local` (equal shapes on every rank), in rank order."""
        shape = local.shape
        local = local.contiguous().reshape(1, -1)
        out = torch.empty((self.world, local.shape[1]), dtype=local.dtype, device=local.device)
        dist.all_gather_into_tensor(out, local, group=self.group)
        return out.view(self.world, *shape)

    def reduce_scatter_in_order(self, flat: torch.Tensor, out: torch.Tensor) -> None:
        """`out` ← the sum over ranks of their `flat`'s piece of this rank (piece r: the r-th of `world` equal ones),
        added in rank order, ((x0 + x1) + x2) + ...: the order in which an unsharded client accumulates the
        micro-batches of the same rows (rank r holds the r-th run of them). A ring's reduce-scatter or all-reduce adds
        in another order from 3 ranks on, and float addition is not associative."""
        pieces = torch.empty_like(flat)
        dist.all_to_all_single(pieces, flat.contiguous(), group=self.group)
        pieces = pieces.view(self.world, -1)
        out.copy_(pieces[0])
        for piece in pieces[1:]:
            out.add_(piece)

    def all_reduce_sum_(self, t: torch.Tensor) -> torch.Tensor:
        """`t` ← the sum of every rank's `t`, added in rank order (reduce_scatter_in_order), the same on every rank."""
        flat = t.reshape(-1)
        n = flat.numel()
        padded = torch.nn.functional.pad(flat, (0, (-n) % self.world))
        mine = torch.empty(padded.numel() // self.world, dtype=t.dtype, device=t.device)
        self.reduce_scatter_in_order(padded, mine)
        every = torch.empty_like(padded)
        dist.all_gather_into_tensor(every, mine, group=self.group)
        t.copy_(every[:n].view_as(t))
        return t


class _InRankOrder:
    """FSDP's reduce-scatter of the gradients (its `ReduceScatter` interface: `set_custom_reduce_scatter`), summing in
    rank order (Sharding.reduce_scatter_in_order)."""

    def __init__(self, sharding: Sharding):
        self.sharding = sharding

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, op: Any, async_op: bool = False) -> None:
        self.sharding.reduce_scatter_in_order(input_tensor, output_tensor)
