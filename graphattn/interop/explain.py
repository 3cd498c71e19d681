"""What one token attends to in a real model, per layer and head (the library side of ``graphattn explain``).

:func:`explain` runs all-MiniLM-L6-v2 with graph attention
(:mod:`graphattn.interop.hf`) and prints, for every layer, the keys the chosen
token reads most (weights averaged over the heads, and in the head with the
largest single weight). :func:`compare` runs two sentences that differ in a
word and prints, per layer, what the token gives to chosen keys in each
(:func:`key_table`). The commands

    graphattn explain "The animal didn't cross the street because it was too tired." --token it
    graphattn explain "... too tired." --token it --compare "... too wide." --keys animal street [CLS]

also write PNG files, queries (or layers) on rows and keys on columns (drawn
by :mod:`graphattn.cli.explain`, since :mod:`graphattn.viz` sits above interop).

Tokens: MiniLM's tokenizer is English-only (uncased WordPiece); a word it has
no piece for becomes ``[UNK]`` and is refused as ``--token``. A token that
occurs more than once is labelled by its position, ``the@7``
(:func:`token_labels`), and can be chosen that way.

Attention weights show what a head mixes in, which is evidence of association,
not an explanation of the model's output; one head or layer proves nothing.
"""

from __future__ import annotations

import difflib
import re
import sys
from collections import Counter

import torch

from graphattn.validate import message

__all__ = [
    "DEFAULT_OUT",
    "ENGLISH_ONLY",
    "compare",
    "explain",
    "find_token",
    "key_table",
    "locate",
    "token_labels",
    "top_keys",
]

DEFAULT_OUT = "explain-out"
ENGLISH_ONLY = "all-MiniLM-L6-v2 is English-only (uncased WordPiece)"
_AT = re.compile(r"^(?P<word>.+)@(?P<position>\d+)$")  # bank@4


def token_labels(tokens: list[str]) -> list[str]:
    """Tokens as printed and on figure ticks: a token that occurs more than once gets ``@position``.

    Examples
    --------
    >>> token_labels(["[CLS]", "the", "bank", "the", "[SEP]"])
    ['[CLS]', 'the@1', 'bank', 'the@3', '[SEP]']
    """
    counts = Counter(tokens)
    return [f"{t}@{i}" if counts[t] > 1 else t for i, t in enumerate(tokens)]


def find_token(
    tokens: list[str],
    word: str,
    pieces: list[str],
    occurrence: int | None = None,
    *,
    position: int | None = None,
    unk: str | None = "[UNK]",
    option: str = "--token",
) -> int:
    """Position of ``word`` in ``tokens`` (its first piece): the ``occurrence``-th match, or the one at ``position``.

    Parameters
    ----------
    tokens : list of str
        The sentence's tokens.
    word : str
        What the user typed, without ``@position`` (used in the messages).
    pieces : list of str
        ``word`` as the tokenizer splits it, e.g. ``["token", "##izer"]``.
    occurrence : int, optional
        1 for the first match (the default); not together with ``position``.
    position : int, optional
        The match that starts at this token position (as in the label ``bank@4``).
    unk : str or None, default "[UNK]"
        The tokenizer's unknown token: a word with a piece ``unk`` is refused
        (unless the word is ``unk`` itself); None: no check.
    option : str, default "--token"
        The option named in the messages.

    Raises
    ------
    ValueError
        If ``word`` is out of the vocabulary, not in the sentence (the message
        lists its tokens, labelled), occurs fewer than ``occurrence`` times,
        does not start at ``position``, or both ``occurrence`` and ``position`` are given.
    """
    label = word if position is None else f"{word}@{position}"
    if unk is not None and unk in pieces and word.strip() != unk:
        raise ValueError(
            message(
                option,
                "a word in the model's vocabulary",
                repr(label),
                f"the tokenizer turns it into {' '.join(pieces)}: {ENGLISH_ONLY}",
            )
        )
    if occurrence is not None and position is not None:
        raise ValueError(message(option, "chosen by WORD@POSITION or by --occurrence, not both", repr(label)))
    starts = [i for i in range(len(tokens) - len(pieces) + 1) if pieces and tokens[i : i + len(pieces)] == pieces]
    if not starts:
        raise ValueError(
            message(option, "a token of the sentence", repr(label), f"its tokens are: {' '.join(token_labels(tokens))}")
        )
    if position is not None:
        if position not in starts:
            raise ValueError(
                message(option, f"a position of {word!r}", repr(label), f"{word!r} is at {', '.join(map(str, starts))}")
            )
        return position
    occurrence = 1 if occurrence is None else occurrence
    if not 1 <= occurrence <= len(starts):
        raise ValueError(message("--occurrence", f"in [1, {len(starts)}] for {word!r}", occurrence))
    return starts[occurrence - 1]


