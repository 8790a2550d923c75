"""Loss masks: fine-tuning examples whose loss counts only some tokens (a chat's assistant replies).

A masked batch travels as two frames: the token ids [rows, L] and, right after them, a uint8 mask [rows, L - 1]
whose 1s mark the targets (ids 1..L-1 of each row) that count. The request header says ``"loss_mask": true``.
Without a mask every target counts, exactly as before.

The loss of a masked batch is the mean cross-entropy over its counted targets (token-weighted across
micro-batches and data-parallel ranks, as one forward pass over the whole batch would give). A batch with no
counted target has loss 0 and no gradient.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .protocol import WorkerError


def pair_frames(header: dict[str, Any], frames: list[torch.Tensor], op: str) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """The (tokens, mask) batches of a request's frames: with ``loss_mask`` in the header each tokens frame is
    followed by its mask frame, otherwise each frame is a batch of its own (mask None)."""
    if not header.get("loss_mask"):
        return [(f, None) for f in frames]
    if len(frames) % 2:
        raise WorkerError(f"{op}: loss_mask: expected a mask frame after each tokens frame, got {len(frames)} frames")
    return [(frames[i], frames[i + 1]) for i in range(0, len(frames), 2)]


def check_mask(mask: torch.Tensor | None, tokens: torch.Tensor, device: torch.device) -> torch.Tensor | None:
    """The mask as booleans on `device`, after checking it fits `tokens` ([rows, L] -> [rows, L - 1], 0s and 1s)."""
    if mask is None:
        return None
    want = [tokens.shape[0], tokens.shape[1] - 1]
    if mask.dtype != torch.uint8 or list(mask.shape) != want:
        raise WorkerError(f"loss mask must be uint8 of shape {want} (one entry per target), got {mask.dtype}{list(mask.shape)}", kind="data")
    if mask.numel() and int(mask.max()) > 1:
        raise WorkerError("loss mask entries must be 0 or 1", kind="data")
    return mask.to(device=device, dtype=torch.bool)


def counted(mask: torch.Tensor) -> int:
    """Targets a mask counts."""
    return int(mask.sum())


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Next-token cross-entropy of `logits` [rows, L - 1, vocab] against `targets` [rows, L - 1]: the mean over
    every target, or with `mask` over the counted ones only (0, with a zero gradient, when none counts)."""
    flat = logits.reshape(-1, logits.shape[-1]).float()
    if mask is None:
        return F.cross_entropy(flat, targets.reshape(-1))
    per_token = F.cross_entropy(flat, targets.reshape(-1), reduction="none")
    keep = mask.reshape(-1)
    return (per_token * keep).sum() / max(counted(keep), 1)
