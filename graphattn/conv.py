"""``AttentionConv``: exact multi-head self-attention as a PyG ``MessagePassing`` layer.

The layer knows nothing of Hugging Face: a layer carrying the weights of a
transformers attention module comes from
:func:`graphattn.interop.attention_conv_from_hf`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.parameter import UninitializedParameter
from torch_geometric.nn import MessagePassing

from graphattn import _compat, distributed, ops, routing
from graphattn.dense import reset_like_mha
from graphattn.routing import attend, propagate_index, resolve, use_propagate
from graphattn.validate import (
    as_int,
    check_bool,
    check_choice,
    check_fits_memory,
    check_int,
    check_not_jit,
    check_probability,
    message,
    shape_message,
)

__all__ = ["AttentionConv"]


def _feature_sizes(in_channels) -> tuple[int, int, int]:
    """``in_channels`` as ``(F_k, F_v, F_q)`` from ``F``, ``(F_kv, F_q)`` or ``(F_k, F_v, F_q)``."""
    sizes = None
    if as_int(in_channels) is not None:
        sizes = (as_int(in_channels),) * 3
    elif isinstance(in_channels, (tuple, list)) and len(in_channels) == 2:
        sizes = tuple(as_int(in_channels[i]) for i in (0, 0, 1))
    elif isinstance(in_channels, (tuple, list)) and len(in_channels) == 3:
        sizes = tuple(as_int(f) for f in in_channels)
    if sizes is None or None in sizes:
        raise TypeError(
            message("in_channels", "an int, a pair (F_kv, F_q) or a triple (F_k, F_v, F_q)", repr(in_channels))
        )
    if any(f < 1 and f != -1 for f in sizes):
        raise ValueError(
            message("in_channels", "positive sizes, or -1 for a size inferred at the first call", in_channels)
        )
    return sizes


def _linear(in_features: int, out_features: int, bias: bool) -> nn.Module:
    """``nn.Linear``; PyG's lazy ``Linear`` for -1 (initialised at the first call as ``reset_parameters`` does)."""
    if in_features != -1:
        return nn.Linear(in_features, out_features, bias=bias)
    from torch_geometric.nn.dense.linear import Linear

    return Linear(-1, out_features, bias=bias, weight_initializer="glorot", bias_initializer="zeros")


def _in_width(lin: nn.Module) -> int | None:
    """The input width of a projection; None while a lazy one has not seen its first input, or without a weight."""
    weight = getattr(lin, "weight", None)  # a module of the user's (nn.Sequential(Linear, Tanh)) may have none
    return None if not isinstance(weight, Tensor) or isinstance(weight, UninitializedParameter) else weight.size(1)


