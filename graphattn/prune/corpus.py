"""Real English passages for the experiments: the Python reference documentation.

Every CPython ships the text of its language reference in
``pydoc_data.topics.topics`` (79 topics, about 465k characters), so the
experiments run offline on real prose with nothing to download. This module
turns it into passages of at most ``max_length`` tokens of a given tokenizer,
and reads a user's own passages from a text file, one per line.

Steps (:func:`pydoc_passages`):

1) split each topic into paragraphs (blank lines) and keep the prose: not
   indented (indented blocks are code and grammar), not a table, heading
   underlines removed, at least ``MIN_WORDS`` words, at least 80% letters
   and spaces;
2) split the prose into sentences and pack consecutive sentences of one topic
   into chunks of at most ``max_length`` tokens, counted with the tokenizer
   *including* its special tokens ([CLS] and [SEP] for BERT); a sentence that
   alone is too long is cut at word boundaries;
3) select ``limit`` chunks evenly spaced over the whole corpus (topics in
   sorted order), so a small sample still covers many topics. Deterministic:
   the same tokenizer, ``max_length`` and ``limit`` give the same passages.
"""

from __future__ import annotations

import os
import re

from graphattn.validate import message

__all__ = [
    "DEFAULT_LIMIT",
    "CHARS_PER_TOKEN",
    "MIN_WORDS",
    "MIN_LINE_WORDS",
    "pydoc_paragraphs",
    "chunk_text",
    "cut",
    "pydoc_chunks",
    "pydoc_passages",
    "read_passages",
    "select_evenly",
    "clean_passages",
    "sentences",
]

DEFAULT_LIMIT = 48  # passages ``graphattn prune`` samples by default
CHARS_PER_TOKEN = 20  # a WordPiece token of English is ~4-5 characters: 20 leaves a wide margin
MIN_WORDS = 8  # shorter paragraphs are mostly captions and list fragments
MIN_LINE_WORDS = 4  # a line of --text with fewer words is dropped: too short to say anything about attention
_UNDERLINE = re.compile(r"^[*=\-~^\"]{3,}$")
_SENTENCE_END = re.compile(r"(?<=[.!?:])\s+(?=[A-Z\"(])")


def pydoc_paragraphs() -> list[tuple[str, str]]:
    """Prose paragraphs of the Python reference, as ``(topic, text)`` in a fixed order.

    Returns
    -------
    list of (str, str)
        Topics in sorted order, paragraphs in document order; each text is one
        line with runs of whitespace collapsed to one space.
    """
    from pydoc_data.topics import topics

    out = []
    for topic in sorted(topics):
        for block in re.split(r"\n\s*\n", topics[topic]):
            lines = [ln for ln in block.split("\n") if ln.strip()]
            if not lines or lines[0].startswith((" ", "\t")):  # code, grammar, indented lists
                continue
            if any(ln.lstrip().startswith(("+-", "+=", "|")) for ln in lines):  # tables
                continue
            lines = [ln for ln in lines if not _UNDERLINE.match(ln.strip())]  # heading underlines
            text = " ".join(" ".join(lines).split())
            letters = sum(ch.isalpha() or ch == " " for ch in text)
            if len(text.split()) >= MIN_WORDS and letters >= 0.8 * len(text):  # prose, not symbols
                out.append((topic, text))
    return out


def _count(tokenizer, texts: list[str]) -> list[int]:
    """Tokens per text, special tokens included."""
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=True, verbose=False)["input_ids"]]


def chunk_text(sentences: list[str], tokenizer, max_length: int) -> list[str]:
    """Pack consecutive sentences into chunks of at most ``max_length`` tokens.

    Parameters
    ----------
    sentences : list of str
        In reading order.
    tokenizer : transformers tokenizer
        Counts tokens, special tokens included.
    max_length : int
        Most tokens per chunk, including special tokens; at least 8.

    Returns
    -------
    list of str
        Every chunk tokenizes to at most ``max_length`` tokens. A sentence
        longer than that is cut at word boundaries (a single word longer than
        the budget is dropped).

    Raises
    ------
    ValueError
        If ``max_length`` < 8.
    """
    if max_length < 8:
        raise ValueError(message("max_length", "at least 8 tokens", max_length))
    special = _count(tokenizer, [""])[0]  # [CLS] [SEP] -> 2
    budget = max_length - special
    pieces: list[str] = []
    for sentence, n in zip(sentences, _count(tokenizer, sentences)):
        if n <= max_length:
            pieces.append(sentence)
            continue
        words, start = sentence.split(), 0  # cut a long sentence greedily at word boundaries
        sizes = [n - special for n in _count(tokenizer, words)]
        while start < len(words):
            stop, used = start, 0
            while stop < len(words) and used + sizes[stop] <= budget:
                used, stop = used + sizes[stop], stop + 1
            if stop == start:  # one word over budget: drop it
                start += 1
                continue
            pieces.append(" ".join(words[start:stop]))
            start = stop
    chunks: list[str] = []
    current: list[str] = []
    used = 0
    for piece, n in zip(pieces, _count(tokenizer, pieces)):
        n -= special  # WordPiece splits on whitespace first, so counts of pieces add up
        if current and used + n > budget:
            chunks.append(" ".join(current))
            current, used = [], 0
        current.append(piece)
        used += n
    if current:
        chunks.append(" ".join(current))
    # guard the additivity assumption for tokenizers that merge across spaces
    return [c for c, n in zip(chunks, _count(tokenizer, chunks)) if n <= max_length]