def locate(tokens: list[str], spec: str, tokenizer, occurrence: int | None = None, option: str = "--token") -> int:
    """Position of ``spec`` (``"it"`` or ``"bank@4"``) in ``tokens``, split by ``tokenizer``; see :func:`find_token`."""
    match = _AT.match(spec.strip())
    word, position = (match["word"], int(match["position"])) if match else (spec, None)
    return find_token(
        tokens,
        word,
        tokenizer.tokenize(word),
        occurrence,
        position=position,
        unk=getattr(tokenizer, "unk_token", None),
        option=option,
    )


def top_keys(row, tokens: list[str], k: int) -> list[tuple[int, str, float]]:
    """The ``k`` largest weights of one query's row ``(S,)``: ``(position, token, weight)``, largest first."""
    values, index = row.topk(min(k, row.numel()))
    return [(int(j), tokens[int(j)], float(w)) for w, j in zip(values, index)]


def _run(text: str, model, tokenizer, file) -> tuple[list[str], torch.Tensor, bool]:
    """Tokens, dense weights ``(layers, H, N, N)`` and whether ``text`` was truncated to the model's limit."""
    from graphattn.interop.records import attention_records

    limit = min(int(getattr(model.config, "max_position_embeddings", 512)), 512)
    num_tokens = len(tokenizer(text, truncation=False)["input_ids"])
    truncated = num_tokens > limit
    if truncated:
        print(f"notice: the input has {num_tokens} tokens; truncated to the model's limit of {limit}", file=file)
    record = attention_records(model, tokenizer, text, max_length=limit)[0]
    return record.tokens, record.dense(), truncated  # dense: (layers, H, N, N)


def _rankings(weights: torch.Tensor, labels: list[str], query: int, top: int, file) -> list[dict]:
    """Print and return, per layer, the top keys of the head-averaged row and of the strongest head."""
    rows = weights[:, :, query, :]  # (layers, H, N): what the query reads
    fmt = lambda keys: ", ".join(f"{t} {w:.2f}" for _, t, w in keys)  # noqa: E731
    summary = []
    for ell in range(weights.size(0)):
        strongest = int(rows[ell].max(dim=1).values.argmax())
        mean_top = top_keys(rows[ell].mean(dim=0), labels, top)  # (N,) -> top
        head_top = top_keys(rows[ell, strongest], labels, top)
        everyone = float(weights[ell, strongest, :, head_top[0][0]].mean())  # every query -> that key
        summary.append({"mean": mean_top, "head": strongest, "head_top": head_top, "head_all_queries": everyone})
        print(
            f"layer {ell}  heads averaged: {fmt(mean_top)}  |  strongest head {strongest}: {fmt(head_top)} "
            f"(all queries -> {head_top[0][1]}: {everyone:.2f})",
            file=file,
        )
    return summary