class AttentionConv(MessagePassing):
    r"""Scaled dot-product multi-head attention over the edges of a graph.

    The attention of Vaswani et al. [1]_ with the keys of query i restricted to
    the sources of the edges into i. For every edge ``(j, i)`` and head h:

    .. math::
        \alpha_{ij}^h = \mathrm{softmax}_{j \in \mathcal{N}(i)}
            \Big(\frac{(W_Q^h x_i)^\top (W_K^h x_j)}{\sqrt{D}} + b_{ij}^h\Big),
        \qquad
        y_i = W_O \,\big\Vert_{h=1}^{H} \sum_{j \in \mathcal{N}(i)} \alpha_{ij}^h W_V^h x_j

    On the complete graph with self-loops this is exactly
    ``nn.MultiheadAttention`` (see :meth:`from_multihead_attention`). The layer
    never adds or removes edges (no implicit self-loops, no root term): the
    graph you pass is the attention you get. A query with no incoming edge
    gets ``W_O 0 + b_O`` (the zero row of the attention, then the projection).

    On the CPU at one thread (2-16 heads and channels per head, no ``batch``, stock ``Linear`` projections
    without hooks) the rows are projected heads innermost, as in :class:`graphattn.TransformerConv`.

    Parameters
    ----------
    in_channels : int or tuple
        ``F_in``; or ``(F_kv, F_q)`` for cross-attention; or ``(F_k, F_v, F_q)``
        when keys and values come from different features (MHA's kdim != vdim).
        ``-1`` for any of them: the size is taken from the first call (PyG's
        lazy ``Linear``, as in PyG's convs, so ``to_hetero`` works).
    out_channels : int
        Total output size ``F_out = H * D`` (as ``embed_dim`` of ``nn.MultiheadAttention``).
    heads : int, default 1
        H; must divide ``out_channels``.
    dropout : float, default 0.0
        Dropout probability on the attention weights (training only).
    bias : bool, default True
        Biases in the query/key/value and output projections.
    output_projection : bool, default True
        Apply ``lin_out`` (``F_out -> F_out``) after concatenating the heads.
    impl : {"auto", "message_passing"}, default "auto"
        ``"auto"`` runs the fast kernels of :func:`graphattn.attention`;
        ``"message_passing"`` the readable per-edge path through
        :meth:`edge_update` and :meth:`message`. Both give the same result;
        only ``"message_passing"`` goes through ``propagate``, so PyG hooks and
        explainers (e.g. ``GNNExplainer``'s edge masks) need it.
    **kwargs
        Passed to :class:`torch_geometric.nn.MessagePassing`, except ``aggr``
        and ``flow``, which are fixed to ``"add"`` and ``"source_to_target"``.

    Notes
    -----
    - input shapes: ``x (N, F_in)``, or ``(x_kv (S, F_kv), x_q (L, F_q))``, or
      ``(x_k (S, F_k), x_v (S, F_v), x_q (L, F_q))``; ``edge_index (2, E)``
      (row 0 = source j = key, row 1 = target i = query); ``edge_bias (E,)`` or ``(E, H)``
    - output shapes: ``(L, F_out)``; with ``return_attention_weights=True``
      ``(out, (edge_index, alpha))`` with ``alpha (E, H)``

    Raises
    ------
    ValueError
        ``heads`` not dividing ``out_channels``, non-positive sizes or sizes whose
        weights do not fit in memory, ``dropout`` outside [0, 1), an ``aggr``
        or ``flow`` other than the defaults, or features of the wrong size.
    TypeError
        Arguments of the wrong type (``dropout="0.1"``, ``heads=2.0``, ``bias="no"``);
        features that are not floating point or not of the layer's dtype; an
        ``edge_bias`` of another dtype than the features (on both paths).
    NotImplementedError
        Under ``torch.jit.trace`` or ``torch.jit.script`` (use ``torch.compile``
        or ``torch.export``, which trace the ``propagate`` path).

    References
    ----------
    .. [1] A. Vaswani et al., "Attention Is All You Need", NeurIPS 2017, eq. (1) and Sec. 3.2.2.

    Examples
    --------
    >>> import torch, graphattn as ga
    >>> conv = ga.AttentionConv(16, 32, heads=4)
    >>> conv
    AttentionConv(16, 32, heads=4)
    >>> x = torch.randn(5, 16)
    >>> conv(x, ga.patterns.causal().edge_index(5)).shape
    torch.Size([5, 32])
    """

    def __init__(
        self,
        in_channels,
        out_channels: int,
        heads: int = 1,
        dropout: float = 0.0,
        bias: bool = True,
        output_projection: bool = True,
        impl: str = "auto",
        **kwargs,
    ):
        for name, default in (("aggr", "add"), ("flow", "source_to_target")):
            if kwargs.setdefault(name, default) != default:  # attention is a softmax-weighted sum along j -> i
                raise ValueError(message(name, f"{default!r} for attention", repr(kwargs[name])))
        super().__init__(node_dim=0, **kwargs)
        f_k, f_v, f_q = _feature_sizes(in_channels)
        out_channels = check_int("out_channels", out_channels, low=1)
        heads = check_int("heads", heads, low=1)
        if out_channels % heads != 0:
            raise ValueError(message("heads", f"a positive int dividing out_channels = {out_channels}", heads))
        dropout = check_probability("dropout", dropout)
        bias = check_bool("bias", bias)
        output_projection = check_bool("output_projection", output_projection)
        impl = check_choice("impl", impl, ("auto", "message_passing"))
        largest = "out_channels" if out_channels >= max(f_k, f_v, f_q) else "in_channels"
        check_fits_memory(
            largest,
            {"out_channels": out_channels, "in_channels": in_channels}[largest],
            out_channels * (max(f_k, 0) + max(f_v, 0) + max(f_q, 0) + out_channels),
            torch.get_default_dtype().itemsize,
        )
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.heads = heads
        self.dropout = dropout
        self.impl = impl
        self.lin_query = _linear(f_q, out_channels, bias)
        self.lin_key = _linear(f_k, out_channels, bias)
        self.lin_value = _linear(f_v, out_channels, bias)
        self.lin_out = nn.Linear(out_channels, out_channels, bias=bias) if output_projection else None
        self.reset_parameters()

    def reset_parameters(self):
        """Initialise as ``nn.MultiheadAttention`` does (Xavier-uniform weights, zero biases)."""
        super().reset_parameters()
        projections = (self.lin_query, self.lin_key, self.lin_value)
        # a lazy one is initialised the same way at its first call
        reset_like_mha([lin for lin in projections if _in_width(lin) is not None], self.lin_out)

    def _project(self, x, heads_last: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """1) project: ``(query (L, H, D), key (S, H, D), value (S, H, D))``, heads innermost if asked and usable."""
        if isinstance(x, Tensor):
            x_k = x_v = x_q = x
        elif isinstance(x, (tuple, list)) and len(x) == 2:
            x_k = x_v = x[0]
            x_q = x[1]
        elif isinstance(x, (tuple, list)) and len(x) == 3:
            x_k, x_v, x_q = x
        else:
            raise TypeError(message("x", "a Tensor, a pair (x_kv, x_q) or a triple (x_k, x_v, x_q)", type(x).__name__))
        for name, t, lin in (("x_q", x_q, self.lin_query), ("x_k", x_k, self.lin_key), ("x_v", x_v, self.lin_value)):
            width = _in_width(lin)  # None: lazy, any width is taken
            if not isinstance(t, Tensor) or t.dim() != 2 or t.size(-1) != (width or t.size(-1)):
                got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
                raise ValueError(shape_message(name, f"(n, {width or 'F'})", got))
            if not t.is_floating_point():
                raise TypeError(message(name, "floating point", t.dtype))
            if width is not None and t.dtype != lin.weight.dtype:
                fix = f"convert one of them, e.g. conv.to({t.dtype})"
                raise TypeError(message(name, f"the layer's dtype {lin.weight.dtype}", t.dtype, fix, verb="have"))
        lins = (self.lin_query, self.lin_key, self.lin_value)
        return routing.project_rows((x_q, x_k, x_v), lins, self.heads, self.out_channels // self.heads, heads_last)

    def forward(
        self,
        x,
        edge_index: Tensor,
        *,
        edge_bias: Tensor | None = None,
        return_attention_weights: bool = False,
        size=None,
        batch: Tensor | None = None,
        context_parallel=None,
    ):
        """Attend along ``edge_index``.

        Parameters
        ----------
        x : Tensor, shape (N, F_in), or pair ``(x_kv, x_q)``, or triple ``(x_k, x_v, x_q)``
        edge_index : Tensor (2, E), EdgeIndex, sparse ``adj_t (L, S)``, SparseTensor, or graphattn.patterns.Pattern
            Row 0 = source j (key/value), row 1 = target i (query); a sparse
            adjacency is PyG's transposed one (``adj_t[i, j] != 0`` for the edge
            j -> i). A pattern stands for ``pattern.edge_index(L, S)``; the
            complete and causal patterns then run dense SDPA without building
            the L x S edges.
        edge_bias : Tensor, shape (E,) or (E, H), optional
            Added to the scaled scores before the softmax.
        return_attention_weights : bool
            Also return ``(edge_index, alpha)`` with ``alpha`` of shape (E, H)
            (a pattern's edges are then built, so that alpha has an order).
        size : tuple (S, L), optional
            PyG's ``size``; checked against the features.
        batch : Tensor, shape (N,), optional
            PyG's ``batch`` vector: a pattern then applies within each graph
            (``patterns.full()``: every node attends to its own graph), on the
            ragged kernel (see :mod:`graphattn.routing`). Without it a pattern
            spans all N nodes, across graphs. Ignored with an edge list.
        context_parallel : torch.distributed.ProcessGroup, optional
            Run context-parallel over this group (``torch.distributed.group.WORLD``
            for all processes): ``x`` is this process's contiguous block of the
            sequence (blocks in rank order), ``edge_index`` the global graph or
            an :class:`~graphattn.distributed.ExchangePlan` (reused), and
            ``edge_bias`` the bias of the edges into this block; the output is
            this block's, equal to the single-process layer's
            (:func:`graphattn.distributed.attention`). Collective: every process
            calls the layer. Not with ``size``, ``batch`` or ``impl="message_passing"``.

        In explain mode or with a message-passing hook registered the layer runs
        ``propagate`` (:func:`graphattn.routing.use_propagate`); compiled, it
        keeps the fast operators.

        Returns
        -------
        out : Tensor, shape (L, F_out)
        (edge_index, alpha) : (Tensor (2, E), Tensor (E, H)), only if requested.
        """
        check_not_jit(self, "trace")
        check_bool("return_attention_weights", return_attention_weights)
        if context_parallel is not None:
            query, key, value = self._project(x)  # (L, H, D), (S, H, D), (S, H, D)
            return self._context_parallel(
                query, key, value, edge_index, context_parallel, edge_bias, return_attention_weights, size, batch
            )
        slow = use_propagate(self, edge_index, batch)
        query, key, value = self._project(x, heads_last=not slow and batch is None)  # (L|S, H, D)
        edge_index, graph, _ = resolve(
            edge_index, size, batch, key.size(0), query.size(0), slow or return_attention_weights, query.device
        )
        if slow:
            out, alpha = self._message_passing(query, key, value, graph, edge_bias)
        else:
            out, alpha = attend(
                query,
                key,
                value,
                graph,
                batch,
                edge_bias=edge_bias,
                dropout=self.dropout,
                training=self.training,
                need_weights=return_attention_weights,
            )  # (L, H, D), (E, H)
        out = self._combine(out, query.size(0))  # (L, F_out)
        if return_attention_weights:
            return out, (edge_index, alpha)
        return out

    def _combine(self, out: Tensor, num_targets) -> Tensor:
        """The heads concatenated, ``(L, H, D) -> (L, H*D)``, then ``lin_out`` if the layer has one: ``(L, F_out)``."""
        out = out.reshape(num_targets, self.out_channels)  # (L, H*D)
        return out if self.lin_out is None else self.lin_out(out)  # (L, F_out)

    def _context_parallel(self, query, key, value, graph, group, edge_bias, return_attention_weights, size, batch):
        """The block of this process, over a sequence split across ``group`` (:mod:`graphattn.distributed`)."""
        if not isinstance(group, dist.ProcessGroup):
            expected = "a torch.distributed ProcessGroup (e.g. torch.distributed.group.WORLD) or None"
            raise TypeError(message("context_parallel", expected, type(group).__name__))
        if size is not None or batch is not None or self.impl == "message_passing":
            why = "used without 'size', 'batch' and impl='message_passing' (the graph is one global sequence)"
            got = f"size={size!r}, batch={'a Tensor' if batch is not None else None}, impl={self.impl!r}"
            raise NotImplementedError(message("context_parallel", why, got))
        plan = (
            graph
            if isinstance(graph, distributed.ExchangePlan)
            else distributed.plan_for_group(graph, query.size(0), group)
        )
        out, alpha = distributed.attention(
            query,
            key,
            value,
            plan,
            group=group,
            edge_bias=edge_bias,
            dropout=self.dropout,
            training=self.training,
            need_weights=return_attention_weights,
        )  # (n, H, D), (E_local, H)
        out = self._combine(out, query.size(0))  # (n, F_out)
        return (out, (plan.global_edge_index, alpha)) if return_attention_weights else out

    def _message_passing(self, query, key, value, edge_index, edge_bias):
        """The readable path: ``edge_update`` (scores, softmax) then ``propagate`` (``message``)."""
        from graphattn.graphs import check_edge_index

        if not torch.compiler.is_compiling():  # reads indices on the host: a graph break
            check_edge_index(edge_index, key.size(0), query.size(0))
        size = (key.size(0), query.size(0))  # (S, L), PyG order
        edge_index = propagate_index(edge_index)  # int32 as int64 (routing.propagate_index)
        check_values = not _compat.functorch_active()  # under vmap a value cannot be read
        edge_bias = ops.check_edge_bias(
            edge_bias, edge_index.size(1), self.heads, dtype=query.dtype, check_values=check_values
        )
        alpha = self.edge_updater(edge_index, query=query, key=key, edge_bias=edge_bias, size=size)  # (E, H)
        out = self.propagate(edge_index, value=value, alpha=alpha, size=size)  # (L, H, D)
        return out, alpha

    def edge_update(
        self, query_i: Tensor, key_j: Tensor, edge_bias: Tensor | None, index: Tensor, size_i: int
    ) -> Tensor:
        # 2) score and 3) scale: one dot product per edge and head, the scale of the fast path
        score = ops.edge_scores(query_i, key_j)  # (E, H, D) · (E, H, D) -> (E, H), float32 for half types
        if edge_bias is not None:
            score = score + edge_bias  # (E, H)
        # 5) softmax over the incoming edges of each query i, the one of the fast path
        alpha = ops.segment_softmax(score, index, size_i).to(query_i.dtype)  # (E, H)
        return F.dropout(alpha, p=self.dropout, training=self.training)

    def message(self, value_j: Tensor, alpha: Tensor) -> Tensor:
        # 6) combine: each edge carries its value weighted by alpha; "add" sums them at i
        return alpha.unsqueeze(-1) * value_j  # (E, H, 1) * (E, H, D) -> (E, H, D)

    def __prepare_scriptable__(self):
        check_not_jit(self, "script")  # torch.jit.script calls this first: one clear refusal

    def __repr__(self) -> str:
        extra = "" if self.dropout == 0.0 else f", dropout={self.dropout}"
        extra += "" if self.lin_query.bias is not None else ", bias=False"
        extra += "" if self.lin_out is not None else ", output_projection=False"
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, heads={self.heads}{extra})"

    # -- nn.MultiheadAttention interop -------------------------------------------------------------

    @classmethod
    def from_multihead_attention(cls, mha: nn.MultiheadAttention) -> AttentionConv:
        """Build a layer that computes exactly what ``mha`` computes.

        Call it as ``conv((key, value, query) nodes, edge_index)``: for
        ``mha(query, key, value)`` on one sequence (``batch_first`` either way),
        ``conv((key, value, query), edge_index)`` equals it on the complete
        bipartite graph, or with ``attn_mask``/``key_padding_mask`` turned into
        edges (a blocked pair is a missing edge). With ``kdim == vdim`` a pair
        ``(x_kv, x_q)`` works, and for self-attention a single ``x``.

        Raises
        ------
        NotImplementedError
            For ``add_bias_kv=True`` or ``add_zero_attn=True``.
        """
        if not isinstance(mha, nn.MultiheadAttention):
            raise TypeError(message("mha", "an nn.MultiheadAttention", type(mha).__name__))
        if mha.bias_k is not None or mha.add_zero_attn:
            raise NotImplementedError(
                message(
                    "mha",
                    "without add_bias_kv or add_zero_attn (they add keys that are not nodes)",
                    f"add_bias_kv={mha.bias_k is not None}, add_zero_attn={mha.add_zero_attn}",
                )
            )
        embed, kdim, vdim = mha.embed_dim, mha.kdim, mha.vdim
        in_channels = embed if kdim == vdim == embed else ((kdim, embed) if kdim == vdim else (kdim, vdim, embed))
        bias = mha.in_proj_bias is not None
        conv = cls(in_channels, embed, heads=mha.num_heads, dropout=mha.dropout, bias=bias)
        conv = conv.to(device=mha.out_proj.weight.device, dtype=mha.out_proj.weight.dtype)
        with torch.no_grad():
            if mha._qkv_same_embed_dim:
                w_q, w_k, w_v = mha.in_proj_weight.chunk(3)
            else:
                w_q, w_k, w_v = mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight
            for lin, w in ((conv.lin_query, w_q), (conv.lin_key, w_k), (conv.lin_value, w_v)):
                lin.weight.copy_(w)
            if bias:
                for lin, b in zip((conv.lin_query, conv.lin_key, conv.lin_value), mha.in_proj_bias.chunk(3)):
                    lin.bias.copy_(b)
            conv.lin_out.weight.copy_(mha.out_proj.weight)
            if bias:
                conv.lin_out.bias.copy_(mha.out_proj.bias)
        return conv.train(mha.training)

    def to_multihead_attention(self, batch_first: bool = False) -> nn.MultiheadAttention:
        """An ``nn.MultiheadAttention`` with exactly this layer's weights.

        Raises
        ------
        ValueError
            If the layer has no output projection, or ``F_q != out_channels``
            (MHA's query size is its ``embed_dim``).
        """
        f_k, f_v, f_q = (_in_width(lin) for lin in (self.lin_key, self.lin_value, self.lin_query))
        if None in (f_k, f_v, f_q):
            raise ValueError(
                message(
                    "in_channels",
                    "known sizes to convert to nn.MultiheadAttention",
                    self.in_channels,
                    "call the layer once so that its lazy sizes are set",
                )
            )
        if self.lin_out is None or f_q != self.out_channels:
            raise ValueError(
                message(
                    "output_projection",
                    "True, with F_q == out_channels, to convert to nn.MultiheadAttention",
                    f"output_projection={self.lin_out is not None}, F_q={f_q}, out_channels={self.out_channels}",
                )
            )
        bias = self.lin_query.bias is not None
        w = self.lin_out.weight
        mha = nn.MultiheadAttention(
            self.out_channels,
            self.heads,
            dropout=self.dropout,
            bias=bias,
            kdim=f_k,
            vdim=f_v,
            batch_first=batch_first,
            device=w.device,
            dtype=w.dtype,
        )
        with torch.no_grad():
            weights = (self.lin_query.weight, self.lin_key.weight, self.lin_value.weight)
            if mha._qkv_same_embed_dim:
                mha.in_proj_weight.copy_(torch.cat(weights))
            else:
                for dst, src in zip((mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight), weights):
                    dst.copy_(src)
            if bias:
                mha.in_proj_bias.copy_(torch.cat([self.lin_query.bias, self.lin_key.bias, self.lin_value.bias]))
                mha.out_proj.bias.copy_(self.lin_out.bias)
            mha.out_proj.weight.copy_(self.lin_out.weight)
        return mha.train(self.training)
