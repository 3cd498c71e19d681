"""graphattn: self-attention as a graph operation.

A sequence of L tokens is a graph of L nodes; an edge ``(j, i)`` says "query i
may read key/value j". The complete graph is ordinary self-attention, a DAG is
causal attention, a bipartite graph is cross-attention, and removing edges is
sparse attention. See ``docs/design.md`` in the project for the conventions.

``import graphattn`` loads nothing but this file, so that the ``graphattn``
command starts without torch (``graphattn --help``). Every name loads on first
access: the core (``patterns``, ``graphs``, ``dense``, ``ops``, ``attention``:
torch), the layer (:class:`AttentionConv`, which needs PyTorch Geometric, and
PyTorch Geometric in turn loads pandas and parts of transformers) and the
bridges (:mod:`graphattn.interop`). The one thing registered at import is
graphattn's own ``torch.library`` operators (namespace ``graphattn``,
:mod:`graphattn.ops.operators`), when :mod:`graphattn.ops` is first imported (any
use of the library imports it; before ``torch.export.load`` of a program that
calls them, ``import graphattn.ops``); nothing else registers itself or changes
global state.
"""

import importlib

__version__ = "0.2.0"  # the one place it is written: pyproject.toml reads it; CHANGELOG.md's top entry names it

_LAZY = {
    "dense": ("graphattn.dense", None),
    "graphs": ("graphattn.graphs", None),
    "ops": ("graphattn.ops", None),
    "patterns": ("graphattn.patterns", None),
    "attention": ("graphattn.ops", "attention"),
    "AttentionConv": ("graphattn.conv", "AttentionConv"),
    "conv": ("graphattn.conv", None),
    "interop": ("graphattn.interop", None),
    "distributed": ("graphattn.distributed", None),
    "TransformerConv": ("graphattn.transformer_conv", "TransformerConv"),
    "GATConv": ("graphattn.gat", "GATConv"),
    "GATv2Conv": ("graphattn.gat", "GATv2Conv"),
}

__all__ = [
    "AttentionConv",
    "TransformerConv",
    "GATConv",
    "GATv2Conv",
    "attention",
    "conv",
    "dense",
    "distributed",
    "graphs",
    "interop",
    "ops",
    "patterns",
    "__version__",
]


def __getattr__(name):
    if name in _LAZY:
        module, attr = _LAZY[name]
        found = importlib.import_module(module)
        return found if attr is None else getattr(found, attr)
    raise AttributeError(f"module 'graphattn' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
