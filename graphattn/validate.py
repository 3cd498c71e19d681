"""Argument validation: one module, one message template.

Every public entry point of graphattn checks its arguments here, so every
refusal reads the same way and names the argument, what was expected and what
was got (docs/style.md, "Errors")::

    Expected 'edge_index' to have shape (2, E) (got (3, 10))

Built-in exception types carry fixed meanings: ``TypeError`` a wrong type or
dtype, ``ValueError`` a bad value or shape, ``IndexError`` an index out of
range, ``NotImplementedError`` a valid but unsupported combination. Nothing
here imports any other graphattn module (it is the bottom layer).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable

import torch
from torch import Tensor

__all__ = [
    "message",
    "shape_message",
    "as_int",
    "check_int",
    "check_float",
    "check_probability",
    "check_tensor",
    "check_choice",
    "check_bool",
    "check_features",
    "check_edge_list",
    "check_fits_memory",
    "check_not_jit",
    "MAX_INDEX",
]

MAX_INDEX = 2**62  # largest size or index any entry accepts: products of two stay far from int64 overflow


def message(name: str, expected: str, got: object, fix: str = "", *, verb: str = "be") -> str:
    """The one error template: ``Expected 'name' to <verb> <expected> (got <got>)[; <fix>]``.

    ``got`` is shown as is when it is a str, else as its ``repr``. ``verb`` is
    ``"be"`` unless the expectation reads better with another (``"have"`` for a
    shape or a column, ``"hold"`` for contents, ``"name"`` for a list of names).

    Examples
    --------
    >>> message("heads", "a positive int", 0)
    "Expected 'heads' to be a positive int (got 0)"
    >>> message("root", "Python sources", "'src' with no *.py files", verb="hold")
    "Expected 'root' to hold Python sources (got 'src' with no *.py files)"
    """
    got = got if isinstance(got, str) else repr(got)
    return f"Expected {name!r} to {verb} {expected} (got {got})" + (f"; {fix}" if fix else "")


def shape_message(name: str, expected: str, got: str | Iterable[int], fix: str = "") -> str:
    """The template for a shape: ``Expected 'name' to have shape <expected> (got <shape>)[; <fix>]``.

    ``got`` is a shape (``torch.Size``, a NumPy shape, any sequence of ints),
    shown as a tuple, or a str shown as is (e.g. a type name where no shape exists).

    Examples
    --------
    >>> shape_message("edge_index", "(2, E)", torch.Size([3, 10]))
    "Expected 'edge_index' to have shape (2, E) (got (3, 10))"
    """
    text = got if isinstance(got, str) else str(tuple(int(n) for n in got))
    return message(name, f"shape {expected}", text, fix, verb="have")


def as_int(value) -> int | None:
    """``value`` as a Python int if it is an integer (Python, NumPy or 0-d tensor, not bool), else None."""
    if isinstance(value, bool):
        return None
    if torch.compiler.is_compiling() and isinstance(value, (int, torch.SymInt)):
        # a dynamic size stays symbolic (operator.index would specialize it: a recompile per size)
        return value  # type: ignore[return-value]  # a SymInt stands in for the int under the compiler
    try:
        return operator.index(value)
    except TypeError:
        return None


def _range_text(low, high, kind: str) -> str:
    if low is not None and high is not None:
        return f"{kind} in [{low}, {high}]"
    if high is not None:
        return f"{kind} <= {high}"
    return {None: kind, 0: f"a non-negative {kind.split()[-1]}", 1: f"a positive {kind.split()[-1]}"}.get(
        low, f"{kind} >= {low}"
    )


def check_int(name: str, value, low: int | None = 0, high: int | None = MAX_INDEX) -> int:
    """Return ``value`` as an int in ``[low, high]``; ``TypeError`` for a non-int, ``ValueError`` out of range.

    Examples
    --------
    >>> check_int("k", 3, low=1)
    3
    >>> check_int("k", 0, low=1, high=None)
    Traceback (most recent call last):
    ValueError: Expected 'k' to be a positive int (got 0)
    """
    what = _range_text(low, high if high != MAX_INDEX else None, "an int")
    number = as_int(value)
    if number is None:
        raise TypeError(message(name, what, repr(value)))  # repr: a str '2' must not read as the int 2
    if (low is not None and number < low) or (high is not None and number > high):
        raise ValueError(message(name, what if high != MAX_INDEX else f"{what} <= 2**62", repr(value)))
    return number


def check_float(
    name: str,
    value,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """Return ``value`` as a finite float within the given bounds (open or closed)."""
    lo = "" if low is None else ("(" if low_open else "[") + f"{low}, "
    hi = "" if high is None else f"{high}" + (")" if high_open else "]")
    what = "a finite float" + (f" in {lo or '(-inf, '}{hi or 'inf)'}" if (low is not None or high is not None) else "")
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        and not (isinstance(value, Tensor) and value.numel() == 1 and value.is_floating_point())
    ):
        try:
            import numpy as np

            ok = isinstance(value, np.floating)
        except ImportError:  # pragma: no cover
            ok = False
        if not ok:
            raise TypeError(message(name, what, repr(value)))
    number = float(value)
    bad = number != number or number in (math.inf, -math.inf)  # math.isfinite, but traceable (dynamic=True)
    bad |= low is not None and (number <= low if low_open else number < low)
    bad |= high is not None and (number >= high if high_open else number > high)
    if bad:
        raise ValueError(message(name, what, repr(value)))
    return number


def check_probability(name: str, value) -> float:
    """A probability in ``[0, 1)`` (dropout); ``TypeError`` for a non-number."""
    return check_float(name, value, 0.0, 1.0, high_open=True)


def check_bool(name: str, value) -> bool:
    """A plain bool (no three-state flags, no 0/1 ints)."""
    if not isinstance(value, bool):
        raise TypeError(message(name, "a bool", repr(value)))
    return value


def check_choice(name: str, value, choices) -> object:
    """``value`` if it is one of ``choices``, else ``ValueError`` listing them."""
    if value not in choices:
        raise ValueError(message(name, "one of " + ", ".join(repr(c) for c in choices), repr(value)))
    return value


def check_tensor(
    name: str,
    value,
    *,
    dim: int | tuple[int, ...] | None = None,
    shape_text: str = "",
    floating: bool | None = None,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """Validate a tensor argument: type, number of dimensions, floating point or an exact dtype.

    ``shape_text`` (e.g. ``"(L, H, D)"``) is what the message says was expected.
    """
    shape = f" of shape {shape_text}" if shape_text else ""
    if not isinstance(value, Tensor):
        raise TypeError(message(name, f"a Tensor{shape}", type(value).__name__))
    if dim is not None and value.dim() not in ((dim,) if isinstance(dim, int) else dim):
        raise ValueError(message(name, f"a Tensor{shape}", f"shape {tuple(value.shape)}"))
    if floating is True and not value.is_floating_point():
        raise TypeError(message(name, "a floating-point Tensor", value.dtype))
    if dtype is not None and value.dtype != dtype:
        raise TypeError(message(name, f"a Tensor of dtype {dtype}", value.dtype))
    return value


def check_features(name: str, value, weight: Tensor, fix: str = "") -> Tensor:
    """Features ``value (n, F)`` that a projection of weight ``(F_out, F)`` can take, checked before its matmul.

    Width and dtype are compared with ``weight`` (``TypeError`` for the dtype,
    ``ValueError`` for the shape), so a wrong input names the argument instead of
    torch's "mat1 and mat2 shapes cannot be multiplied". An uninitialised (lazy)
    weight takes any width. ``fix`` is appended to the width message (e.g. the
    order of a pair).

    Examples
    --------
    >>> check_features("x", torch.zeros(3, 5), torch.zeros(8, 4))
    Traceback (most recent call last):
    ValueError: Expected 'x' to be of shape (n, 4) (got shape (3, 5))
    """
    check_tensor(name, value, dim=2, shape_text="(n, F)", floating=True)
    if isinstance(weight, torch.nn.parameter.UninitializedParameter):
        return value
    if value.size(1) != weight.size(-1):
        raise ValueError(message(name, f"of shape (n, {weight.size(-1)})", f"shape {tuple(value.shape)}", fix))
    if value.dtype != weight.dtype:
        raise TypeError(
            message(
                name,
                f"of the layer's dtype {weight.dtype}",
                value.dtype,
                f"convert one of them, e.g. conv.to({value.dtype})",
            )
        )
    return value


def check_edge_list(name: str, value: object, what: str = "a LongTensor of shape (2, E)", fix: str = "") -> Tensor:
    """An edge list's type, integer dtype and ``(2, E)`` shape (its values are the caller's to check).

    ``what`` is the message's expectation for a value that is not a tensor, and
    ``fix`` its remedy. Returns the tensor.

    Examples
    --------
    >>> check_edge_list("edge_index", torch.zeros(2, 0, dtype=torch.long)).shape
    torch.Size([2, 0])
    >>> check_edge_list("edge_index", torch.zeros(3, 10, dtype=torch.long))
    Traceback (most recent call last):
    ValueError: Expected 'edge_index' to have shape (2, E) (got (3, 10))
    """
    if not isinstance(value, Tensor):
        raise TypeError(message(name, what, type(value).__name__, fix))
    if value.dtype not in (torch.int64, torch.int32):
        raise TypeError(
            message(
                name,
                "dtype int64 or int32",
                value.dtype,
                "to turn a bool mask into edges use graphattn.graphs.mask_to_edge_index",
                verb="have",
            )
        )
    if value.dim() != 2 or value.size(0) != 2:
        raise ValueError(shape_message(name, "(2, E)", value.shape))
    return value


def _memory_bytes() -> int | None:
    """The machine's physical memory in bytes, or None where the OS does not say (then nothing is refused)."""
    try:
        import os

        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # pragma: no cover - not POSIX
        return None


