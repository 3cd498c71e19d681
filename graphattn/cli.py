"""The ``graphattn`` command: ``prune``, ``explain``, ``steps``, ``bench``.

This module only parses arguments; each subcommand's work lives in the module
that owns the concept, which provides ``add_arguments(parser)`` and
``main(args) -> int`` and imports its heavy dependencies (transformers,
matplotlib, pandas) inside functions, so ``graphattn --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

import graphattn

# subcommand -> (module, function, one-line help); the function takes the parsed namespace
# and returns an exit code. The module also provides ``add_arguments(parser)``.
COMMANDS = {
    "prune": ("graphattn.prune", "Dense vs sparse attention on a real model: what is lost and saved per pattern."),
    "explain": ("graphattn.interop.explain", "What a token attends to in a real model, per layer and head, with heatmaps."),
    "steps": ("graphattn.steps", "The six steps of self-attention on a tiny example, every intermediate printed."),
    "bench": ("graphattn.bench", "Graph attention against SDPA, FlexAttention and TransformerConv, as ratios."),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="graphattn",
        description="Self-attention as a graph operation (see README.md).",
    )
    parser.add_argument("--version", action="version", version=f"graphattn {graphattn.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module_name)
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:  # an optional extra is missing: say so when the command runs
            p.set_defaults(_import_error=err)
            continue
        module.add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    err = getattr(args, "_import_error", None)
    if err is not None:
        print(
            f"graphattn {args.command}: a dependency is missing ({err}); "
            "install it with: pip install 'graphattn[all]'",
            file=sys.stderr,
        )
        return 2
    module = importlib.import_module(args._module)
    try:
        return int(module.main(args) or 0)
    except (OSError, ValueError, OverflowError, MemoryError) as err:
        # A bad path, value or size from the user: one line, not a traceback
        # (GRAPHATTN_TRACEBACK=1 shows the traceback).
        if os.environ.get("GRAPHATTN_TRACEBACK"):
            raise
        print(f"graphattn {args.command}: error: {type(err).__name__}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
