"""Labelled retrieval tasks from the offline docs, scored with ``ranx``, with paired bootstrap intervals.

Fidelity to dense attention (cosine, Spearman) is a proxy; these tasks ask
whether a sparse model still *retrieves the right passage*. Three tasks, all
built from ``pydoc_data.topics`` with nothing to download:

- :func:`first_sentence` (the default): a chunk's first sentence is the query,
  the rest of the same chunk its one relevant document (hundreds of queries,
  hence narrow intervals; the query's words are not copied into the document);
  it also works on a user's own passages;
- :func:`title_retrieval`: each topic's title (its heading, ``The "assert"
  statement``) is a query; the topic's first chunk, its defining paragraph, is
  the relevant document (an easy task: BM25 alone does well);
- ``title-nonfirst`` (:func:`title_retrieval` with ``nonfirst=True``): the
  relevant chunk is one after the first, which rarely repeats the title.

Each :class:`Task` carries its ``construction`` (printed with the table).
:func:`evaluate` scores a query-document similarity matrix with ``ranx``
(``R@1`` is ranx's ``hit_rate@1``: 1 when the top document is relevant, which
is recall@1 when a query has one relevant document; ``MRR``; ``nDCG@10``),
per query, so that :func:`paired_ci` can bootstrap the difference of two
models on the same queries (``scipy.stats.bootstrap`` with ``paired=True``);
:func:`bm25` is the lexical baseline (``bm25s``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from graphattn.prune import corpus
from graphattn.validate import message

__all__ = [
    "Task",
    "TASKS",
    "METRICS",
    "title_retrieval",
    "first_sentence",
    "make_task",
    "evaluate",
    "evaluate_scores",
    "bm25",
    "paired_ci",
]

TASKS = ("first-sentence", "title-retrieval", "title-nonfirst", "none")
METRICS = {"R@1": "hit_rate@1", "MRR": "mrr", "nDCG@10": "ndcg@10"}  # column -> ranx metric


@dataclass
class Task:
    """Queries, documents and which documents answer which query.

    Attributes
    ----------
    name : str
        ``title-retrieval``, ``first-sentence`` or ``none`` (documents only: fidelity, no task metric).
    queries : list of str
    documents : list of str
        Distinct texts (exact duplicates dropped).
    relevant : list of list of int
        ``relevant[q]``: indices into ``documents`` relevant to query q (at least one each).
    dropped : dict of str to int
        What input hygiene left out (duplicates, too-short texts, queries without a document).
    construction : str
        How the task was built, in one paragraph (printed with the table, stored in the outputs).
    """

    name: str
    queries: list[str]
    documents: list[str]
    relevant: list[list[int]]
    dropped: dict = field(default_factory=dict)
    construction: str = ""

    def qrels(self) -> dict[str, dict[str, int]]:
        """The relevance judgements in ranx's dict form, ``{"q0": {"d3": 1, ...}, ...}``."""
        return {f"q{q}": {f"d{d}": 1 for d in docs} for q, docs in enumerate(self.relevant)}


