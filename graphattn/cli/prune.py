"""``graphattn prune``: dense vs sparse attention on a real model, scored on a labelled task (:mod:`graphattn.prune`).

Checks every spec against the model's config before the model loads; prints
the task's construction, the eager and SDPA forward times, a progress bar, the
table (the headline metric with its paired bootstrap 95 % interval, sign-flip
p-value, Holm adjustment and changed-query count, then the other metrics,
costs and fidelity, a BM25 row last) and the self-check; writes
``prune.csv``, ``prune.json`` (with a ``meta`` block), the per-query,
per-passage and per-layer CSVs, the query and document texts and TREC qrels,
optionally the embeddings, and ``prune.png`` into ``--out``, all or none.
Exit 0 when the self-check passes; 1 when it fails, and then nothing is
written; 2 for a user error (one line, from :func:`graphattn.cli.main`).
Reference: ``docs/prune.md``.
"""

from __future__ import annotations

import argparse
import sys
import time

from graphattn.cli.args import cpu_threads, int_in, message, out_path
from graphattn.prune.specs import DEFAULT_PATTERNS, SPEC_HELP, parse_spec
from graphattn.prune.tasks import TASKS

__all__ = ["add_arguments", "main", "fidelity_figure", "sweep_figure"]

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
PYDOC_SOURCE = "pydoc_data.topics (Python reference documentation)"
DEFAULT_FIRST_SENTENCE = (
    100  # first-sentence queries by default (about the old default's time); --limit 400 for narrower intervals
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``graphattn prune``."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "pattern specs:\n" + SPEC_HELP
    parser.add_argument(
        "--patterns",
        nargs="+",
        metavar="SPEC",
        default=None,
        help=f"pattern specs (default: {' '.join(DEFAULT_PATTERNS)}); the dense row is always first",
    )
    parser.add_argument(
        "--task",
        choices=TASKS,
        default="first-sentence",
        help="first-sentence (default): a passage's first sentence finds the rest of it among the "
        "others; title-retrieval: each pydoc topic title finds the topic's first chunk (easy: "
        "its defining paragraph); title-nonfirst: the title finds a later chunk of its topic; "
        "none: fidelity to dense only. The construction is printed with the table",
    )
    parser.add_argument(
        "--limit",
        type=int_in("--limit", 3, 100_000),
        default=None,
        metavar="N",
        help=f"number of queries (topics for the title tasks; documents for none), evenly spaced "
        f"(default: {DEFAULT_FIRST_SENTENCE} first sentences; every topic; 48 documents)",
    )
    parser.add_argument(
        "--docs-per-topic",
        type=int_in("--docs-per-topic", 1, 1000),
        default=1,
        metavar="K",
        help="title-retrieval: chunks of each topic among the documents (default 1)",
    )
    parser.add_argument(
        "--max-length",
        type=int_in("--max-length", 8, 100_000),
        default=128,
        metavar="T",
        help="most tokens per text, special tokens included, at most the model's position "
        "embeddings; a warning above the length it was trained on (default 128)",
    )
    parser.add_argument(
        "--model",
        metavar="PATH_OR_PACKAGE",
        default=None,
        help="a local Hugging Face model folder, or an installed package with get_model_path() "
        "(default: the packaged all-MiniLM-L6-v2); never downloaded",
    )
    parser.add_argument(
        "--pooling",
        choices=("mean", "cls"),
        default=None,
        help="sentence embedding: mean over tokens or the first token (default: the model folder's "
        "sentence-transformers pooling, else mean)",
    )
    parser.add_argument(
        "--text",
        metavar="FILE",
        default=None,
        help="your own passages, one per line (duplicates and lines under 4 words dropped; "
        "default: the Python reference documentation, pydoc_data.topics)",
    )
    parser.add_argument(
        "--out",
        type=out_path("--out"),
        metavar="DIR",
        default="prune-out",
        help="folder for prune.csv, prune.json, prune_{queries,passages,layers}.csv, prune.png and the task "
        "(prune_query_texts.jsonl, prune_documents.jsonl, prune_qrels.txt) (default prune-out)",
    )
    parser.add_argument(
        "--json",
        type=out_path("--json", "file"),
        metavar="FILE",
        default=None,
        help="also write the JSON results to FILE",
    )
    parser.add_argument("--embeddings", action="store_true", help="also write prune_embeddings.npz")
    parser.add_argument("--seed", type=int_in("--seed", 0, 2**31 - 1), default=0, help="bootstrap seed (default 0)")
    parser.add_argument(
        "--resamples",
        type=int_in("--resamples", 100, 1_000_000),
        default=2000,
        metavar="N",
        help="bootstrap resamples per interval (default 2000)",
    )
    parser.add_argument(
        "--seeds",
        type=int_in("--seeds", 1, 100),
        default=3,
        metavar="N",
        help="draws of each random or BigBird row (seed, seed + 1, ...): its headline metric's mean "
        "and spread over them (default 3)",
    )
    parser.add_argument(
        "--threads",
        type=cpu_threads("--threads"),
        default=1,
        metavar="N",
        help="torch threads, at most the CPU count (default 1: many small tensor operations, which "
        "a second thread barely speeds up and which slow down on shared cores)",
    )
    parser.add_argument("--no-oracle", action="store_true", help="skip the oracle top-k row after each fixed pattern")
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="instead of --patterns: budget curves (k = 1..32 keys per query for a window, window + "
        "[CLS], oracle top-k), a global-token ablation and a layer ablation, with CI bands "
        "(prune.png shows them; 32 rows, about 3 minutes of CPU time at the defaults)",
    )


