"""The ``graphattn`` command: ``prune``, ``explain``, ``steps``, ``bench``, ``lm``.

A module per subcommand (:mod:`graphattn.cli.prune`, ...), each with
``add_arguments(parser)`` and ``main(args) -> int``; the work itself lives in
the library (``graphattn.prune``, ``graphattn.interop.explain``,
``graphattn.steps``, ``graphattn.bench``), which imports its heavy
dependencies (transformers, matplotlib, pandas) inside functions.

Adding a subcommand ``NAME``: write ``graphattn/cli/NAME.py`` with
``add_arguments(parser)`` and ``main(args) -> int``, and add one line to
:data:`COMMANDS`: ``"NAME": ("graphattn.cli.NAME", "one-line help")``.
Nothing else registers it. The subcommand modules load lazily: ``graphattn
--help`` imports none of them (the one-line help comes from :data:`COMMANDS`),
and ``graphattn NAME ...`` imports only ``graphattn.cli.NAME``, so the command
starts without torch (``python -X importtime -m graphattn.cli --help``); keep
torch and the library out of a command module's top level where its options
do not need them. Show every default in ``--help`` (``"... (default: 8)"`` in the
help text, as :mod:`graphattn.cli.bench` does, or
``parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter``).

One error path: a user error (a bad option, value, path or size, a missing
optional dependency) prints one line ``graphattn <command>: error: ...`` on
stderr and exits 2, whether argparse or the command found it;
``GRAPHATTN_TRACEBACK=1`` shows the traceback instead. Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys

import graphattn

__all__ = ["COMMANDS", "UsageError", "build_parser", "main"]

# subcommand -> (module with add_arguments(parser) and main(args) -> int, one-line help)
COMMANDS = {
    "prune": ("graphattn.cli.prune", "Dense vs sparse attention on a real model: what is lost and saved per pattern."),
    "explain": ("graphattn.cli.explain", "What a token attends to in a real model, per layer and head, with heatmaps."),
    "steps": ("graphattn.cli.steps", "The six steps of self-attention on a tiny example, every intermediate printed."),
    "bench": ("graphattn.cli.bench", "Graph attention against SDPA, FlexAttention and TransformerConv, as ratios."),
    "lm": ("graphattn.cli.lm", "Small byte-level LMs trained with dense and sparse attention: bits per byte vs time."),
}
# what a user can cause: a bad value, index, path or size, a missing optional dependency
USER_ERRORS = (ValueError, IndexError, OSError, OverflowError, MemoryError, ImportError, NotImplementedError)
INSTALL_ALL = "pip install 'graphattn[all]'"


class UsageError(Exception):
    """A bad command line, found by argparse; carries the parser's ``prog`` (``graphattn prune``)."""

    def __init__(self, prog: str, message: str):
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    """argparse, but an error is raised (one line, exit 2 in :func:`main`) instead of usage + exit."""

    def error(self, message: str):
        raise UsageError(self.prog, message)


def build_parser(commands=None) -> argparse.ArgumentParser:
    """The ``graphattn`` parser with one subparser per entry of :data:`COMMANDS`.

    Only the subcommands in ``commands`` (default: all) get their options, which
    imports their modules; the others are listed with their one-line help.
    """
    parser = _Parser(prog="graphattn", description="Self-attention as a graph operation (see README.md).")
    parser.add_argument("--version", action="version", version=f"graphattn {graphattn.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if commands is None or name in commands:
            importlib.import_module(module_name).add_arguments(p)
    return parser


def _command_of(argv: list[str]) -> str | None:
    """The subcommand named on the command line (the first word that is not an option), if any."""
    return next((word for word in argv if not word.startswith("-")), None)


def _one_line(err: BaseException) -> str:
    """The error as one line: its first line, with the type for OS errors, an install hint for imports."""
    lines = str(err).strip().splitlines() or [type(err).__name__]
    text = re.sub(r"^argument [^:]+: (?=Expected)", "", lines[0])  # our types name the option themselves
    if isinstance(err, OSError):
        text = f"{type(err).__name__}: {text}"
    if isinstance(err, ImportError) and "pip install" not in text:
        text = f"a dependency is missing ({text}); install it with: {INSTALL_ALL}"
    return text


def main(argv: list[str] | None = None) -> int:
    """Run ``graphattn``; return the exit code (0 success, 1 a failed self-check, 2 a user error, 130 Ctrl-C,
    141 the output's reader gone: a closed pipe).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(commands=(_command_of(argv),))  # only the command asked for is imported
    try:
        args = parser.parse_args(argv)
    except UsageError as err:
        prog = err.prog
        if prog == parser.prog and argv and argv[0] in COMMANDS:  # an option the command does not know
            prog = f"{prog} {argv[0]}"
        print(f"{prog}: error: {_one_line(err)}", file=sys.stderr)
        return 2
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return int(importlib.import_module(COMMANDS[args.command][0]).main(args) or 0)
    except BrokenPipeError:  # `graphattn steps | head`: the reader left; quiet, as Unix tools are
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 141  # 128 + SIGPIPE, what a shell reports for a tool the pipe stopped
    except USER_ERRORS as err:
        if os.environ.get("GRAPHATTN_TRACEBACK"):
            raise
        print(f"graphattn {args.command}: error: {_one_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"graphattn {args.command}: interrupted", file=sys.stderr)
        return 130
