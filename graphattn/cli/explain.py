"""``graphattn explain``: what one token attends to in a real model (:mod:`graphattn.interop.explain`)."""

from __future__ import annotations

import argparse

from graphattn.cli.args import int_in
from graphattn.interop.explain import DEFAULT_OUT

__all__ = ["add_arguments", "main"]

MAX_INDEX = 10 ** 6  # far above any model's layers, heads or tokens; refused with one line above that


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``graphattn explain`` options."""
    parser.add_argument("text", metavar="TEXT", help="the input sentence (quote it)")
    parser.add_argument("--token", required=True, metavar="WORD",
                        help="the query token: a word of TEXT (case-insensitive; a word split into pieces "
                             "is represented by its first piece)")
    parser.add_argument("--occurrence", type=int_in("--occurrence", 1, MAX_INDEX), default=1, metavar="K",
                        help="which occurrence of WORD, counting from 1 (default: 1)")
    parser.add_argument("--layer", type=int_in("--layer", 0, MAX_INDEX), default=None, metavar="L",
                        help="layer of the single heatmap, from 0 (default: the last)")
    parser.add_argument("--head", type=int_in("--head", 0, MAX_INDEX), default=None, metavar="H",
                        help="head of the single heatmap, from 0 (default: the strongest head for WORD there)")
    parser.add_argument("--top", type=int_in("--top", 1, MAX_INDEX), default=3, metavar="K",
                        help="keys listed per layer (default: 3)")
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                        help=f"directory for the PNG files (default: {DEFAULT_OUT})")


def main(args: argparse.Namespace) -> int:
    """Run ``graphattn explain``; 0 on success (a bad token, layer or head raises ValueError)."""
    from graphattn.interop.explain import explain

    explain(args.text, args.token, occurrence=args.occurrence, layer=args.layer, head=args.head,
            top=args.top, out=args.out)
    return 0
