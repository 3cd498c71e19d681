"""The experiment's outputs: the table, the comparisons at equal tokens and equal wall time, files, figure.

:func:`write_outputs` writes ``lm.csv`` (one row per configuration),
``lm.json`` (rows with their curves and probes, the comparisons, and a
``meta`` block: versions, git commit, corpus hash, seeds, arguments) and
``lm.png`` into a folder, each atomically (a temporary file, then
``os.replace``).

Comparisons (:func:`compare`), per length, each pattern against ``dense`` of
the same seed (same initial weights, same batches):

- equal tokens: validation bits per byte of both at the largest token count
  both reached (linear between the evaluations around it);
- equal wall time: the same at the largest training time both reached.

With several seeds the difference (pattern - dense) gets a paired 95 %
t-interval over seeds (``scipy.stats.t``); with one seed only the difference.
"""

from __future__ import annotations

import math
import os

__all__ = ["CSV_COLUMNS", "at", "compare", "format_table", "write_outputs", "figure"]

CSV_COLUMNS = [
    "pattern",
    "length",
    "seed",
    "steps",
    "tokens",
    "val_bpb",
    "test_bpb",
    "edges",
    "density",
    "flops",
    "attn_flops",
    "other_flops",
    "train_seconds",
    "cpu_seconds",
    "tokens_per_s",
    "peak_memory_mb",
    "parameters",
    "world",
    "device",
]


def at(log: list[dict], key: str, value: float) -> float:
    """Validation bits per byte at ``log[key] == value``, linear between evaluations (nan before the first)."""
    import numpy as np

    xs = [e[key] for e in log]
    if not xs or value < xs[0] * (1 - 1e-9) or value > xs[-1] * (1 + 1e-9):
        return math.nan
    return float(np.interp(value, xs, [e["val_bpb"] for e in log]))


def _interval(diffs: list[float]) -> tuple[float, float, float]:
    """Mean and paired 95 % t-interval of ``diffs`` (nan bounds with fewer than two)."""
    import numpy as np
    from scipy import stats

    d = np.asarray(diffs, dtype=float)
    mean = float(d.mean())
    if d.size < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(0.975, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size))
    return mean, mean - half, mean + half


def compare(results: list[dict]) -> list[dict]:
    """Each pattern against dense at equal tokens and at equal wall time (module docstring), per length.

    Returns one dict per (length, pattern, basis) with ``dense_bpb``,
    ``pattern_bpb`` (means over seeds), ``delta`` and its interval
    ``lo``/``hi``, ``seeds`` and the common budget ``at``.
    """
    out = []
    by = {(r["length"], r["pattern"], r["seed"]): r for r in results}
    for length in sorted({r["length"] for r in results}):
        names = [r["pattern"] for r in results if r["length"] == length]
        for name in dict.fromkeys(names):
            if name == "dense":
                continue
            seeds = [s for (L, p, s) in by if L == length and p == name and (L, "dense", s) in by]
            for basis, key in (("equal tokens", "tokens"), ("equal wall time", "train_seconds")):
                pairs = []
                for s in seeds:
                    a, b = by[(length, "dense", s)], by[(length, name, s)]
                    budget = min(a["log"][-1][key], b["log"][-1][key])
                    pairs.append((at(a["log"], key, budget), at(b["log"], key, budget), budget))
                if not pairs:
                    continue
                mean, lo, hi = _interval([p - d for d, p, _ in pairs])
                out.append(
                    {
                        "length": length,
                        "pattern": name,
                        "basis": basis,
                        "at": min(p[2] for p in pairs),
                        "unit": "tokens" if key == "tokens" else "s",
                        "seeds": len(pairs),
                        "dense_bpb": sum(d for d, _, _ in pairs) / len(pairs),
                        "pattern_bpb": sum(p for _, p, _ in pairs) / len(pairs),
                        "delta": mean,
                        "lo": lo,
                        "hi": hi,
                    }
                )
    return out


def format_table(results: list[dict], comparisons: list[dict]) -> str:
    """The runs (final bits per byte and costs), then the comparisons, as text."""
    import pandas as pd

    frame = pd.DataFrame(results)
    cols = [
        "pattern",
        "length",
        "seed",
        "tokens",
        "val_bpb",
        "test_bpb",
        "density",
        "flops",
        "attn_flops",
        "train_seconds",
        "tokens_per_s",
    ]
    text = frame[cols].to_string(
        index=False,
        formatters={
            "val_bpb": "{:.3f}".format,
            "test_bpb": "{:.3f}".format,
            "density": "{:.3f}".format,
            "flops": "{:.3g}".format,
            "attn_flops": "{:.3g}".format,
            "train_seconds": "{:.1f}".format,
            "tokens_per_s": "{:.0f}".format,
        },
    )
    if comparisons:
        comp = pd.DataFrame(comparisons)
        comp["budget"] = [f"{c['at']:.4g} {c['unit']}" for c in comparisons]
        comp["pattern - dense [95% CI]"] = [
            f"{c['delta']:+.3f}" + ("" if math.isnan(c["lo"]) else f" [{c['lo']:+.3f}, {c['hi']:+.3f}]")
            for c in comparisons
        ]
        text += "\n\nvalidation bits per byte against dense of the same seed:\n" + comp[
            ["length", "pattern", "basis", "budget", "seeds", "dense_bpb", "pattern_bpb", "pattern - dense [95% CI]"]
        ].to_string(index=False, formatters={"dense_bpb": "{:.3f}".format, "pattern_bpb": "{:.3f}".format})
    return text