def check_fits_memory(name: str, value, numel: int, itemsize: int = 4) -> None:
    """Refuse ``value`` (a size) when the ``numel`` elements it asks for exceed the machine's memory.

    Called before allocating, so that a huge size is one clear ``ValueError``
    naming the argument instead of an allocator failure deep inside torch.

    Examples
    --------
    >>> check_fits_memory("out_channels", 4, numel=16)
    """
    limit = _memory_bytes()
    if limit is not None and numel * itemsize > limit:
        raise ValueError(
            message(
                name,
                f"small enough to allocate (its {numel} elements take {numel * itemsize} "
                f"bytes; this machine has {limit})",
                repr(value),
            )
        )


def check_not_jit(module, how: str) -> None:
    """``NotImplementedError`` for TorchScript (``how`` = ``"trace"`` or ``"script"``), naming what works instead.

    graphattn's layers pick kernels and cache graph structure on the host, which a
    trace would freeze into constants for the one graph it saw; ``torch.compile``
    and ``torch.export`` trace their ``propagate`` path instead.
    """
    if how == "script" or torch.jit.is_tracing():
        raise NotImplementedError(
            f"{type(module).__name__} does not support torch.jit.{how} (it picks kernels and caches graph "
            "structure in Python, which TorchScript cannot compile or would freeze for one graph); use "
            "torch.compile(layer) or torch.export.export(layer, args), which trace its propagate path"
        )