def cut(texts: list[str], max_length: int) -> list[str]:
    """Each text cut to ``CHARS_PER_TOKEN * max_length`` characters, so that nothing tokenizes a huge text whole.

    The tokenizer truncates to ``max_length`` tokens afterwards; a token is far shorter than
    ``CHARS_PER_TOKEN`` characters, so the cut never changes the tokens kept.

    Examples
    --------
    >>> [len(t) for t in cut(["a" * 1000, "b"], max_length=8)]
    [160, 1]
    """
    cap = CHARS_PER_TOKEN * max_length
    return [t[:cap] for t in texts]


def select_evenly(items: list, limit: int | None) -> list:
    """``limit`` items at evenly spaced positions (all of them when ``limit`` is None or larger).

    Examples
    --------
    >>> select_evenly(list(range(10)), 4)
    [0, 2, 5, 7]
    """
    if limit is None or limit >= len(items):
        return list(items)
    if limit < 1:
        raise ValueError(message("limit", "a positive int", limit))
    return [items[k * len(items) // limit] for k in range(limit)]


def sentences(text: str) -> list[str]:
    """``text`` split at sentence ends (``.``, ``!``, ``?``, ``:`` followed by a capital or a quote).

    Examples
    --------
    >>> sentences("One two. Three four? five")
    ['One two.', 'Three four? five']
    """
    return _SENTENCE_END.split(text)


def clean_passages(lines: list[str], min_words: int = MIN_LINE_WORDS) -> tuple[list[str], dict[str, int]]:
    """Drop exact duplicates (the later copies) and passages of fewer than ``min_words`` words.

    Returns
    -------
    kept : list of str
        In their order.
    dropped : dict of str to int
        ``{"duplicates": ..., "too_short": ...}``, how many of each were dropped.

    Examples
    --------
    >>> clean_passages(["a b c d", "a b", "a b c d"])
    (['a b c d'], {'duplicates': 1, 'too_short': 1})
    """
    kept, seen, dropped = [], set(), {"duplicates": 0, "too_short": 0}
    for line in lines:
        if len(line.split()) < min_words:
            dropped["too_short"] += 1
        elif line in seen:
            dropped["duplicates"] += 1
        else:
            seen.add(line)
            kept.append(line)
    return kept, dropped


def pydoc_chunks(tokenizer, max_length: int = 128) -> dict[str, list[str]]:
    """Each topic's prose as chunks of at most ``max_length`` tokens (steps 1-2), topics in sorted order.

    A topic whose text repeats an earlier one (``else`` is ``if``) is left out.
    """
    from pydoc_data.topics import topics

    first_of = {}
    for topic in sorted(topics):
        first_of.setdefault(topics[topic], topic)
    by_topic: dict[str, list[str]] = {}
    for topic, text in pydoc_paragraphs():
        if first_of[topics[topic]] == topic:
            by_topic.setdefault(topic, []).extend(sentences(text))
    return {topic: chunk_text(parts, tokenizer, max_length) for topic, parts in by_topic.items()}


def pydoc_passages(tokenizer, max_length: int = 128, limit: int | None = None) -> list[str]:
    """Passages of the Python reference documentation, each at most ``max_length`` tokens.

    Parameters
    ----------
    tokenizer : transformers tokenizer
        The model's tokenizer; token counts include its special tokens.
    max_length : int
        Most tokens per passage (default 128), at least 8.
    limit : int, optional
        Number of passages, evenly spaced over the corpus (default: all).

    Returns
    -------
    list of str
        Deterministic for a given tokenizer, ``max_length`` and ``limit``.

    Raises
    ------
    ValueError
        If ``max_length`` < 8 or ``limit`` < 1.
    """
    chunks = [c for parts in pydoc_chunks(tokenizer, max_length).values() for c in parts]
    return select_evenly(clean_passages(chunks, 1)[0], limit)


def read_passages(
    path: str | os.PathLike, limit: int | None = None, max_length: int | None = None, *, dropped: dict | None = None
) -> list[str]:
    """A user's passages from a UTF-8 text file, one per line (blank lines, exact duplicates and lines of
    fewer than ``MIN_LINE_WORDS`` words skipped, see :func:`clean_passages`).

    Parameters
    ----------
    path : str or PathLike
    limit : int, optional
        Number of passages, evenly spaced over the file's lines (default: all).
    max_length : int, optional
        The experiment's token budget: each line is cut to
        ``CHARS_PER_TOKEN * max_length`` characters before anything tokenizes
        it (the tokenizer truncates the rest to ``max_length`` tokens), so a
        huge one-line file is never tokenized whole. Default: no cut.
    dropped : dict, optional
        Receives ``{"duplicates": n, "too_short": m}``, the lines left out.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the file holds no non-blank line, or ``limit`` < 1.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(
            message("--text", "a text file with one passage per line", f"{str(path)!r}: no such file", verb="name")
        )
    cap = None if max_length is None else CHARS_PER_TOKEN * max_length
    with open(path, encoding="utf-8") as f:
        lines = [" ".join(line[:cap].split()) for line in f]
    lines = [line for line in lines if line]
    if not lines:
        raise ValueError(message("--text", "at least one non-blank line", f"none in {str(path)!r}", verb="hold"))
    lines, counts = clean_passages(lines)
    if dropped is not None:
        dropped.update(counts)
    return select_evenly(lines, limit)