def explain(
    text: str,
    token: str,
    *,
    occurrence: int | None = None,
    layer: int | None = None,
    head: int | None = None,
    top: int = 3,
    model=None,
    tokenizer=None,
    file=None,
) -> dict:
    """Print what ``token`` attends to in every layer of ``model`` (default: the packaged MiniLM).

    Parameters
    ----------
    text : str
    token : str
        A word of ``text`` (case-insensitive; a word split into pieces is
        represented by its first piece), or ``word@position`` for the token at
        that position (as printed for a repeated token). Words out of the
        vocabulary (MiniLM: English-only, uncased WordPiece) are refused.
    occurrence : int, optional
        Which occurrence of ``token``, counting from 1 (default 1).
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
        ``tokens`` (list of str), ``labels`` (:func:`token_labels`), ``query``
        (int position), ``truncated`` (bool), ``weights`` (Tensor (layers, H,
        N, N), queries on rows), ``layers``: per layer a dict with ``mean``
        (top keys of the head-averaged row), ``head``/``head_top`` (the head
        with the largest single weight and its top keys) and
        ``head_all_queries`` (that head's mean weight over all queries on its
        top key), each key a ``(position, label, weight)`` triple;
        ``layer``/``head`` of the single heatmap.

    Raises
    ------
    ValueError
        For an unknown or out-of-vocabulary token, or ``layer``/``head``/``occurrence``/``top`` out of range.
    """
    from graphattn.interop.hf import load_minilm

    file = sys.stdout if file is None else file
    if model is None or tokenizer is None:
        model, tokenizer = load_minilm()
    if top < 1:
        raise ValueError(message("--top", ">= 1", top))
    tokens, weights, truncated = _run(text, model, tokenizer, file)
    query = locate(tokens, token, tokenizer, occurrence)
    num_layers, heads = weights.shape[:2]
    layer = num_layers - 1 if layer is None else layer
    if not 0 <= layer < num_layers:
        raise ValueError(message("--layer", f"in [0, {num_layers - 1}]", layer))
    if head is not None and not 0 <= head < heads:
        raise ValueError(message("--head", f"in [0, {heads - 1}]", head))

    labels = token_labels(tokens)
    print(
        f"{labels[query]!r} (token {query} of {len(tokens)}) in {num_layers} layers x {heads} heads; "
        f"weights in [0, 1], each row sums to 1",
        file=file,
    )
    summary = _rankings(weights, labels, query, top, file)
    head = summary[layer]["head"] if head is None else head
    return {
        "tokens": tokens,
        "labels": labels,
        "query": query,
        "truncated": truncated,
        "weights": weights,
        "layers": summary,
        "layer": layer,
        "head": head,
    }


def sentence_names(tokens_a: list[str], tokens_b: list[str]) -> tuple[str, str]:
    """Short names of two sentences: the tokens in which they differ (``"tired"``, ``"wide"``), else A and B."""
    ops = difflib.SequenceMatcher(a=tokens_a, b=tokens_b, autojunk=False).get_opcodes()
    a = " ".join(t for tag, i0, i1, _, _ in ops if tag != "equal" for t in tokens_a[i0:i1])
    b = " ".join(t for tag, _, _, j0, j1 in ops if tag != "equal" for t in tokens_b[j0:j1])
    return (a, b) if a and b and a != b and max(len(a), len(b)) <= 20 else ("A", "B")


def key_table(query_label: str, names: tuple[str, str], keys: list[str], values: torch.Tensor) -> str:
    """The per-layer table as markdown: one row per layer, columns ``query -> key, sentence``.

    ``values`` has shape (layers, K, 2): head-averaged weight of the query on
    key k in each sentence. Weights are written with 3 decimals.
    """
    head = "| layer | " + " | ".join(f"{query_label} -> {k}, {n}" for k in keys for n in names) + " |"
    lines = [head, "|---" * (1 + 2 * len(keys)) + "|"]
    for ell, row in enumerate(values.tolist()):  # (K, 2) per layer
        lines.append(f"| {ell} | " + " | ".join(f"{w:.3f}" for pair in row for w in pair) + " |")
    return "\n".join(lines)


def _key_findings(a: dict, b: dict, names: tuple[str, str], keys: list[str], positions, file) -> list[dict]:
    """Print, per key, the single head whose weight on it changes most between the sentences."""
    found = []
    for k, (ja, jb) in zip(keys, positions):
        wa = a["weights"][:, :, a["query"], ja]  # (layers, H)
        wb = b["weights"][:, :, b["query"], jb]  # (layers, H)
        ell, h = divmod(int((wa - wb).abs().argmax()), wa.size(1))
        every = (float(a["weights"][ell, h, :, ja].mean()), float(b["weights"][ell, h, :, jb].mean()))
        found.append(
            {"key": k, "layer": ell, "head": h, "weights": (float(wa[ell, h]), float(wb[ell, h])), "all_queries": every}
        )
        print(
            f"largest change in one head, {a['labels'][a['query']]} -> {k}: layer {ell} head {h}, "
            f"{names[0]} {wa[ell, h]:.2f}, {names[1]} {wb[ell, h]:.2f} "
            f"(all queries -> {k}: {every[0]:.2f}, {every[1]:.2f})",
            file=file,
        )
    return found


