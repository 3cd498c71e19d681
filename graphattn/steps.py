"""``graphattn steps``: the six steps of self-attention on a tiny example, every intermediate printed.

Part one runs :func:`graphattn.dense.six_steps` on L = 3 tokens of width
d = 4 (one head, fixed seed, float64) and prints each intermediate with its
shape, the row sums of the weights (each 1) and the output's shape (equal to
the input's). Part two is the worked example of one query: raw scores
2.1, 0.4 and -0.3 with d_k = 4 are scaled by 1/sqrt(4), put through a softmax,
and used to mix three value vectors.

The steps, as numbered in :mod:`graphattn.dense` and the first notebook:
1) project, 2) score, 3) scale, 4) mask, 5) softmax, 6) combine.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["worked_example", "WORKED_SCORES", "WORKED_VALUES"]

WORKED_SCORES = (2.1, 0.4, -0.3)  # raw scores q · k_j of one query against three keys
WORKED_VALUES = ((1.0, 0.0, 0.0, 1.0), (0.0, 2.0, 0.0, 0.0), (0.0, 0.0, 3.0, -1.0))  # v_1, v_2, v_3


def _fmt(t: Tensor, decimals: int) -> str:
    """A 1-D tensor as ``[a, b, c]`` with fixed decimals (``-inf`` spelled out)."""
    width = decimals + 3  # sign, one digit, point: columns line up
    return "[" + ", ".join(f"{v:{width}.{decimals}f}" if math.isfinite(v) else f"{v!s:>{width}}"
                           for v in t.tolist()) + "]"


def _block(name: str, t: Tensor, decimals: int, note: str = "") -> list[str]:
    """A titled matrix: one line of name and shape, then one line per row."""
    t2 = t if t.dim() == 2 else t.reshape(1, -1)  # (rows, cols)
    lines = [f"{name}  shape {tuple(t.shape)}{'  ' + note if note else ''}"]
    lines += [f"    {_fmt(row, decimals)}" for row in t2]
    return lines


def worked_example(scores=WORKED_SCORES, d_k: int = 4, values=WORKED_VALUES) -> dict:
    """One query's attention by hand: scale, softmax, weighted sum of the values.

    Parameters
    ----------
    scores : sequence of float, length S
        Raw scores ``q · k_j``.
    d_k : int
        Key width; the scores are divided by ``sqrt(d_k)``.
    values : sequence of S vectors
        The value vectors ``v_j``.

    Returns
    -------
    dict
        ``scaled (S,)``, ``weights (S,)`` (sum 1) and ``output (D_v,)`` as float64 tensors.

    Raises
    ------
    ValueError
        If ``d_k < 1`` or the number of values differs from the number of scores.
    """
    if d_k < 1:
        raise ValueError(f"Expected 'd_k' to be a positive integer (got {d_k})")
    s = torch.tensor(list(scores), dtype=torch.float64)  # (S,)
    v = torch.tensor([list(row) for row in values], dtype=torch.float64)  # (S, D_v)
    if v.dim() != 2 or v.size(0) != s.numel():
        raise ValueError(f"Expected one value vector per score ({s.numel()}) (got shape {tuple(v.shape)})")
    scaled = s / math.sqrt(d_k)  # (S,)  3) scale
    weights = torch.softmax(scaled, dim=0)  # (S,)  5) softmax
    output = weights @ v  # (S,) · (S, D_v) -> (D_v,)  6) combine
    return dict(scores=s, scaled=scaled, weights=weights, values=v, output=output)


def _six_steps_report(length: int, dim: int, seed: int, causal: bool, decimals: int) -> list[str]:
    from graphattn.dense import six_steps

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(length, dim, generator=gen, dtype=torch.float64)  # (L, d)
    w_q, w_k, w_v = (torch.randn(dim, dim, generator=gen, dtype=torch.float64) / math.sqrt(dim)
                     for _ in range(3))  # (d, d) each
    mask = torch.tril(torch.ones(length, length, dtype=torch.bool)) if causal else None  # (L, L)
    st = six_steps(x, w_q, w_k, w_v, mask)  # one head: every (H, ...) tensor has H = 1
    q, k, v = st.queries[0], st.keys[0], st.values[0]  # (L, d) each
    d = decimals
    lines = [f"The six steps of self-attention: L = {length} tokens, d = {dim}, one head, seed {seed}, float64.",
             "Rows are queries i, columns keys j; the head axis (size 1) is dropped.", ""]
    lines += _block("x: the input tokens", x, d)
    lines += _block("W_Q", w_q, d) + _block("W_K", w_k, d) + _block("W_V", w_v, d)
    lines += [""] + _block("1) project  Q = x W_Q", q, d)
    lines += _block("   project  K = x W_K", k, d) + _block("   project  V = x W_V", v, d)
    lines += [""] + _block("2) score    Q K^T", st.scores[0], d, "(query i, key j)")
    lines += [""] + _block(f"3) scale    Q K^T / sqrt({dim})", st.scaled[0], d, f"(divided by {math.sqrt(dim):g})")
    mask_note = "causal: -inf above the diagonal" if causal else "no mask: every query may read every key"
    lines += [""] + _block("4) mask     scaled, -inf where not allowed", st.masked[0], d, f"({mask_note})")
    weights = st.weights[0]  # (L, S)
    lines += [""] + _block("5) softmax  A = softmax over each row", weights, d)
    lines += [f"   row sums of A: {_fmt(weights.sum(dim=-1), d)}"]
    lines += [""] + _block("6) combine  Y = A V", st.output, d)
    same = tuple(st.output.shape) == tuple(x.shape)
    lines += [f"   output shape {tuple(st.output.shape)} == input shape {tuple(x.shape)}: {same}"]
    return lines


def _worked_report(scores, d_k: int, decimals: int) -> list[str]:
    values = WORKED_VALUES
    if len(scores) != len(values):  # custom scores: unit value vectors of matching count
        values = torch.eye(len(scores), dtype=torch.float64).tolist()
    ex = worked_example(scores, d_k, values)
    d = decimals
    root = math.sqrt(d_k)
    lines = ["", f"Worked example: one query, raw scores q . k_j = {_fmt(ex['scores'], d)}, d_k = {d_k}"]
    lines += [f"3) scaled scores (divided by sqrt({d_k}) = {root:g}): {_fmt(ex['scaled'], d)}"]
    lines += [f"5) softmax weights: {_fmt(ex['weights'], d)}  (sum {ex['weights'].sum().item():.{d}f})"]
    for j, row in enumerate(ex["values"], start=1):
        lines += [f"   value v_{j} = {_fmt(row, d)}"]
    terms = " + ".join(f"{w:.{d}f} v_{j}" for j, w in enumerate(ex["weights"].tolist(), start=1))
    lines += [f"6) output y = {terms} = {_fmt(ex['output'], d)}"]
    return lines

