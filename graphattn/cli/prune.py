"""``graphattn prune``: the dense-vs-sparse experiment on the packaged MiniLM (:mod:`graphattn.prune`).

Prints the passages' token statistics, a progress bar, the table and the
self-check; writes ``prune.csv``, ``prune.json`` and ``prune.png`` into
``--out``, all or none. Exit 0 when the self-check passes, 1 when it fails,
2 for a user error (one line, from :func:`graphattn.cli.main`).
"""

from __future__ import annotations

import argparse
import time

from graphattn.cli.args import cpu_threads, int_in
from graphattn.prune.corpus import DEFAULT_LIMIT
from graphattn.prune.specs import DEFAULT_PATTERNS, SPEC_HELP, parse_spec

__all__ = ["add_arguments", "main", "fidelity_figure"]

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
PYDOC_SOURCE = "pydoc_data.topics (Python reference documentation)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``graphattn prune``."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "pattern specs:\n" + SPEC_HELP
    parser.add_argument("--patterns", nargs="+", metavar="SPEC", default=None,
                        help=f"pattern specs (default: {' '.join(DEFAULT_PATTERNS)}); the dense row is always first")
    parser.add_argument("--limit", type=int_in("--limit", 3, 100_000), default=DEFAULT_LIMIT, metavar="N",
                        help=f"number of passages (at least 3), evenly spaced over the corpus "
                             f"(default {DEFAULT_LIMIT})")
    parser.add_argument("--max-length", type=int_in("--max-length", 8, 100_000), default=128, metavar="T",
                        help="most tokens per passage, [CLS] and [SEP] included, at most the model's position "
                             "embeddings (512) (default 128)")
    parser.add_argument("--text", metavar="FILE", default=None,
                        help="your own passages, one per line (default: the Python reference documentation, "
                             "pydoc_data.topics)")
    parser.add_argument("--out", metavar="DIR", default="prune-out",
                        help="folder for prune.csv, prune.json, prune.png (default prune-out)")
    parser.add_argument("--json", metavar="FILE", default=None, help="also write the JSON results to FILE")
    parser.add_argument("--threads", type=cpu_threads("--threads"), default=1, metavar="N",
                        help="torch threads, at most the CPU count (default 1: the experiment is many small tensor "
                             "operations, which a second thread barely speeds up and which run several times "
                             "slower when the cores are shared with other work)")
    parser.add_argument("--no-oracle", action="store_true",
                        help="skip the oracle top-k row after each fixed pattern")


def main(args: argparse.Namespace) -> int:
    """Run ``graphattn prune``; 0 when the self-check passes, 1 when it fails (user errors raise)."""
    import torch

    from graphattn import prune

    specs = [parse_spec(s) for s in (args.patterns or DEFAULT_PATTERNS)]
    prune.run.check_max_length(prune.run.model_config(), args.max_length)  # before any weight is loaded
    passages, source = None, PYDOC_SOURCE
    if args.text:
        passages, source = prune.corpus.read_passages(args.text, args.limit, max_length=args.max_length), args.text
        _enough(passages, source)
    model, tokenizer = prune.load_model()
    if passages is None:
        passages = _enough(prune.corpus.pydoc_passages(tokenizer, args.max_length, args.limit), source)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _report(args, specs, passages, source, model, tokenizer)
    finally:
        torch.set_num_threads(threads)  # leave the caller's process as it was


def _enough(passages: list[str], source: str) -> list[str]:
    if len(passages) < 3:  # retrieval fidelity compares pairs of passages
        raise ValueError(f"Expected at least 3 passages (got {len(passages)} from {source})")
    return passages


def _report(args, specs, passages, source, model, tokenizer) -> int:
    import torch

    from graphattn import prune

    lengths = [len(ids) for ids in tokenizer(passages, truncation=True, max_length=args.max_length,
                                             verbose=False)["input_ids"]]
    print(f"{len(passages)} passages from {source}; tokens per passage min {min(lengths)}, "
          f"mean {sum(lengths) / len(lengths):.1f}, max {max(lengths)}; torch threads {torch.get_num_threads()}")
    t0 = time.perf_counter()
    results = prune.run_experiment(specs, passages, model=model, tokenizer=tokenizer, max_length=args.max_length,
                                   oracle=not args.no_oracle)
    total = time.perf_counter() - t0
    print(prune.format_table(results))
    ok, msg = prune.self_check(results[0])
    print(msg)
    meta = {"model": MODEL_NAME, "source": source, "passages": len(passages), "max_length": args.max_length,
            "tokens_per_passage_mean": sum(lengths) / len(lengths), "torch_threads": torch.get_num_threads(),
            "seconds": total, "self_check": msg, "passed": ok}
    paths = prune.write_outputs(results, args.out, meta, args.json, figure=fidelity_figure)
    print(f"{len(results)} rows in {total:.1f} s; wrote {', '.join(paths.values())}")
    return 0 if ok else 1


def fidelity_figure(results: list[dict], meta: dict):
    """Fidelity against density (log scale), one curve per pattern family, with the Pareto front.

    Left: mean sentence-embedding cosine to dense; right: retrieval Spearman
    (:func:`graphattn.viz.pareto`). A ``matplotlib.figure.Figure`` of its own,
    outside pyplot, so nothing global (the backend) changes.
    """
    from matplotlib.figure import Figure

    from graphattn import viz

    fig = Figure(figsize=(12, 4.8), layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, y in zip(axes, ("cos_mean", "spearman")):
        viz.pareto(results, ax=ax, x="density", y=y, family="family")
        ax.set_xscale("log")
    axes[0].set_ylabel("sentence-embedding cosine to dense (mean)")
    axes[1].set_ylabel("retrieval: Spearman of pairwise similarities")
    axes[1].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"{meta['model']}: {meta['passages']} passages, <= {meta['max_length']} tokens")
    return fig
