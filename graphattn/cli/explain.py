"""``graphattn explain``: what one token attends to in a real model (:mod:`graphattn.interop.explain`)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

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

    result = explain(args.text, args.token, occurrence=args.occurrence, layer=args.layer, head=args.head,
                     top=args.top)
    for path in _plot(result["weights"], result["tokens"], result["query"], result["layer"], result["head"],
                      Path(args.out)):
        print(f"wrote {path}")
    return 0


def _plot(weights, tokens: list[str], query: int, layer: int, head: int, out: Path) -> list[Path]:
    """Write the three PNG files; return their paths."""
    import matplotlib.pyplot as plt

    from graphattn import viz

    out.mkdir(parents=True, exist_ok=True)
    num_tokens = len(tokens)
    name = re.sub(r"[^A-Za-z0-9_-]+", "_", tokens[query]).strip("_") or "token"
    paths = [out / f"heatmap_layer{layer}_head{head}.png", out / "grid.png", out / f"query_{name}.png"]

    side = min(max(4.0, 0.32 * num_tokens + 2), 16.0)
    labels = tokens if num_tokens <= 64 else None  # tick labels only while readable
    fig, ax = plt.subplots(figsize=(side + 1, side))
    viz.attention_heatmap(weights[layer, head], labels, labels, ax=ax,
                          title=f"layer {layer}, head {head}: row i = what query i reads")
    ax.axhline(query - 0.5, color="w", lw=0.8)
    ax.axhline(query + 0.5, color="w", lw=0.8)
    fig.savefig(paths[0], dpi=120, bbox_inches="tight")
    plt.close(fig)

    fig = plt.figure(figsize=(1.6 * weights.size(1) + 1, 1.6 * weights.size(0)))
    viz.head_grid(weights, tokens, fig=fig)
    fig.suptitle("attention weights, layers x heads (queries on rows, keys on columns)")
    fig.savefig(paths[1], dpi=80, bbox_inches="tight")
    plt.close(fig)

    fig = plt.figure(figsize=(max(8.0, 2.2 * weights.size(0) + 1), 4))
    viz.head_grid(weights, tokens, query=query, fig=fig)
    fig.savefig(paths[2], dpi=120, bbox_inches="tight")
    plt.close(fig)
    return paths

