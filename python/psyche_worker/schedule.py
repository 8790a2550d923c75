"""Learning-rate schedules, named and shaped as in Psyche's run config (`[model.LLM.lr_schedule.X]`).

Steps count from 0. Every schedule starts with a linear warmup from ``warmup_init_lr`` to
``base_lr`` over ``warmup_steps``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from .protocol import WorkerError


def _warmup(step: int, warmup_steps: int, init_lr: float, base_lr: float) -> float | None:
    if step < warmup_steps:
        return init_lr + (base_lr - init_lr) * step / warmup_steps
    return None


def _decay_progress(step: int, warmup_steps: int, total_steps: int) -> float:
    """Fraction of the decay phase (after warmup, until total_steps) done at ``step``, in [0, 1]."""
    return min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))


@dataclass(frozen=True)
class Constant:
    base_lr: float
    warmup_steps: int = 0
    warmup_init_lr: float = 0.0

    def __call__(self, step: int) -> float:
        w = _warmup(step, self.warmup_steps, self.warmup_init_lr, self.base_lr)
        return self.base_lr if w is None else w


@dataclass(frozen=True)
class _WarmupThenDecay:
    """Linear warmup to ``base_lr``, then a decay to ``final_lr`` at ``total_steps`` whose shape ``decay``
    gives: the LR at a fraction ``progress`` in [0, 1] of the decay phase."""

    base_lr: float
    total_steps: int
    final_lr: float = 0.0
    warmup_steps: int = 0
    warmup_init_lr: float = 0.0

    def __call__(self, step: int) -> float:
        w = _warmup(step, self.warmup_steps, self.warmup_init_lr, self.base_lr)
        if w is not None:
            return w
        return self.decay(_decay_progress(step, self.warmup_steps, self.total_steps))

    def decay(self, progress: float) -> float:
        raise NotImplementedError


@dataclass(frozen=True)
class Linear(_WarmupThenDecay):
    def decay(self, progress: float) -> float:
        return self.base_lr + (self.final_lr - self.base_lr) * progress


@dataclass(frozen=True)
class Cosine(_WarmupThenDecay):
    def decay(self, progress: float) -> float:
        return self.final_lr + (self.base_lr - self.final_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass(frozen=True)
class WarmupStableDecay:
    """Warmup, hold ``base_lr`` for ``stable_steps``, cosine-decay to ``cosine_decay_final_lr`` over
    ``cosine_decay_steps``, then decay linearly to ``linear_decay_final_lr`` over ``linear_decay_steps``."""

    base_lr: float
    warmup_steps: int = 0
    warmup_init_lr: float = 0.0
    stable_steps: int = 0
    cosine_decay_steps: int = 0
    cosine_decay_final_lr: float = 0.0
    linear_decay_steps: int = 0
    linear_decay_final_lr: float = 0.0

    def __call__(self, step: int) -> float:
        w = _warmup(step, self.warmup_steps, self.warmup_init_lr, self.base_lr)
        if w is not None:
            return w
        s = step - self.warmup_steps
        if s < self.stable_steps:
            return self.base_lr
        s -= self.stable_steps
        if s < self.cosine_decay_steps:
            progress = s / self.cosine_decay_steps
            return self.cosine_decay_final_lr + (self.base_lr - self.cosine_decay_final_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
        s -= self.cosine_decay_steps
        start = self.cosine_decay_final_lr if self.cosine_decay_steps > 0 else self.base_lr
        if s < self.linear_decay_steps:
            return start + (self.linear_decay_final_lr - start) * s / self.linear_decay_steps
        return self.linear_decay_final_lr if self.linear_decay_steps > 0 else start


SCHEDULES = {cls.__name__: cls for cls in (Constant, Linear, Cosine, WarmupStableDecay)}


def schedule_from_config(config: dict[str, Any]):
    """Builds a schedule from Psyche's externally tagged form, e.g. ``{"Cosine": {"base_lr": ...}}``."""
    if not isinstance(config, dict) or len(config) != 1:
        raise WorkerError(f"lr_schedule must name exactly one of {sorted(SCHEDULES)}")
    ((name, params),) = config.items()
    cls = SCHEDULES.get(name)
    if cls is None:
        raise WorkerError(f"lr_schedule: unknown schedule {name!r}; expected one of {sorted(SCHEDULES)}")
    known = {f.name for f in fields(cls)}
    unknown = set(params) - known
    if unknown:
        raise WorkerError(f"lr_schedule.{name}: unknown field(s) {sorted(unknown)}")
    try:
        return cls(**params)
    except TypeError as exc:
        raise WorkerError(f"lr_schedule.{name}: {exc}") from None