def main(args: argparse.Namespace) -> int:
    """Run ``graphattn prune``; 0 when the self-check passes, 1 when it fails (user errors raise)."""
    import torch

    from graphattn import prune

    if args.sweep and args.patterns:  # the sweep has its own rows: --patterns would be ignored without a word
        raise ValueError(
            message(
                "--patterns",
                "given without '--sweep' (one or the other, not both: the sweep runs its own 32 rows)",
                "both",
            )
        )
    config = prune.models.model_config(args.model)  # before any weight is loaded
    sweep = prune.sweep.sweep_specs(int(config.num_hidden_layers)) if args.sweep else None
    specs = [parse_spec(s) for s in ([t for t, _, _ in sweep] if sweep else (args.patterns or DEFAULT_PATTERNS))]
    names = [spec.name for spec in specs]
    if len(set(names)) < len(names):  # two rows of one name are one name in every output file
        twice = next(n for n in names if names.count(n) > 1)
        given = [t for t, n in zip(args.patterns or [], names) if n == twice]
        raise ValueError(message("--patterns", "each pattern once", f"{twice!r} twice, as {given!r}", verb="name"))
    for spec in specs:  # scopes against the model's range, and pattern functions on a few tokens, before loading
        prune.specs.check_spec(spec, int(config.num_hidden_layers), int(config.num_attention_heads))
    prune.models.check_max_length(config, args.max_length)
    trained = prune.models.trained_length(args.model, config)
    if trained is not None and args.max_length > trained:
        print(
            f"warning: --max-length {args.max_length} is above the {trained} tokens the model was trained on; "
            "its attention on longer inputs is out of distribution",
            file=sys.stderr,
        )
    task_name = args.task
    passages, source, dropped = None, PYDOC_SOURCE, {}
    if args.text:
        source = args.text
        if task_name.startswith("title"):
            raise ValueError(
                message(
                    "--task",
                    "first-sentence or none with --text",
                    f"{task_name}, which needs the pydoc topics' titles",
                )
            )
        passages = prune.corpus.read_passages(args.text, max_length=args.max_length, dropped=dropped)
    model, tokenizer = prune.load_model(args.model)
    limit = args.limit or {"first-sentence": DEFAULT_FIRST_SENTENCE, "none": 48}.get(task_name)
    task = prune.make_task(task_name, tokenizer, args.max_length, limit, passages, args.docs_per_topic)
    task.dropped.update({f"lines_{k}": v for k, v in dropped.items()})
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _report(args, specs, task, source, model, tokenizer, sweep)
    finally:
        torch.set_num_threads(threads)  # leave the caller's process as it was


