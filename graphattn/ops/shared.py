"""Pieces every kernel shares, written once: the scale, the compute dtype, dropout, an output's layout."""

from __future__ import annotations

import math

import torch
from torch import Tensor

HALF_TYPES = (torch.float16, torch.bfloat16)


def resolve_scale(scale: float | None, channels: int) -> float:
    """The score scale: ``scale`` itself, or ``1 / sqrt(D)`` when None (the fast and the readable path alike)."""
    return 1.0 / math.sqrt(channels) if scale is None else float(scale)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype scores, softmax and sums accumulate in: float32 for float16/bfloat16, else ``dtype``.

    SDPA does the same inside its kernels (its CPU math and flash kernels
    upcast half types); without it a float16 score above 65504 is inf and a
    bfloat16 score keeps 8 bits.
    """
    return torch.float32 if dtype in HALF_TYPES else dtype


def draw_keep(like: Tensor, p: float) -> Tensor:
    """Dropout's keep mask of ``like``'s shape: True with probability ``1 - p``, drawn in place."""
    return torch.empty_like(like, dtype=torch.bool).bernoulli_(1.0 - p)


def apply_keep(x: Tensor, keep: Tensor | None, p: float) -> Tensor:
    """``x * keep / (1 - p)``: dropout's rescaling (forward weights and their gradient alike); ``x`` if no mask."""
    return x if keep is None else x * keep / (1.0 - p)


def as_layout(x: Tensor, like: Tensor) -> Tensor:
    """``x`` in ``like``'s memory layout, as a fake's ``torch.empty_like(like)`` promises (a copy only if not).

    The heads-last kernels return gradients heads innermost, as their inputs came (no copy);
    every other path computes them contiguous.
    """
    if x.stride() == like.stride():
        return x
    return torch.empty_like(like).copy_(x)
