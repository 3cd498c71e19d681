"""What one token attends to in a real model, per layer and head (the library side of ``graphattn explain``).

:func:`explain` runs all-MiniLM-L6-v2 with graph attention
(:mod:`graphattn.interop.hf`) and prints, for every layer, the keys the chosen
token reads most (weights averaged over the heads, and in the head with the
largest single weight). The command

    graphattn explain "The animal didn't cross the street because it was too tired." --token it

also writes PNG heatmaps, queries on rows and keys on columns (drawn by
:mod:`graphattn.cli.explain`, since :mod:`graphattn.viz` sits above interop):

- ``heatmap_layer<L>_head<H>.png``: one layer and head, every query;
- ``grid.png``: layers x heads, every query;
- ``query_<token>.png``: per layer, the chosen token's row in every head.

Attention weights show what a head mixes in, which is evidence of association,
not an explanation of the model's output; one head or layer proves nothing.
"""

from __future__ import annotations

import sys

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
            top: int = 3, model=None, tokenizer=None, file=None) -> dict:
    """Print what ``token`` attends to in every layer of ``model`` (default: the packaged MiniLM).

    Parameters
    ----------
    text : str
    token : str
        A word of ``text`` (case-insensitive; a word split into pieces is
        represented by its first piece).
    occurrence : int, default 1
        Which occurrence of ``token``, counting from 1.
    layer : int, optional
        Layer of the single heatmap, from 0 (default: the last).
    head : int, optional
        Head of the single heatmap (default: the strongest head for the token there).
    top : int, default 3
        Keys listed per layer.
    model, tokenizer : optional
        A model running with ``attn_implementation="graphattn"`` and its
        tokenizer (default: :func:`graphattn.interop.hf.load_minilm`).
    file : file-like, optional
        Where to print (default: ``sys.stdout``).

    Returns
    -------
    dict
        ``tokens`` (list of str), ``query`` (int position), ``truncated``
        (bool), ``weights`` (Tensor (layers, H, N, N), queries on rows),
        ``layers``: per layer a dict with ``mean`` (top keys of the
        head-averaged row) and ``head``/``head_top`` (the head with the
        largest single weight and its top keys), each key a
        ``(position, token, weight)`` triple; ``layer``/``head`` of the single
        heatmap.

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
    return {"tokens": tokens, "query": query, "truncated": truncated, "weights": weights, "layers": summary,
            "layer": layer, "head": head}
