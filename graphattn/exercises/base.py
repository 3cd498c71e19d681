"""The verdict every checker returns, and the helpers they share."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import Tensor

from graphattn.validate import message

__all__ = ["Verdict", "verdict", "unanswered", "as_tensor", "as_edges", "same_edges", "close"]

STRICT_ENV = "GRAPHATTN_EXERCISES_STRICT"


@dataclass(frozen=True)
class Verdict:
    """A checker's answer: ``ok`` and a message that explains it; true when ``ok``, shown as the message."""

    ok: bool
    message: str

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        return ("Right. " if self.ok else "Not yet. ") + self.message


def verdict(ok: bool, message: str) -> Verdict:
    """The verdict; under ``GRAPHATTN_EXERCISES_STRICT=1`` a wrong answer raises ``AssertionError``."""
    v = Verdict(bool(ok), message)
    if not v.ok and os.environ.get(STRICT_ENV) == "1":
        raise AssertionError(repr(v))
    return v


def unanswered(answer) -> Verdict | None:
    """The verdict for a stub left as ``...``; None once something was filled in."""
    if answer is Ellipsis:
        return verdict(False, "Replace `...` with your code, then run the cell again.")
    return None


def as_tensor(answer, name: str = "answer") -> Tensor:
    """``answer`` as a float64 tensor, or TypeError naming what was given."""
    try:
        return (
            torch.as_tensor(answer, dtype=torch.float64).detach()
            if not isinstance(answer, Tensor)
            else answer.detach().to(torch.float64)
        )
    except (TypeError, ValueError, RuntimeError) as err:
        raise TypeError(message(name, "numbers or a tensor", type(answer).__name__)) from err


def as_edges(answer, name: str = "edge_index") -> Tensor:
    """An edge list as an int64 tensor: a ``(2, E)`` tensor, nested lists, or the pair ``(sources, targets)``."""
    if isinstance(answer, (list, tuple)) and len(answer) == 2 and all(isinstance(t, Tensor) for t in answer):
        answer = [t.reshape(-1) for t in answer]
        if answer[0].numel() != answer[1].numel():
            raise TypeError(
                message(
                    name,
                    "two rows of equal length",
                    f"{answer[0].numel()} sources and {answer[1].numel()} targets",
                )
            )
        return torch.stack(answer).long()
    try:
        return torch.as_tensor(answer).long()
    except (TypeError, ValueError, RuntimeError) as err:
        raise TypeError(message(name, "a (2, E) tensor of node indices", type(answer).__name__)) from err


def same_edges(a: Tensor, b: Tensor) -> bool:
    """The same multiset of columns ``(j, i)`` of two ``(2, E)`` edge lists, in any order."""
    if a.shape != b.shape:
        return False
    key = max(int(a.max()), int(b.max())) + 1 if a.numel() else 1
    return torch.equal((a[0] * key + a[1]).sort().values, (b[0] * key + b[1]).sort().values)


def close(a: Tensor, b: Tensor, atol: float = 1e-6) -> bool:
    """Same shape and equal within ``atol``."""
    return a.shape == b.shape and bool(torch.allclose(a, b, atol=atol, rtol=0))
