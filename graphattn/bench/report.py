"""The benchmark's report: ratios to graphattn, the issue's targets, the table and the files."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

from graphattn.bench.cases import METHODS, MODES, SCALING

__all__ = ["add_ratios", "targets", "report", "markdown", "markdown_from_json"]


_COLUMNS = (  # the table's columns, in order; the markdown page leaves out two
    "pattern",
    "L",
    "edges",
    "mode",
    "method",
    "time_s",
    "time_ratio",
    "peak_mib",
    "memory_ratio",
    "gflops",
    "pct_matmul",
    "prep_s",
    "compile_s",
    "status",
)


def add_ratios(rows: list[dict]) -> None:
    """``time_ratio`` and ``memory_ratio``: the method over its graphattn reference on the same case."""
    ref = {
        (r["pattern"], r["L"], r["mode"], r.get("sweep")): r
        for r in rows
        if r.get("status") == "ok" and r["method"] == "graphattn"
    }
    for r in rows:
        base = ref.get((r["pattern"], r["L"], r["mode"], r.get("sweep")))
        if r.get("status") == "ok" and base is not None:
            r["time_ratio"] = r["time_s"] / base["time_s"]
            r["memory_ratio"] = r["peak_bytes"] / max(base["peak_bytes"], 1)


def targets(rows: list[dict]) -> list[str]:
    """The issue's targets, each with the measured ratio (met / missed / not measured)."""
    get = {(r["pattern"], r["L"], r["mode"], r["method"]): r for r in rows if r.get("sweep") != "scaling"}
    lines = []

    def check(text, pattern, L, mode, method, key, op, bound):
        r = get.get((pattern, L, mode, method))
        what = ("time" if key == "time_ratio" else "memory") + f" {method}/graphattn"
        if r is None or key not in r:
            if r is not None:
                lines.append(f"[not measured] {text} ({pattern} L={L} {mode}: {r.get('status')})")
            return
        ok = r[key] >= bound if op == ">=" else r[key] <= bound
        lines.append(f"[{'met' if ok else 'MISSED'}] {text}: {what} = {r[key]:.2f} ({pattern} L={L} {mode})")

    for mode in MODES:
        for L in (1024, 4096):
            check("complete: time <= 1.2x SDPA", "complete", L, mode, "sdpa", "time_ratio", ">=", 1 / 1.2)
            check("complete: memory <= 1.5x SDPA", "complete", L, mode, "sdpa", "memory_ratio", ">=", 1 / 1.5)
        for L in (4096, 16384):
            for pattern in ("random", "topk"):
                check(f"{pattern}: >= 10x faster than flex", pattern, L, mode, "flex", "time_ratio", ">=", 10)
                check(f"{pattern}: >= 20x faster than SDPA+mask", pattern, L, mode, "sdpa_mask", "time_ratio", ">=", 20)
            check("window: time <= 1.5x flex", "window", L, mode, "flex", "time_ratio", ">=", 1 / 1.5)
            check("window: >= 10x faster than SDPA+mask", "window", L, mode, "sdpa_mask", "time_ratio", ">=", 10)
        for pattern in ("window", "random", "topk"):
            for L in sorted({r["L"] for r in rows}):
                if (pattern, L, mode, "pyg") in get:
                    check(
                        f"{pattern}: >= 5x faster than TransformerConv", pattern, L, mode, "pyg", "time_ratio", ">=", 5
                    )
                    check(
                        f"{pattern}: >= 5x less memory than TransformerConv",
                        pattern,
                        L,
                        mode,
                        "pyg",
                        "memory_ratio",
                        ">=",
                        5,
                    )
    for (pattern, L, method), r in sorted(((k[0], k[1], k[3]), v) for k, v in get.items() if k[2] == "fwd"):
        fb = get.get((pattern, L, "fwdbwd", method))
        if method != "graphattn" and "time_ratio" in r and fb is not None and "time_ratio" in fb:
            ok = fb["time_ratio"] >= r["time_ratio"] / 2
            lines.append(
                f"[{'met' if ok else 'MISSED'}] fwd+bwd ratio >= fwd ratio / 2: {method}/graphattn "
                f"{fb['time_ratio']:.2f} vs {r['time_ratio']:.2f} ({pattern} L={L})"
            )
    for pattern in SCALING:
        sweep = [r for r in rows if r.get("sweep") == "scaling" and r["pattern"] == pattern and r.get("status") == "ok"]
        if len(sweep) < 2:
            continue
        x = [math.log(r["edges"]) for r in sweep]
        y = [math.log(r["time_s"]) for r in sweep]
        mx, my = sum(x) / len(x), sum(y) / len(y)
        slope = sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)
        ok = 0.9 <= slope <= 1.1
        lines.append(
            f"[{'met' if ok else 'MISSED'}] time linear in E ({pattern}, growing L): log-log slope "
            f"{slope:.2f} (E = {sweep[0]['edges']:.1e} ... {sweep[-1]['edges']:.1e}, fwd)"
        )
    return lines


