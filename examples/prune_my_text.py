"""A pruning sweep on your own text: what each sparse pattern keeps of dense attention.

    python examples/prune_my_text.py my_notes.txt --patterns window:8 'window:8|global:0' topk:8 --limit 32

Reads one passage per line of the file, runs all-MiniLM-L6-v2 dense (the
reference) and once per pattern with graph attention on the kept edges only,
and prints the table of :mod:`graphattn.prune` (density, attention mass kept,
KL, sentence-embedding cosine to dense, retrieval fidelity, FLOPs, seconds).
Each fixed pattern is followed by its oracle: top-k of the dense weights with
the same number of edges. Writes ``prune.csv``, ``prune.json`` and the Pareto
plot ``prune.png`` into ``--out`` (default ``prune-my-text-out/`` in the current
folder: its own, so that it never replaces the files of ``graphattn prune``,
which writes to ``prune-out/``).

This is the library call behind ``graphattn prune --text FILE``; use it as a
starting point for your own experiment.
"""

from __future__ import annotations

import argparse
import sys

import torch

DEFAULT_OUT = "prune-my-text-out"  # this example's own folder (in .gitignore), never graphattn prune's prune-out/


def main(argv=None) -> int:
    from graphattn import prune
    from graphattn.cli.prune import fidelity_figure

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("text", help="a UTF-8 text file, one passage per line")
    parser.add_argument(
        "--patterns",
        nargs="+",
        default=["window:8", "window:8|global:0", "random:16", "topk:8"],
        metavar="SPEC",
        help="pattern specs (see graphattn prune --help)",
    )
    parser.add_argument("--limit", type=int, default=32, help="most passages, evenly spaced (default 32)")
    parser.add_argument("--max-length", type=int, default=128, help="most tokens per passage (default 128)")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args(argv)

    torch.set_num_threads(max(1, args.threads))
    try:
        passages = prune.corpus.read_passages(args.text, args.limit, max_length=args.max_length)
        if len(passages) < 3:
            raise ValueError(f"Expected at least 3 passages in {args.text} (got {len(passages)})")
    except (OSError, ValueError) as err:
        print(f"prune_my_text: {err}", file=sys.stderr)
        return 2
    model, tokenizer = prune.load_model()
    results = prune.run_experiment(
        args.patterns, passages, model=model, tokenizer=tokenizer, max_length=args.max_length
    )
    print(prune.format_table(results))
    ok, message = prune.self_check(results[0])
    print(message)
    meta = {
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "source": args.text,
        "passages": len(passages),
        "max_length": args.max_length,
    }
    paths = prune.write_outputs(results, args.out, meta, figure=fidelity_figure)
    print("wrote", ", ".join(paths.values()))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
