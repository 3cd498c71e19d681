"""The experiment's outputs: the self-check, the table, the Pareto figure and the files.

:func:`write_outputs` writes ``prune.csv``, ``prune.json`` and ``prune.png``
into a folder; a run that fails (or is interrupted) leaves the folder's
previous complete set, never a mix. The picture is drawn by a callable the
caller passes (the command's :func:`graphattn.cli.prune.fidelity_figure`),
since plotting (:mod:`graphattn.viz`) sits above this layer.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading

__all__ = ["SELF_CHECK_TOL", "NLL_TOL", "TABLE_COLUMNS", "TASK_METRICS", "self_check", "format_table", "write_outputs"]

SELF_CHECK_TOL = 1e-5  # the dense row's fidelity must be 1 within this (float32 noise is ~1e-7)
NLL_TOL = 1e-4  # a causal LM's dense next-token NLL must equal eager's within this (nats)
TASK_METRICS = ("R@1", "MRR", "nDCG@10")


def self_check(dense: dict, tol: float = SELF_CHECK_TOL) -> tuple[bool, str]:
    """Whether the dense row reproduces the eager reference: fidelity 1 within ``tol``.

    Checks density, mass, mass_tf, cos_mean, cos_min, spearman and top1
    (tie-robust) against 1, neg_log_mass, out_err and empty against 0, and for
    a causal LM ``|nll_delta| <= NLL_TOL``. The task metrics' differences from
    eager are reported, not checked (a near-tie may swap two documents).
    Returns ``(passed, one-line message)``.
    """
    ones = {k: dense[k] for k in ("density", "mass", "mass_tf", "cos_mean", "cos_min", "spearman", "top1")}
    zeros = {k: dense[k] for k in ("neg_log_mass", "out_err", "empty")}
    worst = max([abs(1.0 - v) for v in ones.values()] + [abs(v) for v in zeros.values()])
    ok = worst <= tol and all(math.isfinite(v) for v in (*ones.values(), *zeros.values()))
    extra = ""
    if "nll_delta" in dense:
        ok = ok and abs(dense["nll_delta"]) <= NLL_TOL
        extra += f", next-token NLL {dense['nll']:.6f} (eager {dense['nll'] - dense['nll_delta']:.6f})"
    deltas = [f"{m} {dense[m + '_delta']:+.3f}" for m in TASK_METRICS if m + "_delta" in dense]
    if deltas:
        extra += ", task vs eager " + " ".join(deltas)
    msg = (
        f"self-check: the model's own graph through graph attention vs Hugging Face eager: "
        f"cos min {dense['cos_min']:.8f}, spearman {dense['spearman']:.8f}, top1 {dense['top1']:.3f}, "
        f"mass {dense['mass']:.8f}, out err {dense['out_err']:.1e}{extra}; "
        f"worst |deviation| {worst:.1e} (tolerance {tol:.0e}): {'PASS' if ok else 'FAIL'}"
    )
    return ok, msg


TABLE_COLUMNS = [
    "pattern",
    "realisable",
    "density",
    "nll",
    "MRR",
    "R@1",
    "nDCG@10",
    "fwd_s",
    "fwd_x_sdpa",
    "attn_s",
    "peak_mib",
    "attn_gflop",
    "mass",
    "mass_tf",
    "out_err",
    "cos_mean",
    "spearman",
    "top1",
]


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _with_ci(row: dict, m: str) -> str:
    if _missing(row.get(m + "_delta")):
        return ""
    return f"{row[m + '_delta']:+.3f} [{row[m + '_lo']:+.3f}, {row[m + '_hi']:+.3f}]"


def _p(value) -> str:
    if _missing(value):
        return ""
    return f"{value:.3f}" if value >= 0.001 else "<0.001"


def _seeds(row: dict, m: str) -> str:
    if _missing(row.get(f"{m}_seed_mean")):
        return ""
    return f"{row[m + '_seed_mean']:.3f} ± {row[m + '_seed_sd']:.3f} ({len(row['seed_runs'].split())})"


def _header(meta: dict) -> list[str]:
    lines = []
    if meta.get("construction"):
        lines.append(f"construction of task {meta['construction']}")
    runs = meta.get("reference_runs", {})
    if runs:
        parts = [
            f"{name} {r['forward_s']:.2f} s" + (f" (peak +{r['peak_mib']:.0f} MiB)" if r.get("peak_mib") else "")
            for name, r in runs.items()
        ]
        lines.append(
            "the same forward passes under Hugging Face's own attention: "
            + ", ".join(parts)
            + "; fwd_s is each row's (graph attention, accounting excluded), fwd_x_sdpa its ratio to SDPA"
        )
    return lines


def format_table(results: list[dict]) -> str:
    """The results table as text (pandas ``to_string``), one line per row, then the notes.

    The headline metric (``nll`` for a causal LM, else ``MRR``) leads, with
    its difference from eager dense and the paired bootstrap 95 % interval
    (``dMRR [95% CI]``), the paired sign-flip p-value, its Holm-Bonferroni
    adjustment across the table (``p_holm``) and the number of queries whose
    score changed; rows with a random draw add the mean ± standard deviation
    over their seeds. The other task metrics follow with their intervals, then
    costs (``fwd_x_sdpa``: forward time over SDPA's on the same texts) and
    fidelity. Rows that need every dense score first (top-k, threshold,
    oracle) read ``no`` under ``realisable``; the BM25 row ``n/a``. A
    :class:`~graphattn.prune.Results` also prints the task's construction and
    the eager and SDPA forward times above the table.
    """
    import pandas as pd

    frame = pd.DataFrame(results)
    columns = [c for c in TABLE_COLUMNS if c in frame.columns]
    out = frame[columns].copy()
    lead = "nll" if "nll" in frame.columns else ("MRR" if "MRR" in frame.columns else None)
    for m in [m for m in ("nll", *TASK_METRICS) if m + "_delta" in frame.columns][::-1]:
        at = out.columns.get_loc(m) + 1
        if m == lead:
            out.insert(at, "changed", [r.get(f"{m}_changed", "") for r in results])
            out.insert(at, "p_holm", [_p(r.get(f"{m}_p_holm")) for r in results])
            out.insert(at, "p", [_p(r.get(f"{m}_p")) for r in results])
            if f"{m}_seed_mean" in frame.columns:
                out.insert(at, f"{m} over seeds", [_seeds(r, m) for r in results])
        out.insert(at, f"d{m} [95% CI]", [_with_ci(r, m) for r in results])
    if lead is not None:  # the headline first, then the other task metrics
        order = [c for c in out.columns if c in ("pattern", "realisable", "density")]
        block = list(out.columns[out.columns.get_loc(lead) : out.columns.get_loc("changed") + 1])
        out = out[order + block + [c for c in out.columns if c not in order + block]]
    out["realisable"] = out["realisable"].map({True: "yes", False: "no"}).fillna("n/a")
    fmt = {c: "{:.4f}".format for c in ("density", "mass", "mass_tf", "cos_mean", "spearman", "top1")}
    fmt.update({m: "{:.3f}".format for m in (*TASK_METRICS, "nll")})
    fmt.update(
        out_err="{:.3g}".format,
        attn_gflop="{:.3f}".format,
        attn_s="{:.2f}".format,
        fwd_s="{:.2f}".format,
        fwd_x_sdpa="{:.2f}x".format,
        peak_mib="{:.0f}".format,
    )
    text = out.to_string(
        index=False, na_rep="", formatters={k: _skip_nan(v) for k, v in fmt.items() if k in out.columns}
    )
    notes = [f"  {r['pattern']}: {r['cost_note']}" for r in results if r.get("cost_note")]
    text = "\n".join(_header(getattr(results, "meta", {})) + [text])
    return text + (
        "\nnotes (attn_gflop of rows that need dense scores includes those scores; p: paired sign-flip, "
        "p_holm: Holm-Bonferroni across the rows; changed: queries whose score moved):\n" + "\n".join(notes)
        if notes
        else ""
    )


def _skip_nan(fmt):
    return lambda v: "" if _missing(v) else fmt(v)


def write_outputs(
    results: list[dict], out_dir, meta: dict, json_path=None, figure=None, tables: bool = False
) -> dict[str, str]:
    """Write ``prune.csv``, ``prune.json``, ``prune.png`` and the per-row tables into ``out_dir``, all or none.

    Parameters
    ----------
    results : list of dict or Results
        Rows of :func:`~graphattn.prune.run_experiment`; a :class:`~graphattn.prune.Results`
        also gives ``prune_queries.csv``, ``prune_passages.csv``, ``prune_layers.csv``
        and, when it holds embeddings, ``prune_embeddings.npz`` (one array per row,
        queries then documents), when ``tables`` is True.
    out_dir : str or PathLike
        Created if missing; other files in it are left alone.
    meta : dict
        Stored under ``"meta"`` in the JSON (model, source, passages, ...).
    json_path : str or PathLike, optional
        Also write the JSON there.
    figure : callable, optional
        ``figure(results, meta) -> matplotlib.figure.Figure``, saved as
        ``prune.png`` (e.g. :func:`graphattn.cli.prune.fidelity_figure`).
        Without it no picture is written, and an older ``prune.png`` is removed
        with the rest of the commit, so the folder never mixes two runs.
    tables : bool, default False
        Also write the per-query, per-passage and per-layer CSVs and the embeddings of a ``Results``
        and, when it holds its task, the texts: ``prune_query_texts.jsonl`` and ``prune_documents.jsonl``
        (``{"id": "q0", "text": ...}``, the ids of the tables and of ranx) and ``prune_qrels.txt`` (TREC
        qrels, ``q0 0 d3 1``); the npz then also holds ``qrels`` ((R, 2) query, document pairs),
        ``num_queries`` and ``num_documents``. With these files alone every metric can be recomputed.

    Returns
    -------
    dict of str
        ``{"csv": ..., "json": ...}``, plus ``"png"``, ``"json_copy"``, ``"per_query"``,
        ``"per_passage"``, ``"per_layer"``, ``"npz"``, ``"query_texts"``, ``"documents"`` and ``"qrels"``
        when written. An output of
        an earlier run that this one does not write is removed with the commit.

    Notes
    -----
    Every file is first written to a temporary name in its own folder; only
    when all of them are complete are they renamed into place (``os.replace``,
    with Ctrl-C deferred for those few renames). A failure or an interrupt
    before that deletes the temporary files: the folder keeps the previous
    complete set of outputs, or none.
    """
    import json

    os.makedirs(out_dir, exist_ok=True)
    paths = {ext: os.path.join(out_dir, f"prune.{ext}") for ext in ("csv", "json", "png")}
    paths.update({key: os.path.join(out_dir, name) for key, name in _TABLES.items()})
    paths["npz"] = os.path.join(out_dir, "prune_embeddings.npz")
    paths.update({key: os.path.join(out_dir, name) for key, name in _TEXTS.items()})
    task = getattr(results, "task", None)
    wanted = {"png": figure is not None, "npz": tables and bool(getattr(results, "embeddings", None))}
    wanted.update({key: tables and task is not None and (key == "documents" or bool(task.queries)) for key in _TEXTS})
    wanted.update({key: tables and bool(getattr(results, key, None)) for key in _TABLES})
    stale = [paths.pop(key) for key, want in wanted.items() if not want]
    if json_path is not None:
        paths["json_copy"] = os.fspath(json_path)
    clean = [
        {k: (v if not (isinstance(v, float) and not math.isfinite(v)) else str(v)) for k, v in r.items()}
        for r in results
    ]  # JSON has no inf
    text = json.dumps({"meta": meta, "rows": clean}, indent=2) + "\n"
    staged: dict[str, str] = {}
    try:
        for key, path in paths.items():
            staged[key] = _temporary(path)
            _write(key, staged[key], results, text, meta, figure)
        with _interrupt_deferred():
            for key, path in paths.items():
                os.replace(staged.pop(key), path)
            for path in stale:
                if os.path.exists(path):
                    os.remove(path)
    finally:
        for tmp in staged.values():  # only left when something failed
            if os.path.exists(tmp):
                os.remove(tmp)
    return paths


def _temporary(path: str) -> str:
    """A new empty file next to ``path`` (same folder, so the rename is atomic), hidden by a leading dot.

    Created with mode 0666 less the umask (0644 under umask 022), as ``open`` would: ``mkstemp``'s 0600
    would survive the rename and hide the results from colleagues and web servers.
    """
    import secrets

    folder, name = os.path.split(os.path.abspath(path))
    while True:
        tmp = os.path.join(folder, f".{name}.{secrets.token_hex(4)}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            continue


_TABLES = {"per_query": "prune_queries.csv", "per_passage": "prune_passages.csv", "per_layer": "prune_layers.csv"}
_TEXTS = {"query_texts": "prune_query_texts.jsonl", "documents": "prune_documents.jsonl", "qrels": "prune_qrels.txt"}


def _write_texts(key: str, tmp: str, task) -> None:
    """The task's texts as JSONL (``{"id": "q0", "text": ...}``, ids as in the per-query table and ranx) or its
    relevance judgements as TREC qrels (``q0 0 d3 1``: query, iteration, document, relevance).
    """
    import json

    with open(tmp, "w", encoding="utf-8") as f:
        if key == "qrels":
            f.writelines(f"q{q} 0 d{d} 1\n" for q, docs in enumerate(task.relevant) for d in docs)
        else:
            prefix, texts = ("q", task.queries) if key == "query_texts" else ("d", task.documents)
            f.writelines(
                json.dumps({"id": f"{prefix}{n}", "text": t}, ensure_ascii=False) + "\n" for n, t in enumerate(texts)
            )


def _write(key: str, tmp: str, results: list[dict], text: str, meta: dict, figure) -> None:
    """Write one output (``csv``, a per-query/passage/layer table, ``npz``, ``json``, ``json_copy``, ``png``)."""
    if key == "csv" or key in _TABLES:
        import pandas as pd

        pd.DataFrame(list(results) if key == "csv" else getattr(results, key)).to_csv(tmp, index=False)
    elif key in _TEXTS:
        _write_texts(key, tmp, results.task)
    elif key == "npz":
        import numpy as np

        labels = {}
        task = getattr(results, "task", None)
        if task is not None:  # the relevance labels beside the embeddings: (query, document) pairs
            pairs = [(q, d) for q, docs in enumerate(task.relevant) for d in docs]
            labels = {
                "qrels": np.array(pairs, dtype=np.int64).reshape(-1, 2),
                "num_queries": np.array(len(task.queries)),
                "num_documents": np.array(len(task.documents)),
            }
        with open(tmp, "wb") as f:
            np.savez_compressed(f, **results.embeddings, **labels)
    elif key == "png":
        figure(results, meta).savefig(tmp, dpi=120, format="png")
    else:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)


@contextlib.contextmanager
def _interrupt_deferred():
    """Hold a Ctrl-C (SIGINT) until the block ends, then raise it; a no-op outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda *args: caught.append(args))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt
