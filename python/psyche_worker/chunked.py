"""Chunking, the chunked DCT and top-k: the compression machinery of DisTrO (distro.py), kept apart so that other
chunk-wise compressors reuse it (top-k per chunk without the DCT, for one).

Every parameter is seen as a stack of matrices [B, R, C]: a 1-D tensor [N] is one matrix [1, N], a 2-D tensor
[R, C] one matrix, a tensor of more dimensions [..., R, C] (the fused experts [E, R, C] of a mixture of experts)
prod(...) independent matrices. Each matrix is cut into chunks [cr, cc]; its wire chunk (distro_codec) is [c]
for 1-D, [cr, cc] for 2-D and [1, ..., 1, cr, cc] above. Chunks are numbered row-major over the grid
[B, R/cr, C/cc], and a coefficient inside a chunk by its row-major (row frequency, column frequency) position.

Tensors of one shape form a group (`group_layouts`), so the work of a step is a few batched operations per
shape, not per tensor.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["ChunkedDCT", "dct_matrix", "largest_divisor_at_most", "chunk_for", "matrix_shape", "topk_per_chunk", "group_layouts"]


def largest_divisor_at_most(n: int, limit: int) -> int:
    """The chunk length of a dimension of size n: its largest divisor <= limit (n itself if n <= limit)."""
    if n <= limit:
        return n
    best = 1
    i = 1
    while i * i <= n:
        if n % i == 0:
            if i <= limit:
                best = max(best, i)
            if n // i <= limit:
                best = max(best, n // i)
        i += 1
    return best


def matrix_shape(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """[B, R, C]: the stack of matrices a tensor of `shape` is chunked as."""
    if len(shape) == 0:
        raise ValueError("a scalar has no chunks")
    if len(shape) == 1:
        return 1, 1, shape[0]
    return math.prod(shape[:-2]), shape[-2], shape[-1]


def chunk_for(shape: tuple[int, ...], limit: int) -> tuple[int, ...]:
    """The wire chunk of a tensor of `shape`: the largest divisor <= limit of each of its last two dimensions (its
    only one for 1-D), 1 for every leading dimension."""
    if len(shape) == 0:
        raise ValueError("a scalar has no chunks")
    last = tuple(largest_divisor_at_most(s, limit) for s in shape[-2:])
    return (1,) * (len(shape) - len(last)) + last


@functools.lru_cache(maxsize=None)
def dct_matrix(n: int) -> torch.Tensor:
    """Orthonormal DCT-II matrix D (float32) with D[k, j] = a_k cos(pi (2j+1) k / (2n)); D @ D.T = I.
    Built in float64, rounded once."""
    k = np.arange(n, dtype=np.float64)[:, None]
    j = np.arange(n, dtype=np.float64)[None, :]
    d = np.cos(np.pi * (2 * j + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
    d[0, :] = math.sqrt(1.0 / n)
    return torch.from_numpy(d.astype(np.float32))


class ChunkedDCT:
    """The DCT of one tensor shape over its chunks, as batched matmuls.

    `forward` takes a tensor of `shape`, or a stack of them [G, *shape], and returns the coefficients
    [chunks, chunk elements] (float32), the G tensors' chunks one after the other; C = D_r @ X @ D_c^T per chunk.
    `inverse` and `inverse_sparse` take such coefficients back to a tensor of `shape` (or [G, *shape])."""

    def __init__(self, shape: tuple[int, ...], chunk: tuple[int, ...], device: torch.device | str = "cpu"):
        self.shape, self.chunk = tuple(shape), tuple(chunk)
        if len(self.chunk) != len(self.shape) or any(c < 1 or s % c for s, c in zip(self.shape, self.chunk)):
            raise ValueError(f"chunk {list(chunk)} does not tile shape {list(shape)}")
        if any(c != 1 for c in self.chunk[:-2]):
            raise ValueError(f"chunk {list(chunk)}: leading dimensions are chunked one matrix at a time (chunk 1)")
        self.batch, self.rows, self.cols = matrix_shape(self.shape)
        self.cr, self.cc = (1, self.chunk[0]) if len(self.chunk) == 1 else self.chunk[-2:]
        self.basis_r = dct_matrix(self.cr).to(device)
        self.basis_c = dct_matrix(self.cc).to(device)
        self.n_chunks = self.batch * (self.rows // self.cr) * (self.cols // self.cc)
        self.chunk_elems = self.cr * self.cc

    def _stack(self, numel: int) -> tuple[int, tuple[int, ...]]:
        """Matrices in a tensor (or stack of tensors) of `numel` elements, and the shape to give back."""
        size = math.prod(self.shape)
        count = numel // size
        return count * self.batch, (self.shape if count == 1 else (count, *self.shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x of `shape` (or [G, *shape]) -> coefficients [n_chunks (* G), chunk_elems] (float32)."""
        x = x.to(torch.float32)
        mats, _ = self._stack(x.numel())
        rows, cols, cr, cc = self.rows, self.cols, self.cr, self.cc
        # Columns first as one big GEMM, then rows as a batched GEMM over row-blocks.
        y = x.reshape(mats * rows * cols // cc, cc) @ self.basis_c.T
        if cr > 1:
            y = torch.matmul(self.basis_r, y.reshape(mats * rows // cr, cr, cols))  # [M*R/cr, cr, C]
        if cr == 1:
            return y.reshape(-1, cc)
        return y.reshape(mats, rows // cr, cr, cols // cc, cc).transpose(2, 3).reshape(-1, cr * cc)

    def inverse(self, coeffs: torch.Tensor) -> torch.Tensor:
        """Dense coefficients [n_chunks (* G), chunk_elems] -> tensor of `shape` (or [G, *shape])."""
        coeffs = coeffs.to(torch.float32)
        mats, out_shape = self._stack(coeffs.numel())
        rows, cols, cr, cc = self.rows, self.cols, self.cr, self.cc
        if cr > 1:
            blocks = coeffs.reshape(mats, rows // cr, cols // cc, cr, cc).transpose(2, 3).reshape(mats * rows // cr, cr, cols)
            blocks = torch.matmul(self.basis_r.T, blocks)  # [M*R/cr, cr, C]
        else:
            blocks = coeffs
        return (blocks.reshape(-1, cc) @ self.basis_c).reshape(out_shape)

    def inverse_sparse(self, indices: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Coefficients given as K (index, value) pairs per chunk ([n_chunks (* G), K] each; repeated indices add
        up) -> tensor of `shape` (or [G, *shape]). Costs K multiply-adds per output element instead of cr + cc,
        so it is the fast path for a few top-k results."""
        values = values.to(torch.float32)
        mats, out_shape = self._stack(indices.shape[0] * self.chunk_elems)
        rows, cols, cr, cc = self.rows, self.cols, self.cr, self.cc
        left = self.basis_r[indices // cc] * values.unsqueeze(-1)  # [n, K, cr]
        right = self.basis_c[indices % cc]  # [n, K, cc]
        blocks = torch.bmm(left.transpose(1, 2), right)  # [n, cr, cc]
        if cr == 1:
            return blocks.reshape(out_shape)
        return blocks.reshape(mats, rows // cr, cols // cc, cr, cc).transpose(2, 3).reshape(out_shape)


def topk_per_chunk(coeffs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices [n, k] (int64) and values [n, k] of the k largest-magnitude coefficients of each chunk."""
    indices = torch.topk(coeffs.abs(), k, dim=1, sorted=False).indices
    return indices, torch.gather(coeffs, 1, indices)


@dataclass(frozen=True)
class Group:
    """Tensors of one (shape, chunk, topk), processed together: `members` are their positions in model order."""

    shape: tuple[int, ...]
    chunk: tuple[int, ...]
    topk: int
    members: tuple[int, ...]


def group_layouts(layouts: list[tuple[tuple[int, ...], tuple[int, ...], int]]) -> list[Group]:
    """Tensors grouped by (shape, chunk, topk), groups in order of their first member."""
    groups: dict[tuple, list[int]] = {}
    for position, key in enumerate(layouts):
        groups.setdefault(key, []).append(position)
    return [Group(shape, chunk, topk, tuple(members)) for (shape, chunk, topk), members in groups.items()]
