"""The errata that need no pretrained model: each claim in the book's scope, its actual error, measured.

Every function returns one row (see :func:`graphattn.errata.errata`); every
number in a row is computed here, none is typed in.
"""

from __future__ import annotations

import math

import torch

from graphattn.steps import BOOK_SCALED, BOOK_WEIGHTS, WORKED_SCORES, worked_example

__all__ = [
    "row",
    "tiny",
    "softmax_worked",
    "learnable_edges",
    "square",
    "very_negative",
    "mask_after",
    "encoder",
    "diagonal",
    "BOOK_TOLERANCE",
]

BOOK_TOLERANCE = 0.01  # the book prints two decimals: a weight "fits" within 0.01


def tiny(x) -> str:
    """A rounding-level difference as a stable phrase (the last bits differ between machines)."""
    return "< 1e-12" if float(x) < 1e-12 else f"{float(x):.1e}"


def row(claim: str, measured: str, **values) -> dict:
    """One erratum: the claim as the book states it, one computed line, and the numbers behind it (floats)."""
    return dict(claim=claim, measured=measured, values={k: float(v) for k, v in values.items()})


def _fmt(ws) -> str:
    return " / ".join(f"{w:.3f}" for w in ws)


def softmax_worked() -> dict:
    """The worked example: the division by sqrt(4) is right, the exp-and-normalise step is not."""
    ex = worked_example(WORKED_SCORES, 4)  # dict of (3,) tensors
    scaled, right = ex["scaled"].tolist(), ex["weights"].tolist()
    division_error = max(abs(a - b) for a, b in zip(scaled, BOOK_SCALED))  # the book's 1.05 / 0.2 / -0.15
    book_error = max(abs(a - b) for a, b in zip(right, BOOK_WEIGHTS))
    # which divisors c make softmax(s / c) match the book's weights to its two decimals: a grid of step 1e-4
    c = torch.arange(10_000, 30_001, dtype=torch.float64) / 10_000  # (C,) divisors 1.0 .. 3.0
    w = torch.softmax(torch.tensor(WORKED_SCORES, dtype=torch.float64) / c[:, None], dim=1)  # (C, 3)
    fits = c[(w - torch.tensor(BOOK_WEIGHTS, dtype=torch.float64)).abs().amax(1) <= BOOK_TOLERANCE]  # (C_fit,)
    low, high = fits.min().item(), fits.max().item()
    return row(
        "softmax(2.1 / sqrt(4), 0.4 / sqrt(4), -0.3 / sqrt(4)) = softmax(1.05, 0.2, -0.15) "
        "= 0.67 / 0.21 / 0.12, so the token takes about two thirds of its output from itself",
        f"the division is right ({' / '.join(f'{s:g}' for s in scaled)}); the exp-and-normalise step is "
        f"wrong: softmax(1.05, 0.2, -0.15) = {_fmt(right)} (off by {book_error:.3f}), so the token takes "
        f"{right[0]:.0%} from itself, not two thirds; the book's weights fit softmax(s / c) within "
        f"{BOOK_TOLERANCE} for any divisor c in {low:.2f}-{high:.2f} (sqrt(2) among them), so guessing "
        f"d_k = 2 explains nothing: the book divides by 2 itself",
        **{f"w{j}": x for j, x in enumerate(right)},
        division_error=division_error,
        book_error=book_error,
        self_share=right[0],
        fit_low=low,
        fit_high=high,
    )


def learnable_edges() -> dict:
    """Attention has no parameter per edge: the weights are recomputed from node features for every input."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).double()
    shapes = [tuple(p.shape) for p in mha.parameters()]
    count = sum(p.numel() for p in mha.parameters())
    x1, x2 = (torch.randn(1, 5, 8, generator=gen, dtype=torch.float64) for _ in range(2))  # (B, L, F)
    x2[:, :2] = x1[:, :2]  # tokens 0 and 1 identical in both inputs: edge 1 -> 0 joins the same two nodes
    with torch.no_grad():
        a1, a2 = (mha(x, x, x)[1][0, 0, 1].item() for x in (x1, x2))  # alpha_01 (query 0, key 1), heads averaged
        long = mha(*(torch.randn(1, 50, 8, generator=gen, dtype=torch.float64),) * 3)[1].shape  # (B, L, S)
    return row(
        "attention is a fully connected graph network with learnable edge weights",
        f"no edge has a parameter: nn.MultiheadAttention(8, 2) holds {count} numbers in {len(shapes)} "
        f"tensors, none with a length axis, and the same ones score {long[-1]} x {long[-1]} edges; the edge "
        f"1 -> 0 between the same two tokens weighs {a1:.3f} in one input and {a2:.3f} in another: the "
        f"weights are computed from node features for every input (what is learned is W_Q and W_K)",
        parameters=count,
        tensors=len(shapes),
        alpha_input_1=a1,
        alpha_input_2=a2,
    )


def square() -> dict:
    """Self-attention's n x n holds on one sequence; the diagnosis 'not square = d_k mismatch' does not."""
    from graphattn.dense import six_steps

    gen = torch.Generator().manual_seed(0)
    t, d = 6, 4
    x = torch.randn(t, d, generator=gen, dtype=torch.float64)  # (t, F) a decoded sequence
    w_q, w_k, w_v = (torch.randn(d, d, generator=gen, dtype=torch.float64) for _ in range(3))  # (F, D)
    try:  # a d_k mismatch: queries of width 4, keys of width 3
        (x @ w_q) @ (x @ w_k[:, :3]).T
        mismatch = "no error"
    except RuntimeError as err:
        mismatch = type(err).__name__
    causal = torch.tril(torch.ones(t, t, dtype=torch.bool))  # (t, t)
    full = six_steps(x, w_q, w_k, w_v, causal).output  # (t, D): full recomputation
    step = six_steps(x[-1:], w_q, w_k, w_v, x_kv=x)  # the new token's query against the cached keys and values
    rows, cols = step.scores.shape[-2:]  # (1, t)
    diff = (step.output[0] - full[-1]).abs().max()
    return row(
        "self-attention's score matrix is n x n; if it is not square, the d_k of Q and K differ",
        f"on one sequence n x n holds, but the diagnosis is wrong: a d_k mismatch (Q width {d}, K width 3) "
        f"never makes a matrix, the product fails first ({mismatch}); self-attention itself makes "
        f"non-square scores: a KV-cached decoding step scores {rows} x {cols} (one new query, {t} cached "
        f"keys) and equals the last row of full causal attention (max |diff| {tiny(diff)})",
        mismatch_raises=mismatch == "RuntimeError",
        step_rows=rows,
        step_cols=cols,
        cache_diff=diff,
    )


