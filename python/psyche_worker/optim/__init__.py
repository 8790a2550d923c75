"""The worker's optimizers: one interface (base.py), one module per variant, and the registry that builds one by its
name in the run config's externally tagged `optimizer` table (`{"Distro": {...}}`).

To add an optimizer: a module here with a class implementing `Optimizer` (trains alone) or `CommunicatingOptimizer`
(its rounds exchange results), and one entry in OPTIMIZERS. The trainer and the server need no change."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..protocol import WorkerError
from .adamw import AdamW
from .base import BuildContext, CommunicatingOptimizer, Optimizer
from .distro import Distro
from .sparseloco import SparseLoCo

Builder = Callable[[dict[str, Any], BuildContext], Optimizer]

OPTIMIZERS: dict[str, Builder] = {
    AdamW.name: AdamW.build,
    Distro.name: Distro.build,
    SparseLoCo.name: SparseLoCo.build,
}


def _names() -> str:
    names = sorted(OPTIMIZERS)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


SHARDABLE: dict[str, Callable[[dict[str, Any]], Callable[[tuple[int, ...]], int] | None]] = {
    AdamW.name: AdamW.shard_rows,
    Distro.name: Distro.shard_rows,
    SparseLoCo.name: SparseLoCo.shard_rows,
}


def shard_rows(config: Any) -> Callable[[tuple[int, ...]], int]:
    """For a sharded client: the rows a shard of each shape must hold whole, for the optimizer a config names
    (WorkerError if that optimizer does not train a sharded model)."""
    if not isinstance(config, dict) or len(config) != 1:
        raise WorkerError(f"optimizer must name exactly one of {', '.join(sorted(OPTIMIZERS))}")
    ((name, params),) = config.items()
    rows = SHARDABLE[name](params or {}) if name in SHARDABLE else None
    if rows is None:
        raise WorkerError(f"optimizer {name!r} does not train a sharded model (--shard); use Distro or SparseLoCo", kind="unsupported")
    return rows


def build_optimizer(config: Any, ctx: BuildContext) -> Optimizer:
    """The optimizer a config names, e.g. `{"AdamW": {"betas": [0.9, 0.95]}}`, built over ctx.model."""
    if not isinstance(config, dict) or len(config) != 1:
        raise WorkerError(f"optimizer must name exactly one of {', '.join(sorted(OPTIMIZERS))}")
    ((name, params),) = config.items()
    builder = OPTIMIZERS.get(name)
    if builder is None:
        raise WorkerError(f"optimizer {name!r} is not supported; expected {_names()}", kind="unsupported")
    return builder(params or {}, ctx)


__all__ = ["BuildContext", "CommunicatingOptimizer", "OPTIMIZERS", "Optimizer", "build_optimizer", "shard_rows"]