def _report(args, specs, task, source, model, tokenizer, sweep=None) -> int:
    import torch

    from graphattn import prune

    pooling = args.pooling or prune.models.default_pooling(args.model)
    dropped = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in task.dropped.items() if v) or "nothing"
    print(
        f"task {task.name}: {len(task.queries)} queries, {len(task.documents)} documents from {source} "
        f"(dropped: {dropped}); model {args.model or MODEL_NAME}, {pooling} pooling, "
        f"max {args.max_length} tokens; torch threads {torch.get_num_threads()}"
    )
    t0 = time.perf_counter()
    results = prune.run_experiment(
        specs,
        task=task,
        model=model,
        tokenizer=tokenizer,
        max_length=args.max_length,
        oracle=not (args.no_oracle or sweep),
        pooling=pooling,
        seed=args.seed,
        resamples=args.resamples,
        keep_embeddings=args.embeddings,
        seeds=args.seeds,
    )
    total = time.perf_counter() - t0
    print(prune.format_table(results))
    ok, msg = prune.self_check(results[0])
    print(msg)
    if not ok:
        print(
            "graphattn prune: the self-check failed, so nothing was written (the dense row does not reproduce "
            "Hugging Face eager; see the message above)",
            file=sys.stderr,
        )
        return 1
    results.meta.update(
        model=args.model or MODEL_NAME,
        source=source,
        seconds=total,
        self_check=msg,
        passed=ok,
        arguments={k: v for k, v in vars(args).items() if k != "func"},
        **_provenance(),
    )
    results.meta.update(torch_threads=torch.get_num_threads())
    if sweep:
        results.meta["sweep"] = [[spec.name, group, x] for spec, (_, group, x) in zip(specs, sweep)]
    figure = sweep_figure if sweep else fidelity_figure
    paths = prune.write_outputs(results, args.out, results.meta, args.json, figure=figure, tables=True)
    print(f"{len(results)} rows in {total:.1f} s; wrote {', '.join(paths.values())}")
    return 0


def fidelity_figure(results, meta: dict):
    """The task metric against attention FLOPs, fidelity against density, and per-layer drift.

    Left: the headline metric (MRR, or NLL for a causal LM) with its 95 %
    interval against attention GFLOPs (log scale); realisable patterns joined
    by their Pareto front, rows that need every dense score first (top-k,
    threshold, oracle) hollow and grey, off the front: their FLOPs include the
    dense scores they select from, they are not a saving; BM25 as a line.
    Middle: sentence-embedding cosine to dense against density, the front
    (:func:`graphattn.viz.pareto`) drawn through the realisable rows only, the
    others hollow and grey beside it. Right: per-layer relative output error
    of the realisable patterns (drift through the layers). A
    ``matplotlib.figure.Figure`` of its own, outside pyplot, so nothing global
    (the backend) changes.
    """
    from matplotlib.figure import Figure

    from graphattn import viz

    fig = Figure(figsize=(16, 5), layout="constrained")
    axes = fig.subplots(1, 3)
    _task_panel(axes[0], results)
    realisable = [r for r in results if r.get("realisable") is True]
    viz.pareto(realisable, ax=axes[1], x="density", y="cos_mean", family="family")
    needs = [r for r in results if r.get("realisable") is False]
    if needs:
        axes[1].plot(
            [r["density"] for r in needs],
            [r["cos_mean"] for r in needs],
            "o",
            color="0.55",
            mfc="white",
            label="needs dense scores\n(top-k, oracle): off the front",
        )
    cosines = [r["cos_mean"] for r in results if r.get("realisable") is not None]
    axes[1].set_ylim(min(cosines) - 0.03, 1.01)  # every row in view, the realisable front's lowest point too
    axes[1].set_xscale("log")
    axes[1].set_xlabel("density (fraction of the model's edges kept)")
    axes[1].set_ylabel("document-embedding cosine to dense (mean)")
    axes[1].legend(fontsize=7, loc="lower left")  # left of the front, which climbs from the sparsest realisable row
    _drift_panel(axes[2], results)
    for ax, title in zip(
        axes,
        (
            "the task against attention cost",
            "fidelity to dense against density",
            "per-layer drift (realisable patterns)",
        ),
    ):
        ax.set_title(title, fontsize=10)
    fig.suptitle(
        f"{meta.get('model', '')}: task {meta.get('task')}, {meta.get('queries')} queries, "
        f"{meta.get('documents')} documents, <= {meta.get('max_length')} tokens"
    )
    return fig


