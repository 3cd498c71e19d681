"""The errata that need a pretrained model, measured on all-MiniLM-L6-v2 run eagerly (the Hugging Face reference).

Needs the ``hf`` extra (transformers and the packaged model); every number is
computed from one forward pass per sentence.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import Tensor

from graphattn.errata.book import row

__all__ = ["ERRATA_SENTENCE", "OTHER_SENTENCE", "errata_minilm", "minilm_run"]

ERRATA_SENTENCE = "The animal didn't cross the street because it was too tired."  # notebook 3's sentence
OTHER_SENTENCE = "The animal didn't cross the street because it was too wide."  # the book's second sentence


def minilm_run(text: str) -> dict:
    """MiniLM on ``text``: tokens, hidden states, weights, per-layer queries, keys, values, the pooling config.

    Returns
    -------
    dict
        ``tokens`` (list of str, length N), ``hidden`` (7 tensors (N, F)), ``weights`` (6 tensors (H, N, N),
        query i = row), ``query`` / ``key`` / ``value`` (6 tensors (N, H, D) each), ``pooling`` (dict).
    """
    from graphattn.interop.hf import load_minilm
    from graphattn.interop.local import model_path

    model, tokenizer = load_minilm("eager")
    heads = model.config.num_attention_heads
    seen = dict(query=[], key=[], value=[])
    hooks = [
        getattr(block.attention.self, name).register_forward_hook(
            lambda mod, args, out, name=name: seen[name].append(out[0].reshape(out.size(1), heads, -1))
        )  # (N, H, D)
        for block in model.encoder.layer
        for name in seen
    ]
    enc = tokenizer(text, return_tensors="pt")
    try:
        with torch.no_grad():
            out = model(**enc, output_attentions=True, output_hidden_states=True)
    finally:
        for hook in hooks:
            hook.remove()
    pooling = json.loads((Path(model_path()) / "1_Pooling" / "config.json").read_text())
    return dict(
        tokens=tokenizer.convert_ids_to_tokens(enc["input_ids"][0]),
        pooling=pooling,
        hidden=[h[0].double() for h in out.hidden_states],
        weights=[a[0] for a in out.attentions],
        **seen,
    )


def _cosine(x: Tensor) -> float:
    """Mean pairwise cosine similarity of the rows of ``x`` (N, F), the diagonal left out."""
    unit = x / x.norm(dim=1, keepdim=True)  # (N, F)
    sim = unit @ unit.T  # (N, F) · (F, N) -> (N, N)
    n = x.size(0)
    return float((sim.sum() - sim.diagonal().sum()) / (n * (n - 1)))


def _smoothing(run: dict) -> dict:
    sim = [_cosine(h) for h in run["hidden"]]  # embeddings, then each of the 6 layers
    rising = all(b > a for a, b in zip(sim, sim[1:]))
    return row(
        "depth cures over-smoothing",
        "MiniLM's mean token cosine similarity "
        + ("rises with every layer: " if rising else ": ")
        + " -> ".join(f"{s:.2f}" for s in sim),
        first=sim[0],
        last=sim[-1],
        rises=rising,
    )


def _cls(run: dict) -> dict:
    """Edges from [CLS] into the other tokens say nothing about what [CLS]'s own row reads."""
    weight = [(a[..., 0].sum() / a.sum()).item() for a in run["weights"]]  # share of all weight on key [CLS]
    received = sum(weight[1:5]) / 4
    last = run["weights"][-1].mean(0)[0]  # (N,): [CLS]'s own row in the last layer, heads averaged
    top = sorted(zip(last.tolist(), run["tokens"]), reverse=True)[:4]
    return row(
        "in a pooled classifier the [CLS] token condenses the sentence, since every token attends to it",
        f"the edges [CLS] -> token (the column of [CLS], {received:.0%} of all weight in layers 1-4) say what "
        f"the others read, not what [CLS] reads; its own last-layer row reads "
        + ", ".join(f"{t} {w:.3f}" for w, t in top)
        + " (heads averaged): that row, not the column, is what a pooled classifier reads",
        cls_weight_layers_1_4=received,
        cls_self=last[0],
        **{f"row_{t}": w for w, t in top[1:]},
    )


def _same_query(run: dict, other: dict, query: str = "it", key: str = "street") -> dict:
    """'The same query now matches street': in layer 0 the raw score is unchanged; from layer 1 the query is not."""
    i, j = run["tokens"].index(query), run["tokens"].index(key)
    score, change = [], []
    for q1, k1, q2, k2 in zip(run["query"], run["key"], other["query"], other["key"]):  # (N, H, D) each
        d = q1.size(-1)
        s1, s2 = ((q[i] * k[j]).sum(-1) / math.sqrt(d) for q, k in ((q1, k1), (q2, k2)))  # (H,) each
        score.append((s1 - s2).abs().max().item())
        change.append(((q1[i] - q2[i]).norm() / q1[i].norm()).item())
    return row(
        "change 'tired' to 'wide' and the same query of 'it' now matches 'street'",
        f"in layer 0 the raw score q_it . k_street is the same in both sentences (max |diff| over heads "
        f"{score[0]:.1f}: the word that changed comes after both); from layer 1 on the query of 'it' itself "
        f"differs ({min(change[1:]):.0%}-{max(change[1:]):.0%} of its norm), because it has read the last "
        f"word: a different query, not the same one matching a different key",
        layer0_score_diff=score[0],
        layer1_score_diff=score[1],
        query_change_min=min(change[1:]),
        query_change_max=max(change[1:]),
    )


def _irrelevant(run: dict) -> dict:
    """Keys weighted below uniform still carry a large share of the weight."""
    share = []
    for a in run["weights"]:  # (H, N, N)
        n = a.size(-1)
        share.append(((a * (a < 1 / n)).sum() / a.sum()).item())  # weight on keys below 1/N, of all weight
    return row(
        "irrelevant pairs get a weight near zero and contribute about zero",
        f"keys weighted below uniform (1/N, N = {run['weights'][0].size(-1)} tokens) hold "
        f"{min(share):.0%}-{max(share):.0%} of the weight per layer (all heads, all queries): many small "
        f"weights add up",
        below_uniform_min=min(share),
        below_uniform_max=max(share),
    )


def errata_minilm(text: str = ERRATA_SENTENCE, other: str = OTHER_SENTENCE) -> list[dict]:
    """The four claims about a pretrained model, each measured on MiniLM (eager)."""
    run = minilm_run(text)
    return [_smoothing(run), _cls(run), _same_query(run, minilm_run(other)), _irrelevant(run)]
