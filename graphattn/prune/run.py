"""The experiment: a real model, dense and then sparse in every layer, scored on a labelled task.

:func:`run_experiment` embeds a task's queries and documents
(:mod:`graphattn.prune.tasks`) once with Hugging Face's own eager attention,
the reference, and then once per pattern inside
:func:`graphattn.interop.hf.sparsity`, so that every attention layer is
:func:`graphattn.attention` on the kept edges only (queries and documents
alike; a causal model keeps its DAG, and the pattern is intersected with it).
Per layer the run is accounted by :class:`graphattn.prune.accounting.LayerRun`.

Rows: the dense graph first (the model's own graph through graph attention:
a self-check that it reproduces eager), then each spec; each fixed pattern is
followed by ``oracle(<pattern>)``, top-k of the dense weights with the
pattern's own per-query budget (the same number of edges, query by query);
for a task with queries, a last ``bm25`` row (the lexical baseline).

Columns (per row):

- task (headline; :mod:`graphattn.prune.scoring`): for a causal LM ``nll``
  first (mean next-token NLL over documents, nats), then ``R@1``, ``MRR``,
  ``nDCG@10`` (ranx, mean over queries); each with ``<m>_delta`` (row minus
  the eager reference), its paired bootstrap 95 % interval ``<m>_lo``,
  ``<m>_hi``, the paired sign-flip p-value ``<m>_p``, the number of changed
  queries ``<m>_changed`` and the Holm-Bonferroni ``<m>_p_holm`` across the
  table; rows with a random draw add ``<m>_seed_mean``, ``<m>_seed_sd`` over
  ``seeds`` draws and ``seed_runs``;
- fidelity to dense (secondary): ``cos_mean``, ``cos_min`` of the document
  embeddings, ``spearman`` and ``top1`` (tie-robust) retrieval fidelity;
- attention: ``density``, ``keys_per_query``, ``mass`` (on-policy: dense weights
  on the kept edges, on this row's own inputs), ``mass_tf`` (teacher-forced:
  the dense model's weights, on the dense run), ``neg_log_mass``, ``empty``,
  ``out_err``;
- cost: ``attn_gflop`` (attention on the kept edges, 4 D per (edge, head),
  plus for data-dependent rows the dense scores they select from, 2 D per
  edge of the model's graph), ``attn_s`` (seconds from the selection to the
  attention output, summed over layers and batches), ``fwd_s`` (the forward
  passes over all texts, less the time the accounting observer takes),
  ``fwd_x_sdpa`` (``fwd_s`` over the same passes under ``"sdpa"``, in
  ``meta["reference_runs"]`` with ``"eager"``), ``peak_mib`` (extra memory
  at the row's peak, :class:`graphattn.prune.costs.PeakMemory`),
  ``realisable`` (False for top-k, threshold and oracle rows: they need every
  dense score first, so they are bounds, not savings), ``cost_note``, ``wall_s``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import time

from graphattn import ops
from graphattn.prune import costs, models, scoring, tasks
from graphattn.prune.accounting import LayerRun
from graphattn.prune.specs import Spec, as_spec, check_spec, parse_spec, reseed
from graphattn.validate import check_choice, check_int, message

__all__ = ["Results", "run_experiment"]


class Results(list):
    """The rows (a list of dicts, dense first) with the per-query, per-passage and per-layer tables.

    Attributes
    ----------
    per_query : list of dict
        ``pattern, query, R@1, MRR, nDCG@10`` per row and query (empty without a task).
    per_passage : list of dict
        ``pattern, document, cos`` (and ``nll`` for a causal LM) per row and document.
    per_layer : list of dict
        ``pattern, layer, density, mass, mass_tf, neg_log_mass, empty, out_err``.
    embeddings : dict of str to ndarray
        ``{pattern: (Q + N, F)}`` query then document embeddings, when requested.
    task : Task or None
        The queries, documents (as the model saw them) and relevance labels.
    meta : dict
        The task, its sizes, hash and what hygiene dropped, seeds, the arguments.
    """

    def __init__(self, rows=(), **tables):
        super().__init__(rows)
        self.per_query, self.per_passage, self.per_layer = [], [], []
        self.embeddings, self.meta, self.task = {}, {}, None
        for key, value in tables.items():
            setattr(self, key, value)

    def frame(self, which: str = "rows"):
        """``rows``, ``per_query``, ``per_passage`` or ``per_layer`` as a pandas DataFrame."""
        import pandas as pd

        check_choice("which", which, ("rows", "per_query", "per_passage", "per_layer"))
        return pd.DataFrame(list(self) if which == "rows" else getattr(self, which))


def _rows(specs: list[Spec]) -> list[tuple[Spec, Spec | None]]:
    """(spec to run, fixed spec whose budget it copies or None): dense first, oracles after fixed ones."""
    full = parse_spec("full")
    rows = [(full, None)]
    for s in specs:
        if s.name == full.name:
            continue
        rows.append((s, None))
        if not s.data_dependent:
            oracle = Spec.budgeted(
                f"oracle({s.text})",
                f"oracle({s.name})",
                "oracle top-k",
                lambda w, valid, s=s: s.keep(w, valid).sum(-1),
                layers=s.layers,
                heads=s.heads,
            )
            rows.append((oracle, s))
    return rows


@contextlib.contextmanager
def _structures_kept(n: int):
    """The kernels' structure cache holds at least ``n`` graphs in the block (each batch's dense and sparse graph).

    A run cycles through its batches once per row: with fewer slots each pass rebuilt what the last evicted, and
    the cache's thrashing warning named ``set_cache_size``, which a command-line user cannot call.
    """
    before = ops.cache_size()
    ops.set_cache_size(max(before, n))
    try:
        yield
    finally:
        ops.set_cache_size(before)


def run_experiment(
    specs,
    passages: list[str] | None = None,
    *,
    task: tasks.Task | None = None,
    model=None,
    tokenizer=None,
    max_length: int = 128,
    batch_size: int = 16,
    oracle: bool = True,
    progress: bool = True,
    pooling: str = "mean",
    seed: int = 0,
    resamples: int = 2000,
    keep_embeddings: bool = False,
    seeds: int = 3,
    baselines: bool = True,
) -> Results:
    """Run dense and every pattern over a task's queries and documents; one result dict per row.

    Parameters
    ----------
    specs : list of str, Spec, Pattern or pattern function
        See :func:`graphattn.prune.specs.as_spec`; the dense row is added first.
    passages : list of str, optional
        Documents without a task (fidelity only); ignored when ``task`` is given.
    task : Task, optional
        Queries, documents and relevance (:func:`graphattn.prune.tasks.make_task`).
    model, tokenizer : optional
        A ``transformers`` model whose attention runs through the
        ``AttentionInterface`` and its tokenizer (default: the packaged MiniLM).
        The reference runs ``"eager"``, the rows ``"graphattn"``; the
        implementation it had is restored afterwards.
    max_length : int, default 128
        Most tokens per text; at most the model's position embeddings. Texts
        are cut to ``CHARS_PER_TOKEN * max_length`` characters before anything
        tokenizes them.
    batch_size : int, default 16
    oracle : bool, default True
        Add ``oracle(<pattern>)`` after each fixed pattern.
    progress : bool, default True
        A tqdm bar on stderr, one step per batch.
    pooling : {"mean", "cls"}, default "mean"
    seed : int, default 0
        Of the bootstrap and the Monte Carlo sign flips.
    resamples : int, default 2000
        Bootstrap resamples per interval.
    keep_embeddings : bool, default False
        Keep every row's embeddings in ``results.embeddings``.
    seeds : int, default 3
        Rows with a random draw (``random``, ``bigbird``) run again with their
        seed moved by 1 .. seeds - 1; the row reports the mean and spread of
        its headline metric over the seeds (1: no repeat).
    baselines : bool, default True
        Time the same forward passes under ``"sdpa"`` (``"eager"`` is timed as
        the reference) and add a BM25 row for a task with queries.

    Returns
    -------
    Results
        A list of row dicts (columns in the module docstring) with the per-query,
        per-passage and per-layer tables and ``meta``.

    Raises
    ------
    ValueError
        For a bad spec or one scoped outside the model's layers or heads, fewer
        than 3 documents, ``max_length`` outside [8, the model's position
        embeddings], ``batch_size`` < 1, ``seeds`` < 1 or an unknown pooling.
    """
    from tqdm.auto import tqdm

    from graphattn.interop import hf, masks

    specs = [as_spec(s) for s in specs]
    check_int("max_length", max_length, low=8)
    check_int("seeds", seeds, low=1)
    if task is None:
        if passages is None:
            raise ValueError(message("passages", "given, or 'task'", "neither"))
        cut = tasks.corpus.cut(list(passages), max_length)  # before anything tokenizes a long passage
        documents = tasks.corpus.clean_passages(cut, 1)[0]
        task = tasks.Task("none", [], documents, [], {}, f"none: {len(documents)} documents; fidelity only")
    else:  # the texts the model sees: cut before tokenizing, so the files written hold exactly them
        task = dataclasses.replace(
            task,
            queries=tasks.corpus.cut(task.queries, max_length),
            documents=tasks.corpus.cut(task.documents, max_length),
        )
    if len(task.documents) < 3:
        raise ValueError(message("passages", "at least 3 passages", len(task.documents), verb="hold"))
    check_int("batch_size", batch_size, low=1)
    check_choice("pooling", pooling, models.POOLINGS)
    if model is None or tokenizer is None:
        model, tokenizer = models.load_model()
    models.check_max_length(model, max_length)
    num_layers, num_heads = int(model.config.num_hidden_layers), int(model.config.num_attention_heads)
    for s in specs:
        check_spec(s, num_layers, num_heads)
    rows = [r for r in _rows(specs) if oracle or r[1] is None]
    repeats = {spec.name: [reseed(spec, k) for k in range(1, seeds)] for spec, _ in rows if reseed(spec, 1)}
    texts = task.queries + task.documents
    batches = -(-len(texts) // batch_size)
    runs = len(rows) + 1 + baselines + sum(map(len, repeats.values()))
    bar = tqdm(total=runs * batches, desc="reference (eager)", unit="batch", disable=not progress)

    def encode():
        return models.encode(model, tokenizer, texts, max_length, batch_size, pooling, step=bar.update)

    with models.attention_implementation(model, "eager"):  # warm-up, untimed: first calls pay for lazy setup
        models.encode(model, tokenizer, texts[:batch_size], max_length, batch_size, pooling)
    *reference, eager_s, eager_mib = costs.timed_encode(
        model, tokenizer, texts, max_length, batch_size, pooling, "eager", bar.update
    )
    results = Results(meta=_meta(task, tokenizer, texts, max_length, pooling, seed, resamples, model), task=task)
    results.meta["reference_runs"] = {"eager": {"forward_s": eager_s, "peak_mib": eager_mib}}
    if baselines:
        bar.set_description("sdpa (timed)")
        *_, sdpa_s, sdpa_mib = costs.timed_encode(
            model, tokenizer, texts, max_length, batch_size, pooling, "sdpa", bar.update
        )
        results.meta["reference_runs"]["sdpa"] = {"forward_s": sdpa_s, "peak_mib": sdpa_mib}
    forced, tf = [spec for spec, _ in rows[1:]], []
    with (
        models.attention_implementation(model, models.IMPLEMENTATION),
        masks.keep_graphs(2 * batches),
        _structures_kept(2 * batches),
    ):
        for spec, budget_of in rows:
            bar.set_description(spec.name)
            run = LayerRun(spec, num_layers, forced if spec is rows[0][0] else None)
            with costs.PeakMemory(model.device) as peak:
                t0 = time.perf_counter()
                with hf.sparsity(model, run.select, observe=run.observe):
                    emb, nll = encode()
                wall = time.perf_counter() - t0
            if run.forced:
                tf = run.forced_per_layer()
            results.append(_row(spec, budget_of, run, wall, peak.mib))
            scoring.score(results, task, (emb, nll), reference, seed, resamples)
            results.per_layer += [dict(pattern=spec.name, **r) for r in run.per_layer()]
            if keep_embeddings:
                results.embeddings[spec.name] = emb.numpy()
            again = []
            for other in repeats.get(spec.name, []):  # the same row with other draws: no accounting, no observer
                bar.set_description(other.name)
                with hf.sparsity(model, LayerRun(other, num_layers).select):
                    again.append((other.name, encode()))
            scoring.over_seeds(results, task, again, reference)
    bar.close()
    results.meta["peak_memory"] = peak.how
    _forced(results, tf, num_layers)
    _costs(results)
    scoring.holm_adjust(results)
    if baselines and task.queries:
        scoring.bm25_row(results, task, seed, resamples)
    if keep_embeddings:
        results.embeddings["reference"] = reference[0].numpy()
    return results


def _meta(task, tokenizer, texts, max_length, pooling, seed, resamples, model) -> dict:
    lengths = [
        len(ids)
        for ids in tokenizer(task.documents, truncation=True, max_length=max_length, verbose=False)["input_ids"]
    ]
    digest = hashlib.sha256("\x00".join(texts).encode("utf-8")).hexdigest()[:16]
    return {
        "task": task.name,
        "construction": task.construction,
        "queries": len(task.queries),
        "documents": len(task.documents),
        "dropped": dict(task.dropped),
        "corpus_sha256_16": digest,
        "max_length": max_length,
        "doc_tokens_mean": sum(lengths) / len(lengths),
        "doc_tokens_max": max(lengths),
        "pooling": pooling,
        "bootstrap_seed": seed,
        "bootstrap_resamples": resamples,
        "causal": models.is_causal(model),
        "model_class": type(model).__name__,
    }


def _row(spec: Spec, budget_of: Spec | None, run: LayerRun, wall: float, peak_mib) -> dict:
    row = {
        "pattern": spec.name,
        "family": spec.family,
        "spec": spec.text,
        "budget_of": budget_of.name if budget_of is not None else "",
        "realisable": not spec.data_dependent,
    }
    row.update(run.summary())
    row.update(
        attn_gflop=(run.flops + run.select_flops) / 1e9,
        select_gflop=run.select_flops / 1e9,
        attn_s=run.attn_s,
        fwd_s=wall - run.observe_s,
        wall_s=wall,
        peak_mib=peak_mib,
    )
    return row


def _forced(results: Results, forced: list[list[float]], num_layers: int) -> None:
    """Teacher-forced mass from the dense run into each row (1 for the dense row) and its per-layer rows."""
    by_name = {r["pattern"]: per for r, per in zip(results[1:], forced)}
    by_name[results[0]["pattern"]] = [1.0] * num_layers
    for row in results:
        row["mass_tf"] = sum(by_name[row["pattern"]]) / num_layers
    for r in results.per_layer:
        r["mass_tf"] = by_name[r["pattern"]][r["layer"]]
    results.meta.pop("reference_scores", None)


def _costs(results: Results) -> None:
    """``fwd_x_sdpa`` (the row's forward time over SDPA's on the same texts), ``cost_note``: not a saving
    (data-dependent; needs every dense score first), or slower than dense attention.
    """
    dense_s = results[0]["attn_s"]
    sdpa = results.meta["reference_runs"].get("sdpa", {}).get("forward_s")
    for row in results:
        row["fwd_x_sdpa"] = row["fwd_s"] / sdpa if sdpa else float("nan")
    for row in results[1:]:
        notes = [] if row["realisable"] else ["needs dense scores: selects from every dense score first, not a saving"]
        if row["attn_s"] > dense_s:
            notes.append(f"attention slower than graph dense ({row['attn_s'] / dense_s:.2f}x)")
        row["cost_note"] = "; ".join(notes)
    results[0]["cost_note"] = ""