def _task_panel(ax, results) -> None:
    from matplotlib import ticker

    metric = "nll" if "nll" in results[0] else ("MRR" if "MRR" in results[0] else "cos_mean")
    labelled = []
    for realisable, style in ((True, dict(fmt="o", color="C0")), (False, dict(fmt="o", color="0.55", mfc="white"))):
        rows = [r for r in results if r.get("realisable") is realisable]
        if not rows:
            continue
        x, y = [r["attn_gflop"] for r in rows], [r[metric] for r in rows]
        err = None
        if f"{metric}_lo" in rows[0]:
            err = [
                [max(0.0, r[f"{metric}_delta"] - r[f"{metric}_lo"]) for r in rows],
                [max(0.0, r[f"{metric}_hi"] - r[f"{metric}_delta"]) for r in rows],
            ]
        ax.errorbar(
            x,
            y,
            yerr=err,
            capsize=3,
            linestyle="none",
            label="realisable patterns" if realisable else "needs dense scores (top-k, oracle): not a saving",
            **style,
        )
        labelled.append((rows, style["color"], not realisable))
    front = sorted((r for r in results if r["realisable"] is True), key=lambda r: r["attn_gflop"])
    sign = -1.0 if metric == "nll" else 1.0  # lower NLL is better
    best, xs, ys = -float("inf"), [], []
    for r in front:
        if sign * r[metric] > best:
            best = sign * r[metric]
            xs.append(r["attn_gflop"])
            ys.append(r[metric])
    ax.plot(xs, ys, "--", color="C0", lw=1, label="realisable front")
    _labels(ax, labelled, metric)
    ax.axhline(results[0][metric], color="0.3", lw=0.8, ls=":", label=f"dense ({results[0][metric]:.3f})")
    for r in results:
        if r["pattern"] == "bm25" and metric in r:
            ax.axhline(r[metric], color="C3", lw=0.8, ls="-.", label=f"BM25, no model ({r[metric]:.3f})")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    ax.xaxis.set_minor_formatter(ticker.FormatStrFormatter("%g"))
    ax.set_xlabel("attention GFLOPs (data-dependent rows: + dense scores)")
    ax.set_ylabel(f"{metric} (bars: paired 95 % CI of the difference from dense)")
    ax.legend(fontsize=7, loc="lower right")


def _labels(ax, labelled, metric) -> None:
    """Realisable patterns labelled beside their points; the dense row and the data-dependent ones, which
    crowd together near dense cost, listed in a column in the lower middle, each joined to its point.
    """
    column = []
    for rows, color, crowded in labelled:
        for r in rows:
            if crowded or r["pattern"] == "full":
                column.append((r, color))
            else:
                ax.annotate(
                    r["pattern"],
                    (r["attn_gflop"], r[metric]),
                    xytext=(5, 3),
                    textcoords="offset points",
                    fontsize=6,
                    color=color,
                )
    gap = min(0.05, 0.4 / max(len(column), 1))
    for k, (r, color) in enumerate(sorted(column, key=lambda rc: -rc[0][metric])):  # top to bottom: no crossings
        ax.annotate(
            r["pattern"] + (" (dense)" if r["pattern"] == "full" else ""),
            (r["attn_gflop"], r[metric]),
            xytext=(0.22, 0.62 - k * gap),
            textcoords="axes fraction",
            fontsize=6,
            color=color,
            va="center",
            arrowprops=dict(arrowstyle="-", color=color, lw=0.4, alpha=0.6, shrinkA=1, shrinkB=3),
        )


