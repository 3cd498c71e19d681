"""``graphattn steps``: the six steps of self-attention on a tiny example, every intermediate printed.

Part one runs :func:`graphattn.dense.six_steps` on L = 3 tokens of width
d = 4 (one head, fixed seed, float64) and prints each intermediate with its
shape, the row sums of the weights (each 1) and the output's shape (equal to
the input's). Part two is the worked example of one query: raw scores
2.1, 0.4 and -0.3 with d_k = 4 are scaled by 1/sqrt(4), put through a softmax,
and used to mix three value vectors (the book prints 1.05 / 0.2 / -0.15, right, then 0.67 / 0.21 / 0.12,
wrong: the printout names the slip), then shows the softmax itself, exp and the
normaliser. Part three, "as a graph", recomputes part one on the
edge list: one row per edge j -> i with q·k, the scaled score, alpha and the
message alpha·v_j, and one node's incoming messages summed to its output row
(:func:`edge_messages`, :func:`edge_table`). Part four, the errata (the
claims of the book that do not hold, each measured), lives in
:mod:`graphattn.errata`.

The steps, as numbered in :mod:`graphattn.dense` and the first notebook:
1) project, 2) score, 3) scale, 4) mask, 5) softmax, 6) combine.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from graphattn.validate import message, shape_message

__all__ = [
    "six_steps_report",
    "worked_report",
    "worked_example",
    "WORKED_SCORES",
    "WORKED_VALUES",
    "BOOK_SCALED",
    "BOOK_WEIGHTS",
    "edge_messages",
    "edge_table",
    "graph_lines",
]

WORKED_SCORES = (2.1, 0.4, -0.3)  # raw scores q · k_j of one query against three keys
BOOK_SCALED = (1.05, 0.2, -0.15)  # the book's scaled scores: WORKED_SCORES / sqrt(4), right
BOOK_WEIGHTS = (0.67, 0.21, 0.12)  # the book's softmax of BOOK_SCALED, wrong (softmax gives 0.578 / 0.247 / 0.174)
WORKED_VALUES = ((1.0, 0.0, 0.0, 1.0), (0.0, 2.0, 0.0, 0.0), (0.0, 0.0, 3.0, -1.0))  # v_1, v_2, v_3


def _fmt(t: Tensor, decimals: int) -> str:
    """A 1-D tensor as ``[a, b, c]`` with fixed decimals (``-inf`` spelled out)."""
    width = decimals + 3  # sign, one digit, point: columns line up
    return (
        "[" + ", ".join(f"{v:{width}.{decimals}f}" if math.isfinite(v) else f"{v!s:>{width}}" for v in t.tolist()) + "]"
    )


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
        raise ValueError(message("d_k", "a positive integer", repr(d_k)))
    s = torch.tensor(list(scores), dtype=torch.float64)  # (S,)
    v = torch.tensor([list(row) for row in values], dtype=torch.float64)  # (S, D_v)
    if v.dim() != 2 or v.size(0) != s.numel():
        raise ValueError(shape_message("values", f"({s.numel()}, D_v), one value vector per score", v.shape))
    scaled = s / math.sqrt(d_k)  # (S,)  3) scale
    weights = torch.softmax(scaled, dim=0)  # (S,)  5) softmax
    output = weights @ v  # (S,) · (S, D_v) -> (D_v,)  6) combine
    return dict(scores=s, scaled=scaled, weights=weights, values=v, output=output)


def six_steps_report(
    length: int, dim: int, seed: int, causal: bool, decimals: int, node: int | None = None
) -> list[str]:
    from graphattn.dense import six_steps

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(length, dim, generator=gen, dtype=torch.float64)  # (L, d)
    w_q, w_k, w_v = (
        torch.randn(dim, dim, generator=gen, dtype=torch.float64) / math.sqrt(dim) for _ in range(3)
    )  # (d, d) each
    mask = torch.tril(torch.ones(length, length, dtype=torch.bool)) if causal else None  # (L, L)
    st = six_steps(x, w_q, w_k, w_v, mask)  # one head: every (H, ...) tensor has H = 1
    q, k, v = st.queries[0], st.keys[0], st.values[0]  # (L, d) each
    d = decimals
    lines = [
        f"The six steps of self-attention: L = {length} tokens, d = {dim}, one head, seed {seed}, float64.",
        "Rows are queries i, columns keys j; the head axis (size 1) is dropped.",
        "",
    ]
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
    from graphattn.graphs import mask_to_edge_index

    allowed = torch.ones(length, length, dtype=torch.bool) if mask is None else mask  # (L, L)
    lines += graph_lines(st, mask_to_edge_index(allowed), decimals, node=node)
    return lines


def worked_report(scores, d_k: int, decimals: int) -> list[str]:
    values = WORKED_VALUES
    if len(scores) != len(values):  # custom scores: unit value vectors of matching count
        values = torch.eye(len(scores), dtype=torch.float64).tolist()
    ex = worked_example(scores, d_k, values)
    d = decimals
    root = math.sqrt(d_k)
    lines = ["", f"Worked example: one query, raw scores q . k_j = {_fmt(ex['scores'], d)}, d_k = {d_k}"]
    lines += [f"3) scaled scores (divided by sqrt({d_k}) = {root:g}): {_fmt(ex['scaled'], d)}"]
    expo = ex["scaled"].exp()  # (S,)
    lines += [f"5) softmax: exp(scaled) = {_fmt(expo, d)}, normaliser Z = their sum = {expo.sum().item():.{d}f}"]
    lines += [f"   weights = exp / Z: {_fmt(ex['weights'], d)}  (sum {ex['weights'].sum().item():.{d}f})"]
    lines += _book_note(scores, d_k)
    for j, row in enumerate(ex["values"], start=1):
        lines += [f"   value v_{j} = {_fmt(row, d)}"]
    terms = " + ".join(f"{w:.{d}f} v_{j}" for j, w in enumerate(ex["weights"].tolist(), start=1))
    lines += [f"6) output y = {terms} = {_fmt(ex['output'], d)}"]
    return lines


def _book_note(scores, d_k: int) -> list[str]:
    """Where the book's worked example goes wrong, when the worked example is the book's."""
    if tuple(scores) != WORKED_SCORES or d_k != 4:
        return []
    book = " / ".join(f"{w:.2f}" for w in BOOK_WEIGHTS)
    scaled = " / ".join(f"{s:g}" for s in BOOK_SCALED)
    return [f"   the book divides by 2 as here ({scaled}) but prints {book}: its exp-and-normalise step is off"]


# --- the graph view: the same computation on the edge list, one row per edge ------------------------


def edge_messages(query: Tensor, key: Tensor, value: Tensor, edge_index: Tensor, scale: float | None = None) -> dict:
    """Attention on an edge list with every per-edge quantity named (the library's thesis, printed).

    Parameters
    ----------
    query : Tensor, shape (L, H, D)
    key : Tensor, shape (S, H, D)
    value : Tensor, shape (S, H, D_v)
    edge_index : Tensor, shape (2, E)
        Row 0 = source = key j, row 1 = target = query i.
    scale : float, optional
        Default ``1 / sqrt(D)``.

    Returns
    -------
    dict
        ``edge_index (2, E)``; per edge ``score (E, H)`` = q_i · k_j, ``scaled (E, H)``,
        ``alpha (E, H)`` (sums to 1 over the edges into each i) and
        ``message (E, H, D_v)`` = alpha_ij v_j; ``output (L, H, D_v)`` from
        :func:`graphattn.attention` and ``summed (L, H, D_v)``, the messages
        scatter-added into their targets by hand (equal to ``output``).

    Examples
    --------
    >>> q = k = v = torch.eye(2, dtype=torch.float64).reshape(2, 1, 2)
    >>> m = edge_messages(q, k, v, torch.tensor([[0, 1], [1, 1]]))   # edges 0 -> 1, 1 -> 1
    >>> m["score"][:, 0].tolist(), bool(torch.allclose(m["summed"], m["output"]))
    ([0.0, 1.0], True)
    """
    from graphattn.ops import attention

    src, dst = edge_index[0], edge_index[1]  # (E,) keys j, queries i
    scale = 1.0 / math.sqrt(query.size(-1)) if scale is None else scale
    score = (query[dst] * key[src]).sum(-1)  # (E, H, D) · (E, H, D) -> (E, H)
    output, alpha = attention(query, key, value, edge_index, scale=scale, need_weights=True)  # (L, H, D_v), (E, H)
    message = alpha[..., None] * value[src]  # (E, H, 1) * (E, H, D_v) -> (E, H, D_v)
    summed = torch.zeros_like(output).index_add_(0, dst, message)  # (L, H, D_v): sum over the edges into i
    return dict(
        edge_index=edge_index,
        score=score,
        scaled=score * scale,
        alpha=alpha,
        message=message,
        output=output,
        summed=summed,
    )


def edge_table(messages: dict, head: int = 0) -> list[dict]:
    """One row per edge ``j -> i`` of :func:`edge_messages`: q·k, scaled score, alpha and alpha·v_j.

    Returns
    -------
    list of dict
        Keys ``"j -> i"``, ``"q·k"``, ``"scaled"``, ``"alpha"`` (floats) and
        ``"alpha·v_j"`` (list of float, length D_v), in edge order; ready for
        ``pandas.DataFrame``.
    """
    ei = messages["edge_index"]
    return [
        {
            "j -> i": f"{j} -> {i}",
            "q·k": messages["score"][e, head].item(),
            "scaled": messages["scaled"][e, head].item(),
            "alpha": messages["alpha"][e, head].item(),
            "alpha·v_j": messages["message"][e, head].tolist(),
        }
        for e, (j, i) in enumerate(ei.T.tolist())
    ]


def graph_lines(st, edge_index: Tensor, decimals: int, max_rows: int = 64, node: int | None = None) -> list[str]:
    """``graphattn steps``'s step "as a graph": the edge table, one node's softmax and its messages summed.

    ``st`` is the :class:`graphattn.dense.SixSteps` of one head; the edge list
    is recomputed from its queries, keys and values and checked against its
    output. ``node`` (default: the last query, which has the most incoming
    edges under a causal mask) is the target whose softmax over its incoming
    edges is spelled out: ``exp(scaled)``, the normaliser ``Z_i`` (their sum)
    and ``alpha = exp / Z_i``.
    """
    q, k, v = (t[0][:, None, :] for t in (st.queries, st.keys, st.values))  # (L, 1, D) each
    m = edge_messages(q, k, v, edge_index)
    rows = edge_table(m)
    dst = edge_index[1]  # (E,) targets i
    node = int(dst.max()) if node is None else node
    expo = m["scaled"][:, 0].exp()  # (E,) exp(scaled score) per edge
    norm = torch.zeros(q.size(0), dtype=expo.dtype).index_add_(0, dst, expo)  # (L,) Z_i = sum over edges into i
    d, w = decimals, decimals + 4
    lines = [
        "",
        "As a graph: the same computation on the edge list, one row per edge j -> i",
        f"(row 0 of edge_index = source = key j, row 1 = target = query i; E = {len(rows)} edges;",
        " Z_i = sum of exp(scaled) over the edges into i, alpha = exp(scaled) / Z_i: the softmax per target)",
        f"    {'j -> i':>8}  {'q.k':>{w}}  {'scaled':>{w}}  {'exp':>{w}}  {'Z_i':>{w}}  {'alpha':>{w}}  alpha * v_j",
    ]
    shown = [e for e, r in enumerate(rows) if len(rows) <= max_rows or r["j -> i"].endswith(f"-> {node}")]
    for e in shown:
        r, z = rows[e], norm[dst[e]].item()
        lines += [
            f"    {r['j -> i']:>8}  {r['q·k']:{w}.{d}f}  {r['scaled']:{w}.{d}f}  {expo[e].item():{w}.{d}f}  "
            f"{z:{w}.{d}f}  {r['alpha']:{w}.{d}f}  " + _fmt(torch.tensor(r["alpha·v_j"]), d)
        ]
    if len(shown) < len(rows):
        lines += [f"    ({len(rows) - len(shown)} more edges into the other queries not shown)"]
    incoming = dst == node  # (E,)
    if not bool(incoming.any()):
        return lines + [f"node i = {node}: no incoming edges, so its output row is zero"]
    summed, y = m["summed"][node, 0], st.output[node]  # (D,) each
    alpha_sum = m["alpha"][incoming, 0].sum().item()
    terms = " + ".join(f"{x:.{d}f}" for x in expo[incoming].tolist())
    same = torch.allclose(summed, y, atol=1e-12) and torch.allclose(m["output"][:, 0], st.output, atol=1e-12)
    lines += [
        f"node i = {node}: {int(incoming.sum())} incoming edges, Z_{node} = {terms} = {norm[node].item():.{d}f}, "
        f"alphas sum to {alpha_sum:.{d}f}",
        f"   sum of its messages alpha_ij v_j = {_fmt(summed, d)}",
        f"   output row y_{node} of step 6    = {_fmt(y, d)}   equal: {same}",
    ]
    return lines
