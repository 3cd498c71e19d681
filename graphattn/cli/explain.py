"""``graphattn explain``: what one token attends to in a real model (:mod:`graphattn.interop.explain`).

Without ``--compare`` it writes three PNG files (one layer and head, the
layers x heads grid, the token's row in every head); with ``--compare`` two:
the token's head-averaged row per layer in both sentences and their
difference, and the same for every head: both sentences on one colour scale,
the difference on its own symmetric scale (+- its largest change).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from graphattn.cli.args import int_in, out_path
from graphattn.interop.explain import DEFAULT_OUT, ENGLISH_ONLY
from graphattn.validate import message

__all__ = ["add_arguments", "main"]

MAX_INDEX = 10**6  # far above any model's layers, heads or tokens; refused with one line above that
DIVERGING = "RdBu_r"  # the difference: red = more weight in TEXT, blue = more in the --compare sentence


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``graphattn explain`` options."""
    parser.add_argument("text", metavar="TEXT", help="the input sentence (quote it)")
    parser.add_argument(
        "--token",
        required=True,
        metavar="WORD",
        help="the query token: a word of TEXT (case-insensitive; a word split into pieces "
        "is represented by its first piece), or WORD@POSITION for a repeated token as "
        f"printed (the@7); {ENGLISH_ONLY}, a word it turns into [UNK] is refused",
    )
    parser.add_argument(
        "--occurrence",
        type=int_in("--occurrence", 1, MAX_INDEX),
        default=None,
        metavar="K",
        help="which occurrence of WORD, counting from 1 (default: 1)",
    )
    parser.add_argument(
        "--compare",
        default=None,
        metavar="SENTENCE",
        help="a second sentence with as many tokens as TEXT (a minimal pair): print both, "
        "draw both rows of WORD on one colour scale and their difference on its own",
    )
    parser.add_argument(
        "--keys",
        nargs="+",
        default=(),
        metavar="KEY",
        help="with --compare: print the per-layer table of WORD -> KEY (heads averaged) "
        "in both sentences; KEY as WORD (the@7, and '[CLS]', quoted in a shell)",
    )
    parser.add_argument(
        "--layer",
        type=int_in("--layer", 0, MAX_INDEX),
        default=None,
        metavar="L",
        help="layer of the single heatmap, from 0 (default: the last; not with --compare)",
    )
    parser.add_argument(
        "--head",
        type=int_in("--head", 0, MAX_INDEX),
        default=None,
        metavar="H",
        help="head of the single heatmap, from 0 (default: the strongest head for WORD there; not with --compare)",
    )
    parser.add_argument(
        "--top", type=int_in("--top", 1, MAX_INDEX), default=3, metavar="K", help="keys listed per layer (default: 3)"
    )
    parser.add_argument(
        "--out",
        type=out_path("--out"),
        default=DEFAULT_OUT,
        metavar="DIR",
        help=f"directory for the PNG files (default: {DEFAULT_OUT})",
    )


def main(args: argparse.Namespace) -> int:
    """Run ``graphattn explain``; 0 on success (a bad token, key, layer or head raises ValueError: exit 2)."""
    from graphattn.interop.explain import compare, explain

    if args.compare is None:
        if args.keys:
            raise ValueError(message("--keys", "used with --compare", " ".join(args.keys)))
        result = explain(
            args.text, args.token, occurrence=args.occurrence, layer=args.layer, head=args.head, top=args.top
        )
        paths = _plot(
            result["weights"], result["labels"], result["query"], result["layer"], result["head"], Path(args.out)
        )
    else:
        for option in ("layer", "head"):
            if getattr(args, option) is not None:
                raise ValueError(
                    message(
                        f"--{option}", "left out with --compare (it draws no single heatmap)", getattr(args, option)
                    )
                )
        result = compare(args.text, args.compare, args.token, keys=args.keys, occurrence=args.occurrence, top=args.top)
        paths = _plot_compare(result, Path(args.out))
    for path in paths:
        print(f"wrote {path}")
    return 0


