"""argparse types shared by the commands: bounded numbers and name lists, refused with one clear line.

Each type is made for one option and raises ``argparse.ArgumentTypeError``
with the project's template (``Expected '--limit' to be ... (got ...)``),
which :func:`graphattn.cli.main` prints as ``graphattn <command>: error: ...``
with exit 2, before anything is loaded or allocated.
"""

from __future__ import annotations

import argparse
import math
import os

__all__ = ["int_in", "float_in", "names", "ints", "cpu_threads", "out_path"]


def message(name: str, expected: str, got, fix: str = "", *, verb: str = "be") -> str:
    """:func:`graphattn.validate.message`, imported when an option is refused (validate imports torch, which
    ``graphattn COMMAND --help`` does not need).
    """
    from graphattn.validate import message as template

    return template(name, expected, got, fix, verb=verb)


def int_in(name: str, low: int, high: int):
    """An int in ``[low, high]`` (huge values refused here, not deep in torch)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(message(name, f"an int in [{low}, {high}]", repr(text)))
        return value

    return parse


def float_in(name: str, low: float, high: float):
    """A finite float in ``(low, high]``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and low < value <= high):
            raise argparse.ArgumentTypeError(message(name, f"a number in ({low:g}, {high:g}]", repr(text)))
        return value

    return parse


def ints(name: str, low: int, high: int):
    """Comma-separated ints, each in ``[low, high]``."""
    one = int_in(name, low, high)
    return lambda text: tuple(one(t) for t in text.split(","))


def names(name: str, allowed):
    """A comma-separated, non-empty subset of ``allowed``."""

    def parse(text: str) -> tuple[str, ...]:
        picked = tuple(t.strip() for t in text.split(",") if t.strip())
        if not picked or any(n not in allowed for n in picked):
            raise argparse.ArgumentTypeError(
                message(name, f"a comma-separated subset of {', '.join(allowed)}", repr(text))
            )
        return picked

    return parse


def cpu_threads(name: str):
    """A thread count in ``[1, os.cpu_count()]`` (more threads than cores only slow torch down)."""
    return int_in(name, 1, os.cpu_count() or 1)


def out_path(name: str, kind: str = "dir", convert=str):
    """A folder (``kind="dir"``) or file (``"file"``) that can be written, checked before any work runs.

    The nearest existing folder must take a new entry (probed with a temporary
    folder, removed at once), so that an output under ``/proc`` or a read-only
    mount is refused at parse time instead of after a long run.
    """
    import tempfile
    from pathlib import Path

    def parse(text: str):
        path = Path(text)
        if kind == "dir" and path.exists() and not path.is_dir():
            raise argparse.ArgumentTypeError(message(name, "a folder", repr(text), "it is a file"))
        if kind == "file" and path.is_dir():
            raise argparse.ArgumentTypeError(message(name, "a file path", repr(text), "it is a folder"))
        folder = path if kind == "dir" else path.parent
        existing = next((p for p in (folder, *folder.parents) if p.exists()), Path("."))
        try:
            if not existing.is_dir():
                raise NotADirectoryError(f"{existing} is not a folder")
            os.rmdir(tempfile.mkdtemp(dir=existing, prefix=".graphattn-"))
        except OSError as err:
            raise argparse.ArgumentTypeError(
                message(
                    name,
                    f"a {'folder' if kind == 'dir' else 'file'} that can be created and written",
                    repr(text),
                    err.strerror or str(err),
                )
            ) from None
        return convert(text)

    return parse
