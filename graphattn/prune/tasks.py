"""Labelled retrieval tasks from the offline docs, scored with ``ranx``, with paired bootstrap intervals.

Fidelity to dense attention (cosine, Spearman) is a proxy; these tasks ask
whether a sparse model still *retrieves the right passage*. Two tasks, both
built from ``pydoc_data.topics`` with nothing to download:

- :func:`title_retrieval` (the default): each topic's title (its heading,
  ``The "assert" statement``) is a query; the topic's prose chunks are its
  relevant documents, among the chunks of every topic;
- :func:`first_sentence`: a chunk's first sentence is the query, the rest of
  the same chunk its one relevant document (more queries, hence more power);
  it also works on a user's own passages.

:func:`evaluate` scores a query-document similarity matrix with ``ranx``
(``R@1`` is ranx's ``hit_rate@1``: 1 when the top document is relevant, which
is recall@1 when a query has one relevant document; ``MRR``; ``nDCG@10``),
per query, so that :func:`paired_ci` can bootstrap the difference of two
models on the same queries (``scipy.stats.bootstrap`` with ``paired=True``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from graphattn.prune import corpus

__all__ = ["Task", "TASKS", "METRICS", "title_retrieval", "first_sentence", "make_task", "evaluate", "paired_ci"]

TASKS = ("title-retrieval", "first-sentence", "none")
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
    """

    name: str
    queries: list[str]
    documents: list[str]
    relevant: list[list[int]]
    dropped: dict = field(default_factory=dict)

    def qrels(self) -> dict[str, dict[str, int]]:
        """The relevance judgements in ranx's dict form, ``{"q0": {"d3": 1, ...}, ...}``."""
        return {f"q{q}": {f"d{d}": 1 for d in docs} for q, docs in enumerate(self.relevant)}


def title_retrieval(tokenizer, max_length: int = 128, docs_per_topic: int | None = 1,
                    limit: int | None = None) -> Task:
    """Topic titles as queries, each topic's chunks as its relevant documents.

    Parameters
    ----------
    tokenizer : transformers tokenizer
    max_length : int, default 128
        Most tokens per document chunk (:func:`graphattn.prune.corpus.pydoc_chunks`).
    docs_per_topic : int or None, default 1
        Chunks kept per topic, evenly spaced over it (None: all); with one, ``R@1`` is recall at 1.
    limit : int, optional
        Number of topics (queries), evenly spaced over the sorted topics (default: all 78 distinct ones).
    """
    from pydoc_data.topics import topics

    chunks = corpus.pydoc_chunks(tokenizer, max_length)
    usable = [t for t in chunks if chunks[t]]
    chosen = corpus.select_evenly(usable, limit)
    queries, documents, relevant, index = [], [], [], {}
    dropped = {"duplicates": 0, "topics_repeated_or_without_prose": len(topics) - len(usable)}
    for topic in chosen:
        docs = []
        for text in corpus.select_evenly(chunks[topic], docs_per_topic):
            if text in index:
                dropped["duplicates"] += 1
                continue
            index[text] = len(documents)
            documents.append(text)
            docs.append(index[text])
        if docs:
            queries.append(topics[topic].strip().split("\n")[0].strip())
            relevant.append(docs)
    return Task("title-retrieval", queries, documents, relevant, dropped)


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
    pairs = corpus.select_evenly(pairs, limit)
    return Task("first-sentence", [q for q, _ in pairs], [d for _, d in pairs], [[i] for i in range(len(pairs))],
                dropped)


def make_task(name: str, tokenizer, max_length: int = 128, limit: int | None = None,
              passages: list[str] | None = None, docs_per_topic: int | None = 1) -> Task:
    """The task ``name`` (:data:`TASKS`) on the pydoc corpus, or on ``passages`` when given.

    ``limit`` counts queries (topics for ``title-retrieval``); for ``none``, documents.

    Raises
    ------
    ValueError
        For an unknown task, ``title-retrieval`` with ``passages`` (they carry no titles), or fewer than 3 documents.
    """
    if name not in TASKS:
        raise ValueError(f"Expected 'task' to be one of {', '.join(TASKS)} (got {name!r})")
    if name == "title-retrieval":
        if passages is not None:
            raise ValueError("Expected 'task' to be first-sentence or none with your own passages "
                             "(got title-retrieval, which needs the pydoc topics' titles)")
        task = title_retrieval(tokenizer, max_length, docs_per_topic, limit)
    else:
        if passages is None:
            passages = corpus.pydoc_passages(tokenizer, max_length)
        if name == "first-sentence":
            task = first_sentence(passages, limit)
        else:
            documents, dropped = corpus.clean_passages(passages, 1)
            task = Task("none", [], corpus.select_evenly(documents, limit), [], dropped)
    if len(task.documents) < 3:
        raise ValueError(f"Expected at least 3 documents for task {name!r} (got {len(task.documents)})")
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
    import warnings

    from ranx import evaluate as ranx_evaluate

    query_emb, doc_emb = np.asarray(query_emb, dtype=np.float64), np.asarray(doc_emb, dtype=np.float64)
    sims = query_emb @ doc_emb.T  # (Q, F) · (F, N) -> (Q, N)
    docs = [f"d{d}" for d in range(sims.shape[1])]
    run = {f"q{q}": dict(zip(docs, row.tolist())) for q, row in enumerate(sims)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numba's type-safety notes inside ranx
        # plain dicts in (ranx's Qrels/Run objects build numba typed dicts, which compile for seconds per process)
        scores = ranx_evaluate(task.qrels(), run, list(METRICS.values()), return_mean=False)
    return {col: np.asarray(scores[name], dtype=np.float64) for col, name in METRICS.items()}


def paired_ci(reference: np.ndarray, other: np.ndarray, seed: int = 0, resamples: int = 2000,
              level: float = 0.95) -> tuple[float, float, float]:
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
    res = bootstrap((reference, other), lambda a, b, axis=-1: (b - a).mean(axis=axis), paired=True,
                    vectorized=True, n_resamples=resamples, confidence_level=level, method="percentile",
                    rng=np.random.default_rng(seed))
    return mean, float(res.confidence_interval.low), float(res.confidence_interval.high)
