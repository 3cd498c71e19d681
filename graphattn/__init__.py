"""graphattn: self-attention as a graph operation.

A sequence of L tokens is a graph of L nodes; an edge ``(j, i)`` says "query i
may read key/value j". The complete graph is ordinary self-attention, a DAG is
causal attention, a bipartite graph is cross-attention, and removing edges is
sparse attention. See ``DESIGN.md`` in the project for the conventions.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("graphattn")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

from graphattn import dense, graphs, ops, patterns  # noqa: E402
from graphattn.conv import AttentionConv  # noqa: E402
from graphattn.ops import attention  # noqa: E402
from graphattn.transformer_conv import TransformerConv  # noqa: E402

__all__ = [
    "AttentionConv",
    "TransformerConv",
    "attention",
    "dense",
    "graphs",
    "ops",
    "patterns",
    "__version__",
]
