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

__all__ = ["SELF_CHECK_TOL", "TABLE_COLUMNS", "self_check", "format_table", "write_outputs"]

SELF_CHECK_TOL = 1e-5  # the dense row's fidelity must be 1 within this (float32 noise is ~1e-7)


def self_check(dense: dict, tol: float = SELF_CHECK_TOL) -> tuple[bool, str]:
    """Whether the dense row reproduces the reference: fidelity 1 within ``tol``.

    Checks density, mass, cos_mean, cos_min, spearman and top1 against 1 and
    kl, out_err against 0. Returns ``(passed, one-line message)``.
    """
    ones = {k: dense[k] for k in ("density", "mass", "cos_mean", "cos_min", "spearman", "top1")}
    zeros = {k: dense[k] for k in ("kl", "out_err", "empty")}
    worst = max([abs(1.0 - v) for v in ones.values()] + [abs(v) for v in zeros.values()])
    ok = worst <= tol and all(math.isfinite(v) for v in (*ones.values(), *zeros.values()))
    msg = (f"self-check: dense complete graph through graph attention vs Hugging Face eager: "
           f"cos min {dense['cos_min']:.8f}, spearman {dense['spearman']:.8f}, top1 {dense['top1']:.3f}, "
           f"mass {dense['mass']:.8f}, KL {dense['kl']:.1e}, out err {dense['out_err']:.1e}; "
           f"worst |deviation| {worst:.1e} (tolerance {tol:.0e}): {'PASS' if ok else 'FAIL'}")
    return ok, msg


TABLE_COLUMNS = ["pattern", "density", "keys_per_query", "mass", "kl", "empty", "out_err", "cos_mean",
                 "cos_min", "spearman", "top1", "attn_gflop", "attn_s", "wall_s"]


def format_table(results: list[dict]) -> str:
    """The results table as text (pandas ``to_string``), one line per row."""
    import pandas as pd

    frame = pd.DataFrame(results)[TABLE_COLUMNS]
    fmt = {c: "{:.4f}".format for c in TABLE_COLUMNS[1:]}
    fmt.update(keys_per_query="{:.1f}".format, kl="{:.3g}".format, empty="{:.3f}".format,
               out_err="{:.3g}".format, attn_gflop="{:.3f}".format, attn_s="{:.2f}".format,
               wall_s="{:.1f}".format, top1="{:.3f}".format)
    return frame.to_string(index=False, formatters=fmt)


def write_outputs(results: list[dict], out_dir, meta: dict, json_path=None, figure=None) -> dict[str, str]:
    """Write ``prune.csv``, ``prune.json`` and ``prune.png`` into ``out_dir``, all or none.

    Parameters
    ----------
    results : list of dict
        Rows of :func:`~graphattn.prune.run_experiment`.
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

    Returns
    -------
    dict of str
        ``{"csv": ..., "json": ...}``, plus ``"png"`` and ``"json_copy"`` when written.

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
    stale = [] if figure is not None else [paths.pop("png")]
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
    """A new empty file next to ``path`` (same folder, so the rename is atomic), hidden by a leading dot."""
    import tempfile

    folder, name = os.path.split(os.path.abspath(path))
    handle, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    os.close(handle)
    return tmp


def _write(key: str, tmp: str, results: list[dict], text: str, meta: dict, figure) -> None:
    """Write one output (``csv``, ``json``, ``json_copy`` or ``png``) to its temporary name."""
    if key == "csv":
        import pandas as pd

        pd.DataFrame(results).to_csv(tmp, index=False)
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
