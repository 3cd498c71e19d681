"""The text to train on: the CPython standard library's own sources, as bytes, split by file.

Every CPython ships its standard library (``sysconfig.get_paths()["stdlib"]``):
about 870 ``*.py`` files and 13 MB without the test suites, long documents
with long-range structure (an identifier defined at the top of a file and
used hundreds of bytes later). Nothing is downloaded.

Steps (:func:`load_corpus`):

1) list the ``*.py`` files under the root, sorted by their relative POSIX path,
   leaving out test suites (a path component ``test``, ``tests``,
   ``idle_test`` or a file ``test_*.py``) and ``site-packages``;
2) put each file into train / validation / test by a fixed hash of its
   relative path (:func:`split_of`, SHA-256, 90 / 5 / 5 %): the same file is
   always in the same split, on every machine and Python version that ships it;
3) concatenate each split's files as bytes, each followed by one NUL byte (a
   document separator the sources never contain), into a ``uint8`` tensor.

A byte-level model needs no tokenizer: the vocabulary is the 256 byte values,
and bits per byte is the loss in nats divided by ln 2.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass, field

import torch
from torch import Tensor

from graphattn.validate import message

__all__ = [
    "SPLITS",
    "VOCAB",
    "SEPARATOR",
    "Corpus",
    "stdlib_root",
    "stdlib_files",
    "split_of",
    "load_corpus",
    "sample_batch",
    "eval_windows",
]

SPLITS = ("train", "val", "test")
VOCAB = 256  # byte values
SEPARATOR = b"\x00"  # after each file
_TEST_PARTS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}


def stdlib_root() -> str:
    """The folder of the running Python's standard library (``sysconfig.get_paths()["stdlib"]``)."""
    return sysconfig.get_paths()["stdlib"]


def stdlib_files(root: str | None = None) -> list[str]:
    """Relative POSIX paths of the library's ``*.py`` files without the test suites, sorted.

    Parameters
    ----------
    root : str, optional
        Default :func:`stdlib_root`.

    Raises
    ------
    FileNotFoundError
        If ``root`` holds no such file.
    """
    root = root or stdlib_root()
    paths = []
    for folder, dirs, files in os.walk(root):
        rel_dir = os.path.relpath(folder, root).replace(os.sep, "/")
        dirs[:] = sorted(d for d in dirs if d not in _TEST_PARTS)
        for name in files:
            if name.endswith(".py") and not name.startswith("test_"):
                paths.append(name if rel_dir == "." else f"{rel_dir}/{name}")
    if not paths:
        raise FileNotFoundError(message("root", "Python sources", f"{root!r} with no *.py files", verb="hold"))
    return sorted(paths)


def split_of(path: str, val: float = 0.05, test: float = 0.05) -> str:
    """``"train"``, ``"val"`` or ``"test"`` for a relative path, from a fixed hash of the path.

    The first 8 bytes of SHA-256 of the UTF-8 path, as a fraction u in [0, 1):
    ``u < val`` is validation, ``u < val + test`` test, the rest train.

    Examples
    --------
    >>> split_of("json/decoder.py") in ("train", "val", "test")
    True
    """
    u = int.from_bytes(hashlib.sha256(path.encode()).digest()[:8], "big") / 2.0**64  # uniform in [0, 1)
    return "val" if u < val else ("test" if u < val + test else "train")


@dataclass
class Corpus:
    """The three splits as ``uint8`` tensors, the files of each, and a hash of everything read.

    ``sha256`` hashes every path and file content in order, so two runs on the
    same corpus have the same hash (it goes into the results' meta).
    """

    train: Tensor
    val: Tensor
    test: Tensor
    files: dict = field(default_factory=dict)  # split -> list of relative paths
    sha256: str = ""
    root: str = ""

    def split(self, name: str) -> Tensor:
        """The bytes of split ``name`` (``train``, ``val`` or ``test``)."""
        if name not in SPLITS:
            raise ValueError(message("split", f"one of {', '.join(SPLITS)}", repr(name)))
        return getattr(self, name)

    def sizes(self) -> dict:
        """Bytes per split."""
        return {name: int(self.split(name).numel()) for name in SPLITS}


def load_corpus(root: str | None = None, max_bytes: int | None = None) -> Corpus:
    """Read the standard library's sources and split them by file (module docstring, steps 1-3).

    Parameters
    ----------
    root : str, optional
        Default :func:`stdlib_root`.
    max_bytes : int, optional
        Keep at most this many bytes of each split (its first files), for
        quick runs; the split itself does not change.

    Returns
    -------
    Corpus
    """
    root = root or stdlib_root()
    digest = hashlib.sha256()
    parts: dict[str, list[bytes]] = {name: [] for name in SPLITS}
    files: dict[str, list[str]] = {name: [] for name in SPLITS}
    used = dict.fromkeys(SPLITS, 0)
    for path in stdlib_files(root):
        split = split_of(path)
        if max_bytes is not None and used[split] >= max_bytes:
            continue
        with open(os.path.join(root, *path.split("/")), "rb") as fh:
            content = fh.read().replace(SEPARATOR, b"")
        digest.update(path.encode() + SEPARATOR + content + SEPARATOR)
        parts[split].append(content + SEPARATOR)
        files[split].append(path)
        used[split] += len(content) + 1
    tensors = {}
    for name in SPLITS:
        blob = b"".join(parts[name])[:max_bytes]
        tensors[name] = (
            torch.frombuffer(bytearray(blob), dtype=torch.uint8) if blob else torch.zeros(0, dtype=torch.uint8)
        )
    return Corpus(**tensors, files=files, sha256=digest.hexdigest(), root=root)


def sample_batch(data: Tensor, batch: int, length: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``batch`` random windows of ``length + 1`` bytes: inputs and next-byte targets.

    Returns
    -------
    x, y : LongTensor, shape (batch, length)
        ``y[b, t] = x[b, t + 1]`` in the text.

    Raises
    ------
    ValueError
        If ``data`` is not longer than ``length``.
    """
    if data.numel() <= length + 1:
        raise ValueError(message("data", f"more than {length + 1} bytes", data.numel(), verb="hold"))
    start = torch.randint(0, data.numel() - length - 1, (batch,), generator=generator)  # (batch,)
    rows = start[:, None] + torch.arange(length + 1)  # (batch, length + 1)
    chunk = data[rows].long()  # (batch, length + 1)
    return chunk[:, :-1], chunk[:, 1:]


def eval_windows(data: Tensor, length: int, count: int) -> tuple[Tensor, Tensor]:
    """``count`` evenly spaced, non-random windows over a split (the same ones every evaluation).

    Returns
    -------
    x, y : LongTensor, shape (count, length)
    """
    if data.numel() <= length + 1:
        raise ValueError(message("data", f"more than {length + 1} bytes", data.numel(), verb="hold"))
    last = data.numel() - length - 1
    start = torch.linspace(0, last, count).long()  # (count,)
    rows = start[:, None] + torch.arange(length + 1)  # (count, length + 1)
    chunk = data[rows].long()  # (count, length + 1)
    return chunk[:, :-1], chunk[:, 1:]
