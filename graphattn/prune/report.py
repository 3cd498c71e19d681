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
    msg = (f"self-check: the model's own graph through graph attention vs Hugging Face eager: "
           f"cos min {dense['cos_min']:.8f}, spearman {dense['spearman']:.8f}, top1 {dense['top1']:.3f}, "
           f"mass {dense['mass']:.8f}, out err {dense['out_err']:.1e}{extra}; "
           f"worst |deviation| {worst:.1e} (tolerance {tol:.0e}): {'PASS' if ok else 'FAIL'}")
    return ok, msg


TABLE_COLUMNS = ["pattern", "realisable", "density", "attn_gflop", "attn_s", "R@1", "MRR", "nDCG@10", "nll",
                 "mass", "mass_tf", "out_err", "cos_mean", "spearman", "top1"]


def _with_ci(row: dict, m: str) -> str:
    return f"{row[m + '_delta']:+.3f} [{row[m + '_lo']:+.3f}, {row[m + '_hi']:+.3f}]"


def format_table(results: list[dict]) -> str:
    """The results table as text (pandas ``to_string``), one line per row, then the cost notes.

    Task metrics come with their difference from eager dense and its paired
    bootstrap 95 % interval (``MRR  dMRR [lo, hi]``); rows that are not a
    saving (data-dependent) are marked ``no`` under ``realisable``.
    """
    import pandas as pd

    frame = pd.DataFrame(results)
    columns = [c for c in TABLE_COLUMNS if c in frame.columns]
    out = frame[columns].copy()
    for m in (*TASK_METRICS, "nll"):
        if m + "_delta" in frame.columns:
            out.insert(out.columns.get_loc(m) + 1, f"d{m} [95% CI]", [_with_ci(r, m) for r in results])
    out["realisable"] = out["realisable"].map({True: "yes", False: "no"})
    fmt = {c: "{:.4f}".format for c in ("density", "mass", "mass_tf", "cos_mean", "spearman", "top1")}
    fmt.update({m: "{:.3f}".format for m in (*TASK_METRICS, "nll")})
    fmt.update(out_err="{:.3g}".format, attn_gflop="{:.3f}".format, attn_s="{:.2f}".format)
    text = out.to_string(index=False, formatters={k: v for k, v in fmt.items() if k in out.columns})
    notes = [f"  {r['pattern']}: {r['cost_note']}" for r in results if r.get("cost_note")]
    return text + ("\ncost notes (attn_gflop of data-dependent rows includes their dense scores):\n" +
                   "\n".join(notes) if notes else "")


def write_outputs(results: list[dict], out_dir, meta: dict, json_path=None, figure=None,
                  tables: bool = False) -> dict[str, str]:
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
        Also write the per-query, per-passage and per-layer CSVs and the embeddings of a ``Results``.

    Returns
    -------
    dict of str
        ``{"csv": ..., "json": ...}``, plus ``"png"``, ``"json_copy"``, ``"per_query"``,
        ``"per_passage"``, ``"per_layer"`` and ``"npz"`` when written. An output of
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
    wanted = {"png": figure is not None, "npz": tables and bool(getattr(results, "embeddings", None))}
    wanted.update({key: tables and bool(getattr(results, key, None)) for key in _TABLES})
    stale = [paths.pop(key) for key, want in wanted.items() if not want]
    if json_path is not None:
        paths["json_copy"] = os.fspath(json_path)
    clean = [{k: (v if not (isinstance(v, float) and not math.isfinite(v)) else str(v)) for k, v in r.items()}
             for r in results]  # JSON has no inf
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


def _write(key: str, tmp: str, results: list[dict], text: str, meta: dict, figure) -> None:
    """Write one output (``csv``, a per-query/passage/layer table, ``npz``, ``json``, ``json_copy``, ``png``)."""
    if key == "csv" or key in _TABLES:
        import pandas as pd

        pd.DataFrame(list(results) if key == "csv" else getattr(results, key)).to_csv(tmp, index=False)
    elif key == "npz":
        import numpy as np

        with open(tmp, "wb") as f:
            np.savez_compressed(f, **results.embeddings)
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