def _write_text(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def write_outputs(results: list[dict], out: str, meta: dict, draw: bool = True) -> dict:
    """Write ``lm.csv``, ``lm.json`` and (``draw``) ``lm.png`` into ``out``; returns ``{kind: path}``."""
    import io
    import json

    import pandas as pd

    os.makedirs(out, exist_ok=True)
    comparisons = compare(results)
    paths = {"csv": os.path.join(out, "lm.csv"), "json": os.path.join(out, "lm.json")}
    buf = io.StringIO()
    pd.DataFrame(results)[CSV_COLUMNS].to_csv(buf, index=False)
    _write_text(paths["csv"], buf.getvalue())
    _write_text(
        paths["json"],
        json.dumps({"meta": meta, "runs": results, "comparisons": comparisons}, indent=1, default=str, allow_nan=True),
    )
    if draw:
        paths["png"] = os.path.join(out, "lm.png")
        tmp = paths["png"] + f".tmp{os.getpid()}.png"
        figure(results, meta).savefig(tmp, dpi=110)
        os.replace(tmp, paths["png"])
    return paths


def _smooth(values: list[float], bins: int = 32) -> tuple[list[float], list[float]]:
    """Means over log-spaced position bins (positions from 1), for a readable per-position curve."""
    import numpy as np

    v = np.asarray(values)
    edges = np.unique(np.geomspace(1, len(v), bins + 1).astype(int))
    xs = [float(np.sqrt(a * b)) for a, b in zip(edges[:-1], edges[1:])]
    ys = [float(v[a - 1 : b - 1].mean()) for a, b in zip(edges[:-1], edges[1:])]
    return xs, ys


def figure(results: list[dict], meta: dict):
    """Validation bits per byte against training time and against FLOPs; loss per position; the probes.

    One colour per pattern, one line style per length, one line per seed;
    dense wide and pale, so that graphattn's causal graph (the same model)
    shows on top of it.
    A ``matplotlib.figure.Figure`` of its own (nothing global changes).
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 9), layout="constrained")
    axes = fig.subplots(2, 2).ravel()
    names = list(dict.fromkeys(r["pattern"] for r in results))
    lengths = sorted({r["length"] for r in results})
    styles = ["-", "--", ":", "-."]
    for r in results:
        c, ls = f"C{names.index(r['pattern']) % 10}", styles[lengths.index(r["length"]) % 4]
        first = r["seed"] == min(q["seed"] for q in results if q["pattern"] == r["pattern"])
        label = f"{r['pattern']}" + (f" L={r['length']}" if len(lengths) > 1 else "") if first else None
        log = r["log"]
        kw = dict(
            color=c,
            label=label,
            lw=4 if r["pattern"] == "dense" else 1.5,  # dense wide: the same as causal
            alpha=0.45 if r["pattern"] == "dense" else 1.0,
        )
        axes[0].plot([e["train_seconds"] for e in log], [e["val_bpb"] for e in log], ls, marker=".", **kw)
        axes[1].plot(
            [e["flops"] for e in log if e["flops"] > 0],
            [e["val_bpb"] for e in log if e["flops"] > 0],
            ls,
            marker=".",
            **kw,
        )  # log scale: the initial evaluation (0 FLOPs) left out
        axes[2].plot(*_smooth(r["position_bpb"]), ls, **kw)
    later = [e["val_bpb"] for r in results for e in r["log"][1:]]
    if later:  # the initial ~8 bits would squash the curves: start the scale at the first evaluation after it
        low, high = min(later), max(later)
        axes[0].set_ylim(low - 0.05 * (high - low + 1e-3), high + 0.05 * (high - low + 1e-3))
    axes[0].set_xlabel("training time (s, evaluation excluded; the initial model's point above the top)")
    axes[1].set_xlabel("training FLOPs (attention + rest, 3 x forward)")
    axes[1].set_xscale("log")
    for ax in axes[:2]:
        ax.set_ylabel("validation bits per byte")
    axes[2].set_xscale("log")
    axes[2].set_xlabel("position in the window (bytes of context + 1; log-spaced bins)")
    axes[2].set_ylabel("validation bits per byte at the end")
    _probe_panel(axes[3], results, names)
    for ax, title in zip(
        axes,
        (
            "quality against wall time",
            "quality against compute",
            "loss per position: how much context each pattern uses",
            "long-range probes (end of training)",
        ),
    ):
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(
        f"byte-level LMs on the CPython standard library: {meta.get('preset', 'custom')} preset, "
        f"{meta.get('model_text', '')}",
        fontsize=11,
    )
    return fig


def _probe_panel(ax, results, names) -> None:
    """Copy-task bits per byte against distance (solid) and repeated-n-gram bits per bucket (dashed), seed mean."""
    import numpy as np

    for name in names:
        rows = [r for r in results if r["pattern"] == name and r["length"] == max(q["length"] for q in results)]
        c = f"C{names.index(name) % 10}"
        dists = sorted(int(d) for d in rows[0]["copy"])
        ax.plot(
            dists, [np.mean([r["copy"][str(d)] for r in rows]) for d in dists], "o-", color=c, label=f"{name}: copy"
        )
        buckets = [b for b in rows[0]["repeat"] if rows[0]["repeat"][b][1]]
        mids = [np.sqrt(max(int(b.split("-")[0]), 1) * int(b.split("-")[1])) for b in buckets]
        ax.plot(
            mids,
            [np.nanmean([r["repeat"][b][0] for r in rows]) for b in buckets],
            "s--",
            color=c,
            lw=0.8,
            label=f"{name}: repeats",
        )
    ax.set_xscale("log")
    ax.set_xlabel("distance back to the evidence (bytes)")
    ax.set_ylabel("bits per byte (copy: planted string; repeats: n-gram seen before)")
