"""Bridges to other attention implementations.

- :mod:`graphattn.interop.hf`: run Hugging Face transformers models (BERT,
  GPT-2, ...) with every attention layer as graph attention
  (``attn_implementation="graphattn"``), the packaged all-MiniLM-L6-v2 loader,
  sentence embeddings, and the per-layer sparsity hook.
- :mod:`graphattn.interop.masks`: transformers' attention masks as one
  disjoint graph per batch (padding = absent nodes), sparsity intersected in.
- :mod:`graphattn.interop.records`: :class:`AttentionRecord`, the per-sentence
  attention graphs (tokens, ``edge_index`` and ``alpha`` per layer) that the
  analysis, plotting and pruning code consume.
- :mod:`graphattn.interop.explain`: the ``graphattn explain`` command.

``nn.MultiheadAttention`` interop lives on the layer itself
(``AttentionConv.from_multihead_attention``). Nothing heavy is imported here:
the names below load transformers on first use.
"""

import importlib

_LAZY = {
    "register": "hf", "graph_attention_forward": "hf", "sparsity": "hf", "attention_conv_from_hf": "hf",
    "load_minilm": "hf", "sentence_embeddings": "hf",
    "AttentionRecord": "records", "attention_records": "records",
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f"graphattn.interop.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'graphattn.interop' has no attribute {name!r}")
