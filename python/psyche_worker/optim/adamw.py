"""AdamW (`[model.LLM.optimizer.AdamW]`): single-node training, gradient clipping then torch's AdamW."""

from __future__ import annotations

import math

from dataclasses import dataclass
from typing import Any

import torch

from ..protocol import WorkerError
from .base import Batch, BuildContext, Gradients, Optimizer, Stats, clip_grad_norm, read


@dataclass
class AdamWConfig:
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    eps: float = 1e-8
    clip_grad_norm: float | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AdamWConfig:
        unknown = set(d) - {"betas", "weight_decay", "eps", "clip_grad_norm"}
        if unknown:
            raise WorkerError(f"optimizer.AdamW: unknown field(s) {sorted(unknown)}")
        betas = tuple(d.get("betas", (0.9, 0.95)))
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise WorkerError(f"optimizer.AdamW.betas = {list(betas)}: expected two numbers in [0, 1)")

        def number(name: str, value: Any, positive: bool) -> float:
            # the run-config validator's bounds (src/core/config/run-config.ts readAdamW)
            ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
            if not ok or value < 0 or (positive and value == 0):
                raise WorkerError(f"optimizer.AdamW.{name} = {value!r}: expected a finite number {'> 0' if positive else '≥ 0'}")
            return float(value)

        clip = d.get("clip_grad_norm")
        return cls(
            betas=(float(betas[0]), float(betas[1])),
            weight_decay=number("weight_decay", d.get("weight_decay", 0.0), False),
            eps=number("eps", d.get("eps", 1e-8), True),
            clip_grad_norm=None if clip is None else number("clip_grad_norm", clip, True),
        )


def split_decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on matrices only; norms and biases are not decayed (the usual practice for LLMs)."""
    decay, no_decay = [], []
    for _, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class AdamW(Optimizer):
    name = "AdamW"

    def __init__(self, model: torch.nn.Module, config: AdamWConfig, ctx: BuildContext):
        super().__init__(model)
        self.config = config
        self.schedule = ctx.schedule
        # fused kernels on CUDA; on CPU torch's default (single-tensor) path, as a plain loop would use
        fused = True if ctx.device.type == "cuda" else None
        self.torch_optimizer = torch.optim.AdamW(split_decay_groups(model, config.weight_decay), lr=0.0, betas=config.betas, eps=config.eps, fused=fused)

    @classmethod
    def build(cls, config: dict[str, Any], ctx: BuildContext) -> AdamW:
        if ctx.simulate_peers > 1:
            raise WorkerError("simulate_peers needs an optimizer that exchanges results (Distro), not AdamW")
        return cls(ctx.model, AdamWConfig.from_dict(config), ctx)

    def step(self, batch: Batch, step: int, gradients: Gradients) -> Stats:
        lr = self.schedule(step)
        loss = gradients(batch)
        norm = clip_grad_norm(self.model, self.config.clip_grad_norm)
        for group in self.torch_optimizer.param_groups:
            group["lr"] = lr
        self.torch_optimizer.step()
        loss_value, grad_norm = read(loss, norm)  # the step's one sync, after the update is queued
        return {"loss": loss_value, "grad_norm": grad_norm, "lr": lr}

    def state_dict(self) -> dict[str, Any]:
        """torch's AdamW state: per parameter its step and moments, and the parameter groups."""
        return self.torch_optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.torch_optimizer.load_state_dict(state)
