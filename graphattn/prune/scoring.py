"""Scoring a row against the eager reference: task metrics with paired intervals, p-values and changed queries,
fidelity, the spread over seeds, the Holm correction across a table, and the BM25 row.

For each task metric ``m`` (``R@1``, ``MRR``, ``nDCG@10``, or ``nll`` for a causal LM) a row gets
``m`` (its mean), ``m_delta`` (mean of row minus reference over the same queries), ``m_lo``/``m_hi`` (paired
bootstrap 95 % interval, :func:`graphattn.prune.tasks.paired_ci`), ``m_p`` (two-sided paired sign-flip
p-value, :func:`graphattn.prune.stats.sign_flip_test`), ``m_changed`` (queries whose score changed) and,
after :func:`holm_adjust`, ``m_p_holm`` (Holm-Bonferroni across the table's comparisons with dense).
Rows with a random draw also get ``m_seed_mean``, ``m_seed_sd`` and ``seed_runs`` (:func:`over_seeds`).
"""

from __future__ import annotations

import numpy as np
import torch

from graphattn.prune import metrics, stats, tasks

__all__ = ["score", "paired", "over_seeds", "holm_adjust", "bm25_row", "headline"]


def headline(row: dict) -> str | None:
    """The metric a row leads with: ``nll`` for a causal LM, else ``MRR``, else None (fidelity only)."""
    return "nll" if "nll" in row else ("MRR" if "MRR" in row else None)


def paired(row: dict, name: str, reference, values, seed: int, resamples: int) -> None:
    """``name_delta``, ``name_lo``, ``name_hi``, ``name_p``, ``name_changed`` of ``values`` against ``reference``."""
    reference = torch.as_tensor(reference).double().numpy()
    values = torch.as_tensor(values).double().numpy()
    finite = np.isfinite(reference) & np.isfinite(values)  # NaN-free pairs (one-token texts have no NLL)
    reference, values = reference[finite], values[finite]
    row[f"{name}_delta"], row[f"{name}_lo"], row[f"{name}_hi"] = tasks.paired_ci(reference, values, seed, resamples)
    row[f"{name}_p"], row[f"{name}_changed"] = stats.sign_flip_test(reference, values, seed)


def score(results, task, current, reference, seed: int, resamples: int) -> None:
    """Task metrics with paired statistics against the reference, fidelity, per-query and per-passage rows."""
    (emb, nll), (ref, ref_nll) = current, reference
    row, nq = results[-1], len(task.queries)
    docs, ref_docs = emb[nq:], ref[nq:]  # (N, F)
    cos = metrics.cosine_similarity(docs, ref_docs)  # (N,)
    row["spearman"], row["top1"] = metrics.retrieval_fidelity(ref_docs, docs)
    row.update(cos_mean=float(cos.mean()), cos_min=float(cos.min()))
    passage = [{"pattern": row["pattern"], "document": d, "cos": float(c)} for d, c in enumerate(cos)]
    if nll is not None:
        row["nll"] = float(nll[nq:].nanmean())
        paired(row, "nll", ref_nll[nq:], nll[nq:], seed, resamples)
        for p, value in zip(passage, nll[nq:].tolist()):
            p["nll"] = value
    results.per_passage += passage
    if not nq:
        return
    if "reference_scores" not in results.meta:
        results.meta["reference_scores"] = tasks.evaluate(task, ref[:nq], ref_docs)
    ref_scores, scores = results.meta["reference_scores"], tasks.evaluate(task, emb[:nq], docs)
    for name, values in scores.items():
        row[name] = float(values.mean())
        paired(row, name, ref_scores[name], values, seed, resamples)
    results.per_query += [
        {"pattern": row["pattern"], "query": q, **{m: float(v[q]) for m, v in scores.items()}} for q in range(nq)
    ]


def over_seeds(results, task, again: list, reference) -> None:
    """The last row's headline metric over its own draw and ``again`` (``[(name, (emb, nll)), ...]``, the
    same spec with other seeds): ``m_seed_mean``, ``m_seed_sd`` (sample standard deviation), ``seed_runs``;
    the other draws' per-query (or per-passage) scores join the tables under their own names.
    """
    row = results[-1]
    metric, nq = headline(row) or "cos_mean", len(task.queries)
    values = [row[metric]]
    for name, (emb, nll) in again:
        if metric == "nll":
            values.append(float(nll[nq:].nanmean()))
            results.per_passage += [{"pattern": name, "document": d, "nll": v} for d, v in enumerate(nll[nq:].tolist())]
        elif metric == "MRR":
            scores = tasks.evaluate(task, emb[:nq], emb[nq:])
            values.append(float(scores["MRR"].mean()))
            results.per_query += [
                {"pattern": name, "query": q, **{m: float(v[q]) for m, v in scores.items()}} for q in range(nq)
            ]
        else:
            values.append(float(metrics.cosine_similarity(emb[nq:], reference[0][nq:]).mean()))
    if again:
        row[f"{metric}_seed_mean"] = float(np.mean(values))
        row[f"{metric}_seed_sd"] = float(np.std(values, ddof=1))
        row["seed_runs"] = " ".join([row["pattern"], *(name for name, _ in again)])


def holm_adjust(results) -> None:
    """``m_p_holm`` on every row but dense: Holm-Bonferroni over the table's comparisons with dense, per metric."""
    for key in [k for k in results[0] if k.endswith("_p")]:
        adjusted = stats.holm([r.get(key, float("nan")) for r in results[1:]])
        for row, value in zip(results[1:], adjusted.tolist()):
            row[f"{key}_holm"] = value


def bm25_row(results, task, seed: int, resamples: int) -> None:
    """Append the BM25 baseline (:func:`graphattn.prune.tasks.bm25`) as a row, compared with dense like the others
    (not counted in the Holm family: it is not a pruning).
    """
    scores = tasks.bm25(task)
    dense = {m: np.array([q[m] for q in results.per_query if q["pattern"] == results[0]["pattern"]]) for m in scores}
    row = {
        "pattern": "bm25",
        "family": "lexical baseline",
        "spec": "bm25s defaults",
        "budget_of": "",
        "realisable": None,
        "cost_note": "lexical baseline (bm25s), no model",
    }
    for name, values in scores.items():
        row[name] = float(values.mean())
        paired(row, name, dense[name], values, seed, resamples)
    results.append(row)
    results.per_query += [
        {"pattern": "bm25", "query": q, **{m: float(v[q]) for m, v in scores.items()}} for q in range(len(task.queries))
    ]
