"""Bridges to other attention implementations.

- :mod:`graphattn.interop.hf`: run Hugging Face transformers models (BERT,
  GPT-2, ...) with every attention layer as graph attention
  (``attn_implementation="graphattn"``; call :func:`register` first, or load
  with :func:`load_model`), the local-model loader (:func:`load_local`, the
  packaged all-MiniLM-L6-v2 by default), the one max-length check, pooling and
  sentence embeddings, and the per-layer hooks :func:`sparsity` and :func:`recording`.
- :mod:`graphattn.interop.local`: local model folders (a folder, or an
  installed package with ``get_model_path()``), their config and pooling.
- :mod:`graphattn.interop.hooks`: the attention function transformers calls,
  and the per-module state of those hooks.
- :mod:`graphattn.interop.masks`: transformers' attention masks as one
  disjoint graph per batch (padding = absent nodes), sparsity intersected in.
- :mod:`graphattn.interop.records`: :class:`AttentionRecord`, the per-sentence
  attention graphs (tokens, ``edge_index`` and ``alpha`` per layer) that the
  analysis, plotting and pruning code consume.
- :mod:`graphattn.interop.hf_conv`: :func:`attention_conv_from_hf`, the way
  to get an :class:`~graphattn.AttentionConv` from a Hugging Face attention
  module.
- :mod:`graphattn.interop.explain`: what one token attends to, per layer and
  head (the library side of ``graphattn explain``).

``nn.MultiheadAttention`` interop lives on the layer itself
(``AttentionConv.from_multihead_attention``). Nothing heavy is imported and
nothing is registered here: transformers is loaded, and ``"graphattn"``
registered, on first use.
"""

import importlib

_LAZY = {
    "register": "hf",
    "graph_attention_forward": "hooks",
    "sparsity": "hf",
    "recording": "hf",
    "check_model": "hf",
    "load_model": "hf",
    "load_local": "hf",
    "load_minilm": "hf",
    "sentence_embeddings": "hf",
    "attention_conv_from_hf": "hf_conv",
    "AttentionRecord": "records",
    "attention_records": "records",
}

_MODULES = {"explain", "hf", "hf_conv", "hooks", "local", "masks", "records"}

__all__ = sorted(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f"graphattn.interop.{_LAZY[name]}"), name)
    if name in _MODULES:
        return importlib.import_module(f"graphattn.interop.{name}")
    raise AttributeError(f"module 'graphattn.interop' has no attribute {name!r}")
