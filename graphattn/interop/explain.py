"""``graphattn explain``: what one token attends to in a real model, per layer and head.

    graphattn explain "The animal didn't cross the street because it was too tired." --token it

runs all-MiniLM-L6-v2 with graph attention (:mod:`graphattn.interop.hf`),
prints, for every layer, the keys the chosen token reads most (weights averaged
over the heads, and in the head with the largest single weight), and writes
PNG heatmaps, queries on rows and keys on columns:

- ``heatmap_layer<L>_head<H>.png``: one layer and head, every query;
- ``grid.png``: layers x heads, every query;
- ``query_<token>.png``: per layer, the chosen token's row in every head.

Attention weights show what a head mixes in, which is evidence of association,
not an explanation of the model's output; one head or layer proves nothing.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

__all__ = ["DEFAULT_OUT", "explain", "find_token", "top_keys"]

DEFAULT_OUT = "explain-out"


def find_token(tokens: list[str], word: str, pieces: list[str], occurrence: int = 1) -> int:
    """Position of the ``occurrence``-th match of ``word`` in ``tokens`` (its first piece).

    Parameters
    ----------
    tokens : list of str
        The sentence's tokens.
    word : str
        What the user typed (used in the error message).
    pieces : list of str
        ``word`` as the tokenizer splits it, e.g. ``["token", "##izer"]``.
    occurrence : int
        1 for the first match.

    Raises
    ------
    ValueError
        If ``word`` is not in the sentence (the message lists its tokens) or
        occurs fewer than ``occurrence`` times.
    """
    starts = [i for i in range(len(tokens) - len(pieces) + 1) if pieces and tokens[i:i + len(pieces)] == pieces]
    if not starts:
        raise ValueError(f"Expected --token to be a token of the sentence (got {word!r}); "
                         f"its tokens are: {' '.join(tokens)}")
    if not 1 <= occurrence <= len(starts):
        raise ValueError(f"Expected --occurrence to be in [1, {len(starts)}] for {word!r} (got {occurrence})")
    return starts[occurrence - 1]


def top_keys(row, tokens: list[str], k: int) -> list[tuple[int, str, float]]:
    """The ``k`` largest weights of one query's row ``(S,)``: ``(position, token, weight)``, largest first."""
    values, index = row.topk(min(k, row.numel()))
    return [(int(j), tokens[int(j)], float(w)) for w, j in zip(values, index)]


def explain(text: str, token: str, *, occurrence: int = 1, layer: int | None = None, head: int | None = None,
            top: int = 3, out: str | Path | None = DEFAULT_OUT, model=None, tokenizer=None,
            file=None) -> dict:
    """Print what ``token`` attends to in every layer; write heatmaps to ``out`` (None: no files).

    Returns
    -------
    dict
        ``tokens`` (list of str), ``query`` (int position), ``truncated``
        (bool), ``weights`` (Tensor (layers, H, N, N), queries on rows),
        ``layers``: per layer a dict with ``mean`` (top keys of the
        head-averaged row) and ``head``/``head_top`` (the head with the
        largest single weight and its top keys), each key a
        ``(position, token, weight)`` triple; ``layer``/``head`` of the single
        heatmap and ``files`` (list of paths written).

    Raises
    ------
    ValueError
        For an unknown token, or ``layer``/``head``/``occurrence``/``top`` out of range.
    """
    from graphattn.interop.hf import load_minilm
    from graphattn.interop.records import attention_records

    file = sys.stdout if file is None else file
    if model is None or tokenizer is None:
        model, tokenizer = load_minilm()
    limit = min(int(getattr(model.config, "max_position_embeddings", 512)), 512)
    num_tokens = len(tokenizer(text, truncation=False)["input_ids"])
    truncated = num_tokens > limit
    if truncated:
        print(f"notice: the input has {num_tokens} tokens; truncated to the model's limit of {limit}", file=file)
    record = attention_records(model, tokenizer, text, max_length=limit)[0]
    tokens = record.tokens
    query = find_token(tokens, token, tokenizer.tokenize(token), occurrence)
    weights = record.dense()  # (layers, H, N, N)
    num_layers, heads = weights.shape[:2]
    layer = num_layers - 1 if layer is None else layer
    if not 0 <= layer < num_layers:
        raise ValueError(f"Expected --layer to be in [0, {num_layers - 1}] (got {layer})")
    if head is not None and not 0 <= head < heads:
        raise ValueError(f"Expected --head to be in [0, {heads - 1}] (got {head})")
    if top < 1:
        raise ValueError(f"Expected --top to be >= 1 (got {top})")

    rows = weights[:, :, query, :]  # (layers, H, N): what the query reads
    fmt = lambda keys: ", ".join(f"{t} {w:.2f}" for _, t, w in keys)  # noqa: E731
    print(f"{tokens[query]!r} (token {query} of {len(tokens)}) in {num_layers} layers x {heads} heads; "
          f"weights in [0, 1], each row sums to 1", file=file)
    summary = []
    for ell in range(num_layers):
        strongest = int(rows[ell].max(dim=1).values.argmax())
        mean_top = top_keys(rows[ell].mean(dim=0), tokens, top)
        head_top = top_keys(rows[ell, strongest], tokens, top)
        summary.append({"mean": mean_top, "head": strongest, "head_top": head_top})
        print(f"layer {ell}  heads averaged: {fmt(mean_top)}  |  strongest head {strongest}: {fmt(head_top)}",
              file=file)
    head = summary[layer]["head"] if head is None else head
    files = [] if out is None else _plot(weights, tokens, query, layer, head, Path(out))
    for path in files:
        print(f"wrote {path}", file=file)
    return {"tokens": tokens, "query": query, "truncated": truncated, "weights": weights, "layers": summary,
            "layer": layer, "head": head, "files": files}


def _plot(weights, tokens: list[str], query: int, layer: int, head: int, out: Path) -> list[Path]:
    """Write the three PNG files; return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from graphattn import viz

    out.mkdir(parents=True, exist_ok=True)
    num_tokens = len(tokens)
    name = re.sub(r"[^A-Za-z0-9_-]+", "_", tokens[query]).strip("_") or "token"
    paths = [out / f"heatmap_layer{layer}_head{head}.png", out / "grid.png", out / f"query_{name}.png"]

    side = min(max(4.0, 0.32 * num_tokens + 2), 16.0)
    labels = tokens if num_tokens <= 64 else None  # tick labels only while readable
    fig, ax = plt.subplots(figsize=(side + 1, side))
    image = viz.attention_heatmap(weights[layer, head], labels, labels, ax=ax,
                                  title=f"layer {layer}, head {head}: row i = what query i reads")
    fig.colorbar(image, ax=ax, label="attention weight")
    ax.axhline(query - 0.5, color="w", lw=0.8)
    ax.axhline(query + 0.5, color="w", lw=0.8)
    fig.savefig(paths[0], dpi=120, bbox_inches="tight")
    plt.close(fig)

    fig = plt.figure(figsize=(1.6 * weights.size(1) + 1, 1.6 * weights.size(0)))
    viz.head_grid(weights, tokens, fig=fig)
    fig.suptitle("attention weights, layers x heads (queries on rows, keys on columns)")
    fig.savefig(paths[1], dpi=80, bbox_inches="tight")
    plt.close(fig)

    fig = plt.figure(figsize=(max(8.0, 2.2 * weights.size(0) + 1), 4))
    viz.head_grid(weights, tokens, query=query, fig=fig)
    fig.savefig(paths[2], dpi=120, bbox_inches="tight")
    plt.close(fig)
    return paths

