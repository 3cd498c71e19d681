"""Run graphattn's benchmarks: the default grid, the issue-5 targets, or the whole grid.

    python benchmarks/run.py              # = graphattn bench (L = 1024, 4096; a few minutes)
    python benchmarks/run.py --targets    # the cases the issue's targets name (about 10-15 minutes)
    python benchmarks/run.py --full       # = graphattn bench --full (L = 1024 ... 16384, scaling sweeps)

Every other option is passed to ``graphattn bench`` (see ``graphattn bench --help``).
Results go to benchmarks/results/ (CSV, JSON with the date and ``lscpu``; PNG with --plot).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from graphattn import bench
from graphattn.cli import bench as command

RESULTS = Path(__file__).resolve().parent / "results"


def target_cases(args) -> list[dict]:
    """The cases named by the issue's targets, nothing else."""
    base = dict(
        heads=args.heads, dim=args.dim, dtype=args.dtype, device=args.device, repeats=args.repeats, threads=args.threads
    )
    cases = []

    def add(patterns, sizes, methods):
        cases.extend(
            dict(base, pattern=p, L=L, method=m, mode=mode)
            for p in patterns
            for L in sizes
            for mode in bench.MODES
            for m in methods
        )

    add(["complete"], [1024, 4096], ["graphattn", "sdpa", "sdpa_mask", "flex"])
    add(["window", "random", "topk"], [4096, 16384], ["graphattn", "sdpa_mask", "flex"])
    add(["window", "random", "topk"], [1024], ["graphattn"])
    add(["window", "random", "topk"], [1024, 4096], ["pyg"])
    cases += [
        dict(base, pattern=p, L=L, method="graphattn", mode="fwd", sweep="scaling")
        for p, sizes in bench.SCALING.items()
        for L in sizes
    ]
    return cases


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", action="store_true", help="only the cases the issue's targets name")
    command.add_arguments(parser)
    parser.set_defaults(out=RESULTS)  # the repository's own record of runs (graphattn bench writes to bench-out/)
    args = parser.parse_args(argv)
    try:
        return command.main(args, target_cases(args) if args.targets else None)
    except ValueError as err:  # a device this machine cannot use
        print(f"benchmarks/run.py: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