def report(rows: list[dict], matmul: float, args) -> None:
    """The table to stdout; CSV, JSON and optionally a PNG under ``args.out``."""
    import pandas as pd
    from rich.console import Console
    from rich.table import Table

    frame = pd.DataFrame(rows)
    for col in ("time_s", "prep_s", "compile_s", "peak_bytes", "gflops", "time_ratio", "memory_ratio"):
        if col not in frame:
            frame[col] = float("nan")
    frame["peak_mib"] = frame["peak_bytes"] / 2**20
    frame["pct_matmul"] = 100 * frame["gflops"] / matmul
    table = Table(
        title=f"graphattn bench — H={args.heads}, D={args.dim}, {args.dtype}, {args.device}, "
        f"plain matmul {matmul:.0f} GFLOP/s; ratio = method / graphattn (> 1: graphattn wins)"
    )
    cols = _COLUMNS
    for c in cols:
        table.add_column(c, justify="left" if c in ("pattern", "mode", "method", "status") else "right")
    for _, r in frame.iterrows():
        table.add_row(*[_fmt(r[c]) for c in cols])
    console = Console(width=200)
    console.print(table)
    for line in targets(rows):
        console.print(line, markup=False)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    frame.drop(columns=["peak_bytes"]).to_csv(args.out / f"bench-{stamp}.csv", index=False)
    import torch

    meta = dict(
        date=time.strftime("%Y-%m-%d %H:%M"),
        matmul_gflops=matmul,
        argv=sys.argv[1:],
        threads=args.threads or torch.get_num_threads(),
        torch=torch.__version__,
        machine=_machine(),
        load=getattr(args, "load", None),
        targets=targets(rows),
    )
    (args.out / f"bench-{stamp}.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1, default=str))
    (args.out / f"bench-{stamp}.md").write_text(markdown(rows, meta))
    if args.plot:
        _plot(frame, args.out / f"bench-{stamp}.png")
    console.print(f"wrote {args.out}/bench-{stamp}.csv, .json, .md" + (" and .png" if args.plot else ""))


def markdown(rows: list[dict], meta: dict) -> str:
    """The results as a markdown page: date, machine, the table, the targets."""
    cols = [c for c in _COLUMNS if c not in ("edges", "pct_matmul")]
    lines = [
        f"# graphattn bench, {meta['date']}",
        "",
        f"Arguments: `{' '.join(meta['argv']) or '(defaults)'}`; "
        f"torch threads: {meta.get('threads', '?')}; 1-minute load average at start and end: "
        f"{meta.get('load')}; plain matmul: {meta['matmul_gflops']:.0f} GFLOP/s; "
        "ratio = method / graphattn (> 1: graphattn is faster / smaller); times in seconds, peaks in MiB "
        "above the resident size before the call.",
        "",
        "```",
        meta["machine"],
        "```",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
    ]
    for r in rows:
        r = dict(r, peak_mib=r["peak_bytes"] / 2**20 if r.get("peak_bytes") is not None else None)
        lines.append("| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |")
    lines += ["", "## Targets", ""] + [f"- {t}" for t in meta["targets"]]
    return "\n".join(lines) + "\n"


def markdown_from_json(path) -> Path:
    """Write ``<path>.md`` next to a results JSON file written by ``graphattn bench``."""
    path = Path(path)
    data = json.loads(path.read_text())
    out = path.with_suffix(".md")
    out.write_text(markdown(data["rows"], data["meta"]))
    return out


def _fmt(x) -> str:
    if x is None:
        return ""
    if isinstance(x, float):
        if math.isnan(x):
            return ""
        return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"
    return str(x)


def _machine() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout.splitlines()
        keep = ("Architecture", "CPU(s):", "Model name", "Thread(s)", "Core(s)", "L1d", "L2", "L3")
        return "\n".join(line for line in out if line.startswith(keep))
    except (OSError, subprocess.SubprocessError):
        import platform

        return platform.processor() or platform.machine()


def _plot(frame, path) -> None:
    """Time against L, one panel per pattern; colour = method, solid = fwd, dashed = fwd+bwd."""
    import matplotlib
    from matplotlib.figure import Figure  # no pyplot: the backend stays the caller's

    ok = frame[(frame["status"] == "ok") & frame.get("sweep", frame["status"]).ne("scaling")]
    pats = list(dict.fromkeys(ok["pattern"]))
    colors = dict(zip(METHODS, matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]))
    fig = Figure(figsize=(4 * max(len(pats), 1), 3.5))
    axes = fig.subplots(1, max(len(pats), 1), squeeze=False)
    for ax, pat in zip(axes[0], pats):
        for (method, mode), g in ok[ok["pattern"] == pat].groupby(["method", "mode"]):
            g = g.sort_values("L")
            ax.loglog(
                g["L"],
                g["time_s"],
                marker="o",
                color=colors[method],
                ls="-" if mode == "fwd" else "--",
                label=f"{method} {mode}",
            )
        ax.set_title(pat)
        ax.set_xlabel("L (nodes)")
        ax.set_ylabel("time (s)")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