def very_negative() -> dict:
    """-1e9 makes a masked weight vanish only when the row keeps a key; a fully masked row goes uniform (or NaN)."""
    from graphattn.ops import attention

    gen = torch.Generator().manual_seed(0)
    s = torch.randn(2, 4, generator=gen, dtype=torch.float64)  # (L, S): row 0 partly masked, row 1 fully
    keep = torch.tensor([[True, True, False, False], [False] * 4])  # (L, S) True = may attend
    big = s.masked_fill(~keep, -1e9).softmax(-1)  # (L, S)
    inf = s.masked_fill(~keep, float("-inf")).softmax(-1)  # (L, S)
    q = k = v = torch.randn(4, 1, 2, generator=gen, dtype=torch.float64)  # (L, H, D)
    out, _ = attention(q, k, v, torch.tensor([[0, 1], [0, 0]]))  # (L, H, D); edges 0 -> 0, 1 -> 0 only
    return row(
        "filling masked scores with a very negative number (-1e9) makes their weights vanish",
        f"only in a row that keeps a key (masked weights {big[0, 2:].max().item():.1f}); a fully masked row "
        f"(a padding query) gets uniform weights {big[1].min().item():.2f} on the masked keys with -1e9 and "
        f"{'NaN' if torch.isnan(inf[1]).all() else 'finite weights'} with -inf; graph attention gives a "
        f"query with no edge a zero row (max |y| {out[1:].abs().max().item():.1f})",
        partial_masked_max=big[0, 2:].max(),
        full_row_weight=big[1].mean(),
        inf_nan=bool(torch.isnan(inf[1]).all()),
        graph_zero_row=out[1:].abs().max(),
    )


def mask_after() -> dict:
    """Masking after the softmax and renormalising is exact; forgetting to renormalise and float16 are not."""
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
    return row(
        "masking after the softmax zeroes then renormalises, so the mask is useless",
        f"zero-then-renormalise equals correct masking (max |diff| {tiny(diff)}); the failures are zeroing "
        f"without renormalising (row sums down to {low:.3f}) and float16 underflow "
        f"(renormalised weight {'NaN' if nan16 else 'finite'}; masking first gives {float(right16):.1f})",
        renormalise_diff=diff,
        min_row_sum=low,
        float16_nan=bool(nan16),
        float16_masked_first=right16,
    )


def encoder() -> dict:
    """Torch's encoder layer has self-attention only; cross-attention is the decoder's."""
    from torch import nn

    def attentions(layer):
        return [n for n, m in layer.named_modules() if isinstance(m, nn.MultiheadAttention)]

    enc = attentions(nn.TransformerEncoderLayer(8, 2, dim_feedforward=8))
    dec = attentions(nn.TransformerDecoderLayer(8, 2, dim_feedforward=8))
    return row(
        "the encoder uses cross-attention",
        f"torch's encoder layer has {len(enc)} attention ({', '.join(enc)}: queries, keys and values "
        f"from the same tokens); only the decoder layer adds cross-attention ({', '.join(dec)})",
        encoder_attentions=len(enc),
        decoder_attentions=len(dec),
    )


def diagonal(L: int = 16, d: int = 64, draws: int = 200, mix: float = 0.7) -> dict:
    """Random independent W_Q, W_K give a uniform self-weight; the more W_K resembles W_Q, the brighter."""
    gen = torch.Generator().manual_seed(0)
    shares = dict(free=0.0, mixed=0.0, tied=0.0)
    for _ in range(draws):
        x = torch.randn(L, d, generator=gen, dtype=torch.float64)  # (L, d)
        w_q, w_k = (torch.randn(d, d, generator=gen, dtype=torch.float64) / math.sqrt(d) for _ in range(2))
        keys = dict(free=w_k, mixed=mix * w_q + (1 - mix) * w_k, tied=w_q)  # (d, d) each
        for name, w_key in keys.items():
            a = torch.softmax((x @ w_q) @ (x @ w_key).T / math.sqrt(d), dim=-1)  # (L, d) · (d, L) -> (L, L)
            shares[name] += a.diagonal().mean().item() / draws
    free, mixed, tied = shares["free"], shares["mixed"], shares["tied"]
    return row(
        "the diagonal is dark because queries and keys come from the same input",
        f"independent random W_Q, W_K (L = {L}, d = {d}, {draws} draws): mean self-weight {free:.4f} "
        f"~ uniform 1/L = {1 / L:.4f}; it grows as W_K resembles W_Q: W_K = {mix} W_Q + {1 - mix:.1f} W' "
        f"gives {mixed:.3f}, W_K = W_Q {tied:.3f}: a bright diagonal is learned, not built in",
        random_self_weight=free,
        uniform=1 / L,
        mixed_self_weight=mixed,
        tied_self_weight=tied,
        mix=mix,
    )
