"""The one cache of derived graph structure: least recently used, thread-safe, verified by content.

Three places derive something costly from a graph the caller passes again and
again: the kernels' sorted structure (:mod:`graphattn.ops.structure`), the
edge list of a sparse adjacency (:mod:`graphattn.graphs.adjacency`) and the
graph of a transformers attention mask (:mod:`graphattn.interop.masks`). They
share this class.

An entry is found by a cheap key (the tensors' storage address, shape, dtype
and device, plus whatever the caller adds) and then *verified*: it keeps its
own copy of every tensor it was built from and is served only when those
copies equal the tensors passed now (``torch.equal``, O(E), a small fraction
of the attention it saves). A write that bypasses the version counter
(``edge_index.data[...] = ...``, a NumPy view of the tensor) therefore never
meets a stale structure: the entry no longer matches and is rebuilt. Objects
that are not tensors (patterns) are compared by identity and held by the
entry; they are immutable by contract.

Eviction drops the least recently used entry. When an evicted key is asked for
again soon after (a model that attends over more distinct graphs per step than
the cache keeps, e.g. a ``to_hetero`` model with many edge types), the cache
warns once, naming the size to set (the misses cost a rebuild each, silently
otherwise).
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict

import torch
from torch import Tensor

__all__ = ["ContentCache", "tensor_key"]


def tensor_key(t: Tensor) -> tuple:
    """The lookup part of a tensor: ``(data_ptr, shape, stride, dtype, device)`` (content is verified after)."""
    return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype, str(t.device))


def _fingerprint(tensors: tuple) -> tuple:
    """Two weighted sums of each tensor's values: tells a graph asked for again from a new one at a reused address."""
    out = []
    with torch.inference_mode(False), torch.no_grad():
        for t in tensors:
            x = t.detach().flatten()
            x = x.double() if x.is_floating_point() else x.long()  # (n,)
            w = (torch.arange(x.numel(), device=x.device) * 2654435761 % 2147483647 + 1).to(x.dtype)  # (n,)
            out.append((x.sum().item(), (x * w).sum().item()))
    return tuple(out)


def _snapshot(t: Tensor) -> Tensor:
    """An own, detached copy of ``t`` (inference tensors included) to verify a later hit against."""
    with torch.inference_mode(False), torch.no_grad():
        return t.detach().clone()


class ContentCache:
    """``get(key, tensors, build)``: ``build()``'s result, reused while ``tensors`` hold the same values.

    Parameters
    ----------
    name : str
        Named in the thrashing warning (``"graphattn.ops structure cache"``).
    size : int
        Entries kept; 0 disables caching (every call builds).
    resize_hint : str
        The call that changes the size, named in the warning.
    by_content : bool, default False
        Look entries up by the tensors' values (a fingerprint, then
        ``torch.equal``) instead of their storage address: for inputs that
        arrive as new tensors with old content (a transformers mask, rebuilt
        every forward pass). Costs one host read per lookup.

    Notes
    -----
    One lock guards lookup, insertion and eviction; ``build`` runs outside
    it, so two threads that miss on one graph at once may both build it (the
    results are equal; the later one is kept).
    """

    def __init__(self, name: str, size: int, resize_hint: str, by_content: bool = False):
        self.name, self.size, self.resize_hint, self.by_content = name, int(size), resize_hint, by_content
        self._entries: OrderedDict = OrderedDict()  # key -> (snapshots, owners, value), least recent first
        self._ghosts: OrderedDict = OrderedDict()  # keys evicted lately -> fingerprint (thrash detection)
        self._lock = threading.Lock()
        self.hits = self.misses = self.refills = 0
        self._warned = False

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Drop every entry (and the record of evicted ones)."""
        with self._lock:
            self._entries.clear()
            self._ghosts.clear()

    def resize(self, size: int) -> None:
        """Keep at most ``size`` entries from now on (the least recently used go first)."""
        with self._lock:
            self.size = int(size)
            self._evict()

    def get(self, key: tuple, tensors: tuple = (), build=None, owners: tuple = ()):
        """The cached value for ``key``, verified against ``tensors``, or ``build()``'s, then kept.

        ``owners`` are non-tensor objects the value derives from (compared by
        identity, held by the entry).
        """
        if self.by_content:
            parts = tuple((tuple(t.shape), t.dtype, str(t.device)) for t in tensors) + _fingerprint(tensors)
        else:
            parts = tuple(tensor_key(t) for t in tensors)
        full_key = key + parts + tuple(id(o) for o in owners)
        with self._lock:
            entry = self._entries.get(full_key)
            if entry is not None and self._matches(entry, tensors, owners):
                self._entries.move_to_end(full_key)
                self.hits += 1
                return entry[2]
        value = build()
        if self.size <= 0:
            return value
        snapshots = tuple(_snapshot(t) for t in tensors)
        fingerprint = _fingerprint(tensors) if full_key in self._ghosts else None
        with self._lock:
            self.misses += 1
            if full_key in self._ghosts and self._ghosts.pop(full_key) == fingerprint:
                self.refills += 1
                self._maybe_warn()
            self._entries.pop(full_key, None)
            self._entries[full_key] = (snapshots, owners, value)
            self._evict()
        return value

    @staticmethod
    def _matches(entry, tensors, owners) -> bool:
        snapshots, held, _ = entry
        return all(a is b for a, b in zip(held, owners)) and all(
            s.dtype == t.dtype and torch.equal(s, t) for s, t in zip(snapshots, tensors)
        )

    def _evict(self) -> None:
        while len(self._entries) > max(self.size, 0):
            old, (snapshots, _, _) = self._entries.popitem(last=False)
            self._ghosts[old] = _fingerprint(snapshots)
            while len(self._ghosts) > 4 * max(self.size, 1):
                self._ghosts.popitem(last=False)

    def _maybe_warn(self) -> None:
        if self._warned or self.refills < max(2, self.size):
            return
        self._warned = True
        warnings.warn(
            f"The {self.name} keeps {self.size} graphs and has rebuilt {self.refills} it had just "
            f"evicted: the model uses more distinct graphs than that (one per edge type, layer or "
            f"batch); each miss rebuilds the structure. Raise the size with {self.resize_hint}.",
            RuntimeWarning,
            stacklevel=4,
        )