def title_retrieval(
    tokenizer, max_length: int = 128, docs_per_topic: int | None = 1, limit: int | None = None, nonfirst: bool = False
) -> Task:
    """Topic titles as queries, each topic's chunks as its relevant documents.

    Parameters
    ----------
    tokenizer : transformers tokenizer
    max_length : int, default 128
        Most tokens per document chunk (:func:`graphattn.prune.corpus.pydoc_chunks`).
    docs_per_topic : int or None, default 1
        Chunks kept per topic, evenly spaced over it (None: all); with one, ``R@1`` is recall at 1.
        With one, the kept chunk is the topic's first: its defining paragraph, an easy target.
    limit : int, optional
        Number of topics (queries), evenly spaced over the sorted topics (default: all 78 distinct ones).
    nonfirst : bool, default False
        The harder variant (``title-nonfirst``): the relevant chunk is the middle one of the topic's chunks
        after the first (never the defining paragraph); topics of one chunk are dropped.
    """
    from pydoc_data.topics import topics

    chunks = corpus.pydoc_chunks(tokenizer, max_length)
    usable = [t for t in chunks if len(chunks[t]) > int(nonfirst)]
    chosen = corpus.select_evenly(usable, limit)
    queries, documents, relevant, index = [], [], [], {}
    dropped = {"duplicates": 0, "topics_repeated_or_without_prose": len(topics) - len(chunks)}
    if nonfirst:
        dropped["topics_of_one_chunk"] = len(chunks) - len(usable)
    for topic in chosen:
        docs = []
        pool = chunks[topic][1:] if nonfirst else chunks[topic]
        picked = (
            [pool[len(pool) // 2]] if nonfirst and docs_per_topic == 1 else corpus.select_evenly(pool, docs_per_topic)
        )
        for text in picked:
            if text in index:
                dropped["duplicates"] += 1
                continue
            index[text] = len(documents)
            documents.append(text)
            docs.append(index[text])
        if docs:
            queries.append(topics[topic].strip().split("\n")[0].strip())
            relevant.append(docs)
    verbatim = sum(any(q.lower() in documents[d].lower() for d in docs) for q, docs in zip(queries, relevant))
    which = (
        "the middle chunk after the first (not the defining paragraph)"
        if nonfirst
        else "the first chunk (the topic's defining paragraph)"
        if docs_per_topic == 1
        else f"{docs_per_topic or 'all'} chunks evenly spaced"
    )
    construction = (
        f"{'title-nonfirst' if nonfirst else 'title-retrieval'}: {len(queries)} queries, each a topic "
        f"title of the Python reference (pydoc_data.topics, its heading line); relevant: {which} of "
        f"<= {max_length} tokens; candidates: the {len(documents)} chosen chunks of all topics; "
        f"the title occurs verbatim (case-insensitive) in a relevant document for {verbatim} of "
        f"{len(queries)} queries"
    )
    return Task(
        "title-nonfirst" if nonfirst else "title-retrieval", queries, documents, relevant, dropped, construction
    )


def first_sentence(passages: list[str], limit: int | None = None) -> Task:
    """Each passage's first sentence as the query, the rest of the passage as its one relevant document.

    Passages without a second sentence, or whose rest has fewer than
    :data:`graphattn.prune.corpus.MIN_LINE_WORDS` words, are dropped
    (counted in ``dropped["no_second_sentence"]``), as are repeated queries or documents.
    """
    pairs, seen = [], set()
    dropped = {"no_second_sentence": 0, "duplicates": 0}
    for text in passages:
        parts = corpus.sentences(text)
        head, rest = parts[0], " ".join(parts[1:])
        if len(parts) < 2 or len(rest.split()) < corpus.MIN_LINE_WORDS:
            dropped["no_second_sentence"] += 1
        elif head in seen or rest in seen:
            dropped["duplicates"] += 1
        else:
            seen.update((head, rest))
            pairs.append((head, rest))
    usable = len(pairs)
    pairs = corpus.select_evenly(pairs, limit)
    construction = (
        f"first-sentence: {len(pairs)} passages, evenly spaced over the {usable} usable ones (of "
        f"{len(passages)} given), each split after its first sentence; the first sentence is the "
        f"query, the rest of the same passage (the query sentence removed) its one relevant document "
        f"among the {len(pairs)} rests"
    )
    return Task(
        "first-sentence",
        [q for q, _ in pairs],
        [d for _, d in pairs],
        [[i] for i in range(len(pairs))],
        dropped,
        construction,
    )


def make_task(
    name: str,
    tokenizer,
    max_length: int = 128,
    limit: int | None = None,
    passages: list[str] | None = None,
    docs_per_topic: int | None = 1,
) -> Task:
    """The task ``name`` (:data:`TASKS`) on the pydoc corpus, or on ``passages`` when given.

    ``limit`` counts queries (topics for ``title-retrieval``); for ``none``, documents.

    Raises
    ------
    ValueError
        For an unknown task, ``title-retrieval`` with ``passages`` (they carry no titles), or fewer than 3 documents.
    """
    if name not in TASKS:
        raise ValueError(message("task", f"one of {', '.join(TASKS)}", name))
    if name.startswith("title"):
        if passages is not None:
            raise ValueError(
                message(
                    "task",
                    "first-sentence or none with your own passages",
                    f"{name}, which needs the pydoc topics' titles",
                )
            )
        task = title_retrieval(tokenizer, max_length, docs_per_topic, limit, nonfirst=name == "title-nonfirst")
    else:
        if passages is None:
            passages = corpus.pydoc_passages(tokenizer, max_length)
        if name == "first-sentence":
            task = first_sentence(passages, limit)
        else:
            documents, dropped = corpus.clean_passages(passages, 1)
            documents = corpus.select_evenly(documents, limit)
            task = Task(
                "none",
                [],
                documents,
                [],
                dropped,
                f"none: {len(documents)} documents, no queries; fidelity to dense attention only",
            )
    if len(task.documents) < 3:
        raise ValueError(message("task", f"at least 3 documents for {name!r}", len(task.documents), verb="yield"))
    return task


def evaluate(task: Task, query_emb, doc_emb) -> dict[str, np.ndarray]:
    """Per-query ``R@1``, ``MRR`` and ``nDCG@10`` of cosine retrieval, computed by ``ranx``.

    Parameters
    ----------
    task : Task
    query_emb : Tensor or ndarray, shape (Q, F)
    doc_emb : Tensor or ndarray, shape (N, F)
        Unit-norm rows (so the dot product is the cosine).

    Returns
    -------
    dict of str to ndarray, shape (Q,)
        Keys :data:`METRICS`, each in [0, 1], in the order of ``task.queries``.
    """
    query_emb, doc_emb = np.asarray(query_emb, dtype=np.float64), np.asarray(doc_emb, dtype=np.float64)
    return evaluate_scores(task, query_emb @ doc_emb.T)  # (Q, F) · (F, N) -> (Q, N)


def evaluate_scores(task: Task, sims) -> dict[str, np.ndarray]:
    """Per-query :data:`METRICS` of any query-document score matrix ``sims (Q, N)`` (higher = more relevant)."""
    import warnings

    from ranx import evaluate as ranx_evaluate

    sims = np.asarray(sims, dtype=np.float64)
    docs = [f"d{d}" for d in range(sims.shape[1])]
    run = {f"q{q}": dict(zip(docs, row.tolist())) for q, row in enumerate(sims)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numba's type-safety notes inside ranx
        # plain dicts in (ranx's Qrels/Run objects build numba typed dicts, which compile for seconds per process)
        scores = ranx_evaluate(task.qrels(), run, list(METRICS.values()), return_mean=False)
    return {col: np.asarray(scores[name], dtype=np.float64) for col, name in METRICS.items()}


def bm25(task: Task) -> dict[str, np.ndarray]:
    """Per-query :data:`METRICS` of BM25 on the task (``bm25s`` at its defaults: Lucene's variant, k1 = 1.5,
    b = 0.75, lower case, English stop words, no stemming): the lexical baseline a model should beat.
    """
    import bm25s

    queries = bm25s.tokenize(task.queries, stopwords="en", show_progress=False, return_ids=False)
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(task.documents, stopwords="en", show_progress=False), show_progress=False)
    sims = np.stack([retriever.get_scores(q) if q else np.zeros(len(task.documents)) for q in queries])  # (Q, N)
    return evaluate_scores(task, sims)


def paired_ci(
    reference: np.ndarray, other: np.ndarray, seed: int = 0, resamples: int = 2000, level: float = 0.95
) -> tuple[float, float, float]:
    """Mean of ``other - reference`` over paired items and its bootstrap confidence interval.

    ``scipy.stats.bootstrap`` with ``paired=True`` (the items, e.g. queries,
    are resampled together for both), percentile method, a seeded generator.

    Returns
    -------
    (mean, low, high) : floats
        ``low == high == mean`` when every difference is the same (nothing to resample).
    """
    from scipy.stats import bootstrap

    reference, other = np.asarray(reference, dtype=np.float64), np.asarray(other, dtype=np.float64)
    diff = other - reference
    mean = float(diff.mean()) if diff.size else float("nan")
    if diff.size < 2 or np.all(diff == diff[0]):
        return mean, mean, mean
    res = bootstrap(
        (reference, other),
        lambda a, b, axis=-1: (b - a).mean(axis=axis),
        paired=True,
        vectorized=True,
        n_resamples=resamples,
        confidence_level=level,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return mean, float(res.confidence_interval.low), float(res.confidence_interval.high)
