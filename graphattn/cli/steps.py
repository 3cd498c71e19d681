"""``graphattn steps``: the six steps of self-attention on a tiny example (:mod:`graphattn.steps`)."""

from __future__ import annotations

import argparse
import math

from graphattn.cli.args import int_in, message
from graphattn.steps import WORKED_SCORES

__all__ = ["add_arguments", "main"]

SEEDS = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed accepts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``graphattn steps``; sizes stay small, since every matrix is printed."""
    parser.add_argument("--length", type=int_in("--length", 1, 64), default=3, help="number of tokens L (default 3)")
    parser.add_argument("--dim", type=int_in("--dim", 1, 64), default=4, help="token width d = d_k (default 4)")
    parser.add_argument(
        "--seed", type=int_in("--seed", *SEEDS), default=0, help="seed of the random tokens and weights (default 0)"
    )
    parser.add_argument("--causal", action="store_true", help="apply a causal mask in step 4 (default: no mask)")
    parser.add_argument(
        "--decimals", type=int_in("--decimals", 0, 12), default=4, help="digits after the point (default 4)"
    )
    parser.add_argument(
        "--scores",
        type=float,
        nargs="+",
        default=list(WORKED_SCORES),
        metavar="S",
        help="raw scores of the worked example (default 2.1 0.4 -0.3)",
    )
    parser.add_argument(
        "--d-k",
        type=int_in("--d-k", 1, 10**6),
        default=4,
        dest="d_k",
        help="d_k of the worked example (default 4, the book's)",
    )
    parser.add_argument(
        "--node",
        type=int_in("--node", 0, 63),
        default=None,
        help="the query whose softmax over incoming edges is spelled out (default: the last)",
    )
    parser.add_argument(
        "--minilm",
        action="store_true",
        help="also measure the errata about a pretrained model on all-MiniLM-L6-v2 (a few seconds)",
    )


def main(args: argparse.Namespace) -> int:
    """Print the six steps, the worked example and the errata; return 0 (a bad value raises ValueError)."""
    from graphattn.errata import errata, errata_lines
    from graphattn.steps import six_steps_report, worked_report

    if not all(math.isfinite(s) for s in args.scores):
        raise ValueError(message("--scores", "finite numbers", args.scores))
    if args.node is not None and args.node >= args.length:
        raise ValueError(message("--node", f"a token index below --length {args.length}", args.node))
    lines = six_steps_report(args.length, args.dim, args.seed, args.causal, args.decimals, args.node)
    lines += worked_report(args.scores, args.d_k, args.decimals)
    lines += errata_lines(errata(model=args.minilm))
    if not args.minilm:
        lines += ["   (four more claims, about a pretrained model, are measured with --minilm)"]
    print("\n".join(lines))
    return 0