def _file_name(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", label).strip("_") or "token"


def _plot(weights, tokens: list[str], query: int, layer: int, head: int, out: Path) -> list[Path]:
    """Write the three PNG files; return their paths."""
    import matplotlib.pyplot as plt

    from graphattn import viz

    out.mkdir(parents=True, exist_ok=True)
    num_tokens = len(tokens)
    paths = [
        out / f"heatmap_layer{layer}_head{head}.png",
        out / "grid.png",
        out / f"query_{_file_name(tokens[query])}.png",
    ]

    side = min(max(4.0, 0.32 * num_tokens + 2), 16.0)
    labels = tokens if num_tokens <= 64 else None  # tick labels only while readable
    fig, ax = plt.subplots(figsize=(side + 1, side))
    viz.attention_heatmap(
        weights[layer, head], labels, labels, ax=ax, title=f"layer {layer}, head {head}: row i = what query i reads"
    )
    ax.axhline(query - 0.5, color="w", lw=0.8)
    ax.axhline(query + 0.5, color="w", lw=0.8)
    fig.savefig(paths[0], dpi=120, bbox_inches="tight")
    plt.close(fig)

    fig = viz.head_grid(weights, tokens).flat[0].figure  # sized by viz, constrained layout
    fig.suptitle("attention weights, layers x heads (queries on rows, keys on columns)")
    fig.savefig(paths[1], dpi=80, bbox_inches="tight")
    plt.close(fig)

    fig = viz.head_grid(weights, tokens, query=query).flat[0].figure
    fig.savefig(paths[2], dpi=120, bbox_inches="tight")
    plt.close(fig)
    return paths


def _plot_compare(result: dict, out: Path) -> list[Path]:
    """Write the token's rows in both sentences and their difference: heads averaged, and every head."""
    import matplotlib.pyplot as plt

    a, b = result["runs"]
    query_label = a["labels"][a["query"]]
    diff_labels = [x if x == y else f"{x}/{y}" for x, y in zip(a["labels"], b["labels"])]
    layers, heads = result["heads"].shape[1:3]
    out.mkdir(parents=True, exist_ok=True)
    name = _file_name(query_label)
    paths = [out / f"compare_{name}.png", out / f"compare_{name}_heads.png"]
    panels = dict(col_labels=(a["labels"], b["labels"], diff_labels), names=result["names"], query_label=query_label)
    figures = (
        _three_panels(
            result["rows"], [f"layer {ell}" for ell in range(layers)], what="heads averaged", **panels
        ),  # (2, layers, N)
        _three_panels(
            result["heads"].flatten(1, 2),
            [f"L{ell} h{h}" for ell in range(layers) for h in range(heads)],
            what="every head",
            layers=layers,
            **panels,
        ),
    )  # (2, layers * H, N)
    for fig, path in zip(figures, paths):
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return paths


def _three_panels(rows, row_labels, col_labels, names, query_label: str, what: str, layers: int = 0):
    """Sentence A and B on one scale ``[0, top]``; A - B on its own symmetric scale ``[-d, d]``, d = max |A - B|.

    The difference gets its own scale: on the weights' scale, changes of a few
    hundredths would vanish in a colour bar that runs to the largest weight.

    ``layers`` > 0: the rows are layers x heads, drawn side by side with a line
    between layers; else the rows are layers, stacked with each value written in its cell.
    Returns the pyplot Figure (the caller saves and closes it).
    """
    import matplotlib.pyplot as plt

    from graphattn import viz

    num_rows, num_keys = rows.shape[1:]  # rows: (2, R, N)
    top = float(rows.max())
    spread = float((rows[0] - rows[1]).abs().max()) or 1e-12  # the difference's own symmetric scale
    if layers:
        fig, axes = plt.subplots(
            1, 3, figsize=(3 * (0.35 * num_keys + 1.5) + 2, 0.14 * num_rows + 2.5), layout="constrained"
        )
    else:
        fig, axes = plt.subplots(3, 1, figsize=(0.6 * num_keys + 3, 3 * (0.5 * num_rows + 1.5)), layout="constrained")
    panels = (rows[0], rows[1], rows[0] - rows[1])  # (R, N) each
    titles = (
        f"{names[0]}: what {query_label!r} reads",
        f"{names[1]}: what {query_label!r} reads",
        f"difference {names[0]} - {names[1]}",
    )
    scales = (
        (0.0, top, False, ""),
        (0.0, top, False, ""),
        (-spread, spread, True, f"difference ({names[0]} - {names[1]}), own scale"),
    )
    images = []
    for ax, data, labels, title, cmap, (low, high, bar, label) in zip(
        axes, panels, col_labels, titles, ("viridis", "viridis", DIVERGING), scales
    ):
        images.append(
            viz.attention_heatmap(
                data,
                row_labels,
                labels,
                ax=ax,
                cmap=cmap,
                vmin=low,
                vmax=high,
                title=title,
                annotate=not layers,
                colorbar=bar,
                label=label,
                max_labels=max(num_rows, num_keys),
            )
        )
        ax.set_ylabel(f"{'layer, head' if layers else 'layer'} (query {query_label!r})")
        ax.tick_params(axis="y", labelsize=5 if layers else 9)
        for ell in range(1, layers):
            ax.axhline(ell * num_rows / layers - 0.5, color="w" if cmap == "viridis" else "0.3", lw=0.6)
    fig.colorbar(images[1], ax=list(axes[:2]), label="attention weight", shrink=0.9)  # one bar for both sentences
    fig.suptitle(
        f"what {query_label!r} reads, {what}: both sentences on one scale (each row sums to 1 over the "
        f"keys), their difference on its own scale +-{spread:.3f}"
    )
    return fig
