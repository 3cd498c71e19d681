"""``graphattn bench``: graph attention against SDPA, FlexAttention and TransformerConv (:mod:`graphattn.bench`).

Every option is checked here, and the device before anything is measured, so
a bad value is refused with one line (exit 2) instead of a traceback minutes in.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from graphattn.bench.cases import FULL_SIZES, METHODS, MODES, PATTERNS
from graphattn.cli.args import cpu_threads, float_in, int_in, ints, names, out_path

__all__ = ["add_arguments", "main"]

MAX_L = 2**24  # 16.7M nodes: beyond that every method runs out of memory long before it finishes
DEFAULT_OUT = "bench-out"  # relative to the current folder (in .gitignore), never the package's checkout


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``graphattn bench``; every help text says its default."""
    parser.add_argument(
        "--full",
        action="store_true",
        help=f"the whole grid: L in {','.join(map(str, FULL_SIZES))}, and the linear-scaling sweeps (default: off)",
    )
    parser.add_argument(
        "--sizes",
        type=ints("--sizes", 1, MAX_L),
        default=None,
        help="comma-separated L (default: 1024,4096; with --full the grid above)",
    )
    parser.add_argument(
        "--patterns",
        type=names("--patterns", PATTERNS),
        default=PATTERNS,
        help=f"comma-separated subset of {','.join(PATTERNS)} (default: all)",
    )
    parser.add_argument(
        "--methods",
        type=names("--methods", METHODS),
        default=METHODS,
        help=f"comma-separated subset of {','.join(METHODS)} (default: all)",
    )
    parser.add_argument(
        "--modes",
        type=names("--modes", MODES),
        default=MODES,
        help=f"comma-separated subset of {','.join(MODES)} (default: all)",
    )
    parser.add_argument("--scaling", action="store_true", help="also time graphattn for E = 1e5 ... 1e7 (default: off)")
    parser.add_argument("--heads", type=int_in("--heads", 1, 4096), default=8, help="heads H (default: 8)")
    parser.add_argument("--dim", type=int_in("--dim", 1, 65536), default=64, help="channels per head D (default: 64)")
    parser.add_argument(
        "--dtype", choices=("float32", "float64", "bfloat16"), default="float32", help="(default: float32)"
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, mps (default: cpu)")
    parser.add_argument(
        "--repeats", type=int_in("--repeats", 1, 10_000), default=3, help="timed runs per case (default: 3)"
    )
    parser.add_argument(
        "--threads",
        type=cpu_threads("--threads"),
        default=None,
        help="torch threads, at most the CPU count (default: torch's own)",
    )
    parser.add_argument(
        "--memory-budget",
        type=float_in("--memory-budget", 0, 2**20),
        default=8.0,
        metavar="GIB",
        help="skip a case whose estimated extra memory exceeds this many GiB (default: 8)",
    )
    parser.add_argument(
        "--timeout",
        type=float_in("--timeout", 0, 7 * 86400),
        default=600.0,
        help="seconds per case before it is killed (default: 600)",
    )
    parser.add_argument(
        "--out",
        type=out_path("--out", convert=Path),
        default=Path(DEFAULT_OUT),
        help=f"folder for the CSV/JSON/markdown (and PNG) files, created if needed (default: "
        f"{DEFAULT_OUT}/ in the current folder; nothing is written into the checkout)",
    )
    parser.add_argument("--plot", action="store_true", help="also write a PNG of time vs L per pattern (default: off)")


def main(args: argparse.Namespace, cases: list[dict] | None = None) -> int:
    """Run the grid (or ``cases``), print the table and the targets, write the files; 0 (a bad device raises)."""
    from graphattn import bench

    return bench.run(args, cases)