def compare(
    text: str,
    other: str,
    token: str,
    *,
    keys: list[str] = (),
    occurrence: int | None = None,
    top: int = 3,
    model=None,
    tokenizer=None,
    file=None,
) -> dict:
    """Run two sentences, print what ``token`` reads in each, and the per-layer table for ``keys``.

    Prints :func:`explain`'s rankings for each sentence, then (with ``keys``)
    :func:`key_table`, the number of heads in which the first key gets more
    weight than the second, and per key the single head whose weight changes most.

    Parameters
    ----------
    text, other : str
        Two sentences with the same number of tokens (a minimal pair, e.g.
        "... too tired." and "... too wide."), so that their rows align key by key.
    token : str
        The query, as in :func:`explain` (looked up in each sentence).
    keys : list of str, default ()
        Keys of the table, each a word or ``word@position`` of both sentences.
    occurrence, top, model, tokenizer, file
        As in :func:`explain`.

    Returns
    -------
    dict
        ``runs`` (the two :func:`explain` results), ``names`` (two short
        names, :func:`sentence_names`), ``rows`` (Tensor (2, layers, N): the
        token's head-averaged row in each sentence), ``heads`` (Tensor (2,
        layers, H, N): its row in every head), ``keys``, ``table`` (Tensor
        (layers, K, 2)), ``markdown`` (the printed table), ``wins`` (heads in
        which key 0 beats key 1, per sentence, or None), ``changes`` (per key,
        the head of largest change).

    Raises
    ------
    ValueError
        If the sentences have different numbers of tokens, or for a token or
        key not in both (or out of the vocabulary).
    """
    from graphattn.interop.hf import load_minilm

    file = sys.stdout if file is None else file
    if model is None or tokenizer is None:
        model, tokenizer = load_minilm()
    runs = []
    for sentence in (text, other):
        print(f"sentence: {sentence}", file=file)
        runs.append(
            explain(sentence, token, occurrence=occurrence, top=top, model=model, tokenizer=tokenizer, file=file)
        )
    a, b = runs
    if len(a["tokens"]) != len(b["tokens"]):
        raise ValueError(
            message(
                "--compare",
                f"a sentence of {len(a['tokens'])} tokens, as TEXT",
                f"{len(b['tokens'])} tokens",
                "the two rows are compared key by key",
            )
        )
    names = sentence_names(a["tokens"], b["tokens"])
    rows = torch.stack([r["weights"][:, :, r["query"], :] for r in runs])  # (2, layers, H, N)
    result = {
        "runs": runs,
        "names": names,
        "rows": rows.mean(dim=2),
        "heads": rows,
        "keys": list(keys),
        "table": None,
        "markdown": "",
        "wins": None,
        "changes": [],
    }
    if not keys:
        return result
    positions = [tuple(locate(r["tokens"], k, tokenizer, option="--keys") for r in runs) for k in keys]
    index = torch.tensor(positions)  # (K, 2)
    table = torch.stack([result["rows"][s][:, index[:, s]] for s in range(2)], dim=-1)  # (layers, K, 2)
    query_label = a["labels"][a["query"]]
    result.update(table=table, markdown=key_table(query_label, names, list(keys), table))
    print(f"\nheads averaged, {query_label} -> key per layer:\n{result['markdown']}", file=file)
    if len(keys) >= 2:
        wins = tuple(int((rows[s, :, :, index[0, s]] > rows[s, :, :, index[1, s]]).sum()) for s in range(2))
        result["wins"] = wins
        print(
            f"heads (of {rows[0, :, :, 0].numel()}) in which {query_label} -> {keys[0]} > "
            f"{query_label} -> {keys[1]}: {names[0]} {wins[0]}, {names[1]} {wins[1]}",
            file=file,
        )
    result["changes"] = _key_findings(a, b, names, list(keys), positions, file)
    return result