def _drift_panel(ax, results) -> None:
    per_layer = getattr(results, "per_layer", None) or []
    names = [r["pattern"] for r in results[1:] if r.get("realisable") is True]
    for k, name in enumerate(names, start=1):  # C0 is dense's in the middle panel: the same colour per pattern
        rows = [r for r in per_layer if r["pattern"] == name]
        ax.plot([r["layer"] for r in rows], [r["out_err"] for r in rows], "o-", color=f"C{k % 10}", label=name)
        oracle = [r for r in per_layer if r["pattern"] == f"oracle({name})"]
        if oracle:
            ax.plot([r["layer"] for r in oracle], [r["out_err"] for r in oracle], "--", color=f"C{k % 10}", lw=1)
    ax.set_xlabel("layer")
    ax.set_ylabel("relative attention-output error (dashed: its oracle)")
    ax.set_yscale("log")
    if names:
        ax.legend(fontsize=7)


def sweep_figure(results, meta: dict):
    """``--sweep``: the task metric against keys per query (CI bands), the global and the layer ablations.

    Left: MRR against k for a window, window + [CLS] and oracle top-k (dashed:
    data-dependent, not a saving), each with its paired 95 % band, dense as a
    line. Middle: the change in MRR of ``window:8`` with each set of global
    tokens. Right: the change in MRR of ``window:8`` in one layer only, and
    from layer l on.
    """
    from matplotlib.figure import Figure

    metric = "MRR" if "MRR" in results[0] else "cos_mean"
    rows = {r["pattern"]: r for r in results}
    groups: dict[str, list] = {}
    for name, group, x in meta["sweep"]:
        groups.setdefault(group, []).append((x, rows[name]))
    fig = Figure(figsize=(16, 5), layout="constrained")
    axes = fig.subplots(1, 3)
    dense = results[0][metric]
    for k, group in enumerate(("window", "window|cls", "topk")):
        xs, rs = zip(*groups[group])
        y = [r[metric] for r in rs]
        axes[0].plot(
            xs,
            y,
            "o--" if group == "topk" else "o-",
            color=f"C{k}",
            label=group + (" (needs dense scores: not a saving)" if group == "topk" else ""),
        )
        if f"{metric}_lo" in rs[0]:
            axes[0].fill_between(
                xs,
                [dense + r[f"{metric}_lo"] for r in rs],
                [dense + r[f"{metric}_hi"] for r in rs],
                color=f"C{k}",
                alpha=0.15,
            )
    axes[0].axhline(dense, color="0.3", ls=":", lw=0.8, label=f"dense ({dense:.3f})")
    axes[0].set_xscale("log", base=2)
    axes[0].set_xlabel("keys per query k")
    axes[0].set_ylabel(f"{metric} (bands: paired 95 % CI)")
    axes[0].legend(fontsize=7, loc="lower right")
    _bars(axes[1], groups["globals"], metric, "window:8 with global tokens")
    layers = [(f"only {x}", r) for x, r in groups["one layer"]]
    layers += [(f"from {x}", r) for x, r in groups["from layer"]]
    _bars(axes[2], layers, metric, "window:8 in layer l only / from layer l on")
    fig.suptitle(f"{meta.get('model', '')}: sweep on task {meta.get('task')}, {meta.get('queries')} queries")
    return fig


def _bars(ax, items, metric, title):
    labels = [str(x) for x, _ in items]
    rs = [r for _, r in items]
    delta = [r.get(f"{metric}_delta", 0.0) for r in rs]
    err = [
        [d - r.get(f"{metric}_lo", d) for d, r in zip(delta, rs)],
        [r.get(f"{metric}_hi", d) - d for d, r in zip(delta, rs)],
    ]
    ax.bar(range(len(rs)), delta, yerr=err, capsize=3, color="C0", alpha=0.8)
    ax.axhline(0, color="0.3", lw=0.8)
    ax.set_xticks(range(len(rs)), labels, fontsize=7, rotation=30)
    ax.set_ylabel(f"change in {metric} against dense (95 % CI)")
    ax.set_title(title, fontsize=10)


def _provenance() -> dict:
    """Versions of the packages that shape the numbers, the git commit, date and load (:mod:`graphattn.provenance`)."""
    from graphattn.provenance import environment

    return environment(("torch", "transformers", "ranx", "scipy", "numpy"))
