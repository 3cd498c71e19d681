"""``TransformerConv``: PyG's graph transformer operator on graphattn's kernels, exact both ways."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import MessagePassing
from torch_geometric.nn.aggr import SumAggregation
from torch_geometric.nn.dense.linear import Linear

from graphattn import ops, routing
from graphattn.graphs import check_edge_index
from graphattn.routing import attend, copy_weights, propagate_index, resolve, use_propagate
from graphattn.validate import (
    check_bool,
    check_choice,
    check_features,
    check_fits_memory,
    check_int,
    check_not_jit,
    check_probability,
    check_tensor,
    message,
)

__all__ = ["TransformerConv"]


def _finite_edge_terms(edge_attr: Tensor, bias: Tensor) -> bool:
    """Whether the fast path's edge terms are usable: ``edge_attr`` finite and the score bias free of NaN and
    +inf (one host sync). Otherwise the layer runs ``propagate``, which gives what PyG gives (NaN only in the
    rows of the affected targets) instead of refusing an ``edge_bias`` the caller never passed.
    """
    bad = ~torch.isfinite(edge_attr).all() | torch.isnan(bias).any() | (bias == math.inf).any()  # ()
    return not bool(bad)


class TransformerConv(MessagePassing):
    r"""The graph transformer operator of Shi et al. [1]_, PyG's ``TransformerConv``, on graphattn's kernels.

    For every edge ``(j, i)`` (row 0 of ``edge_index`` = source j, row 1 = target i) and head h:

    .. math::
        \alpha_{ij}^h = \mathrm{softmax}_{j \in \mathcal{N}(i)}
            \frac{(W_3^h x_i)^\top (W_4^h x_j + W_6^h e_{ij})}{\sqrt{D}},
        \qquad
        m_i = \big\Vert_{h=1}^{H} \sum_{j \in \mathcal{N}(i)} \alpha_{ij}^h (W_2^h x_j + W_6^h e_{ij}),
        \qquad
        x_i' = W_1 x_i + m_i

    (heads averaged instead of concatenated with ``concat=False``; with ``beta``
    the root term is gated, :math:`x_i' = \beta_i W_1 x_i + (1 - \beta_i) m_i`,
    :math:`\beta_i = \sigma(w_5^\top [m_i, W_1 x_i, m_i - W_1 x_i])`).
    Parameters mirror PyG's names (``lin_query`` = W_3, ``lin_key`` = W_4,
    ``lin_value`` = W_2, ``lin_edge`` = W_6, ``lin_skip`` = W_1, ``lin_beta`` = w_5),
    so ``load_state_dict`` moves weights between the two; see
    :meth:`from_transformer_conv` and :meth:`to_transformer_conv`.

    The edge term never copies node features onto edges: the score term is
    :math:`q_i \cdot W_6 e_{ij} = (W_6^\top q_i) \cdot e_{ij}` (an ``edge_bias``
    of :func:`graphattn.attention`), and the value term
    :math:`\sum_j \alpha_{ij} W_6 e_{ij} = W_6 \sum_j \alpha_{ij} e_{ij}` is one
    scatter of ``(E, H, F_e)`` terms; extra memory O(E H F_e).

    On the CPU at one thread (2-16 heads and channels per head, no ``edge_attr``, ``lin_query``/``lin_key``/
    ``lin_value`` stock ``Linear`` modules without hooks: they are not called then), queries, keys and values
    are projected with those weights' rows permuted, each row stored heads innermost for the kernels of
    that layout (:mod:`graphattn.ops.heads_last`; same values, :func:`graphattn.routing.project_heads_last`).
    Under ``torch.utils.checkpoint(use_reentrant=False)``, a recomputation that takes the other layout (the
    thread count or a hook changed before the backward) raises in the backward (:func:`graphattn.routing.same_layout`).

    Parameters
    ----------
    in_channels : int or tuple of int
        ``F_in``, or ``(F_src, F_dst)`` for bipartite graphs; ``-1`` (also inside
        the pair) derives the size from the first input (PyG's lazy ``Linear``).
    out_channels : int
        Channels per head D (PyG's meaning; the output has ``H * D`` channels
        with ``concat=True``, D otherwise). Unlike :class:`graphattn.AttentionConv`.
    heads : int, default 1
    concat : bool, default True
        Concatenate the heads; False averages them.
    beta : bool, default False
        Gate the root term (only with ``root_weight``).
    dropout : float, default 0.0
        Dropout probability on the attention weights (training only).
    edge_dim : int, optional
        ``F_e``; then ``forward`` needs ``edge_attr (E, F_e)``.
    bias : bool, default True
    root_weight : bool, default True
        Add the root term ``W_1 x_i`` (PyG's default: the graph you pass is not
        all the layer reads; each target also reads itself through ``lin_skip``).
    impl : {"auto", "message_passing"}, default "auto"
        ``"auto"``: graphattn's fast kernels, except in ``explain`` mode, with
        a message-passing hook registered, with an ``aggr`` other than
        ``"add"``, or while training with ``pyg_dropout`` and ``dropout > 0``,
        where it runs ``propagate`` (:func:`graphattn.routing.use_propagate`);
        compiled or exported too (the kernels are ``torch.library`` operators,
        fullgraph). ``"message_passing"``: always ``propagate``.
    pyg_dropout : bool, default False
        Draw the attention dropout as PyG's ``TransformerConv`` does: one
        ``F.dropout`` of the ``(E, H)`` weights from the global generator, in
        the order of ``edge_index``, after the softmax. With the same seed and
        weights, training then gives PyG's outputs exactly (the same mask), and
        the returned ``alpha`` is taken before dropout, as PyG's. It runs the
        ``propagate`` path while training with ``dropout > 0`` (PyG's speed and
        memory; eval and ``dropout=0`` keep the fast kernels). Off: the kernels
        draw their own mask (the same distribution, other bits).
    **kwargs
        Passed to :class:`torch_geometric.nn.MessagePassing`. ``aggr``: any
        aggregation PyG accepts (default ``"add"``; PyG sums the weighted
        messages, and so does every fast kernel: another ``aggr``, e.g.
        ``"mean"``, runs ``propagate`` with PyG's aggregation). ``flow`` must
        be ``"source_to_target"``.

    Raises
    ------
    ValueError
        Non-positive sizes, a ``dropout`` outside [0, 1), a ``flow`` other than
        ``"source_to_target"``, features or ``edge_attr`` of the wrong shape.
    TypeError
        Wrong argument types (``return_attention_weights`` must be None or a
        bool, ``dropout`` a float, ``bias`` a bool); features not of the layer's dtype.
    NotImplementedError
        Under ``torch.jit.trace`` or ``torch.jit.script`` (use ``torch.compile``
        or ``torch.export``, which trace the ``propagate`` path).

    Notes
    -----
    - input shapes: ``x (N, F_in)`` or ``(x_src (S, F_src), x_dst (L, F_dst))``;
      ``edge_index (2, E)``, an ``EdgeIndex``, a transposed sparse adjacency
      ``adj_t (L, S)`` (``torch.sparse`` or ``SparseTensor``); ``edge_attr (E, F_e)``
    - output shapes: ``(L, H * D)`` (``(L, D)`` with ``concat=False``); with
      ``return_attention_weights=True`` ``(out, (edge_index, alpha))``,
      ``alpha (E, H)`` (for a ``SparseTensor``, the adjacency holding alpha)

    PyG's conventions, kept so PyG code runs unchanged: ``repr`` is PyG's
    (``TransformerConv(in_channels, out_channels, heads=H)``);
    ``return_attention_weights=None`` (the default) returns ``out``, any bool
    (also False, as PyG 2.8) ``(out, (edge_index, alpha))``; ``_alpha`` holds
    the weights before dropout while ``propagate`` runs (what PyG's
    ``AttentionExplainer`` and message hooks read) and is None otherwise.
    Differences from PyG's ``TransformerConv``: without ``pyg_dropout``, the
    returned ``alpha`` is taken after dropout while training (as
    :func:`graphattn.attention` and ``nn.MultiheadAttention`` return it;
    identical in eval mode or with ``dropout=0``); ``edge_attr`` without
    ``edge_dim`` raises instead of being added to the values; no TorchScript.

    References
    ----------
    .. [1] Y. Shi et al., "Masked Label Prediction: Unified Message Passing Model
       for Semi-Supervised Classification", IJCAI 2021, eq. (3)-(5), (7)-(8).

    Examples
    --------
    >>> import torch, graphattn as ga
    >>> conv = ga.TransformerConv(16, 8, heads=2, edge_dim=3)
    >>> conv
    TransformerConv(16, 8, heads=2)
    >>> edge_index = torch.tensor([[0, 1, 2], [1, 2, 0]])
    >>> conv(torch.randn(3, 16), edge_index, torch.randn(3, 3)).shape
    torch.Size([3, 16])
    """

    def __init__(
        self,
        in_channels,
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        beta: bool = False,
        dropout: float = 0.0,
        edge_dim: int | None = None,
        bias: bool = True,
        root_weight: bool = True,
        impl: str = "auto",
        pyg_dropout: bool = False,
        **kwargs,
    ):
        kwargs.setdefault("aggr", "add")
        if kwargs.setdefault("flow", "source_to_target") != "source_to_target":
            raise ValueError(
                message("flow", "'source_to_target' for attention (row 0 = source j = key)", kwargs["flow"])
            )
        super().__init__(node_dim=0, **kwargs)
        self._alpha: Tensor | None = None  # PyG's: the weights before dropout, set only while propagate runs
        pair = (in_channels, in_channels) if not isinstance(in_channels, (tuple, list)) else tuple(in_channels)
        if len(pair) != 2:
            raise TypeError(message("in_channels", "an int or a pair (F_src, F_dst)", in_channels))
        f_src, f_dst = (-1 if f == -1 else check_int("in_channels", f, low=1) for f in pair)
        self.in_channels = in_channels
        self.out_channels = check_int("out_channels", out_channels, low=1)
        self.heads = check_int("heads", heads, low=1)
        self.concat = check_bool("concat", concat)
        self.root_weight = check_bool("root_weight", root_weight)
        self.beta = check_bool("beta", beta) and root_weight
        self.dropout = check_probability("dropout", dropout)
        self.edge_dim = None if edge_dim is None else check_int("edge_dim", edge_dim, low=1)
        self.impl = check_choice("impl", impl, ("auto", "message_passing"))
        self.pyg_dropout = check_bool("pyg_dropout", pyg_dropout)
        bias = check_bool("bias", bias)
        width = heads * out_channels
        sizes = {
            "in_channels": max(f_src, f_dst, 1),
            "out_channels": out_channels,
            "heads": heads,
            "edge_dim": edge_dim or 0,
        }
        largest = max(sizes, key=sizes.get)
        check_fits_memory(
            largest,
            {"in_channels": in_channels, "out_channels": out_channels, "heads": heads, "edge_dim": edge_dim}[largest],
            width * (2 * max(f_src, 1) + 2 * max(f_dst, 1) + (edge_dim or 0) + 3),
            torch.get_default_dtype().itemsize,
        )  # lin_key, lin_value, lin_query, lin_skip, lin_edge
        self.lin_key = Linear(f_src, width, bias=bias)
        self.lin_query = Linear(f_dst, width, bias=bias)
        self.lin_value = Linear(f_src, width, bias=bias)
        self.lin_edge = Linear(edge_dim, width, bias=False) if edge_dim is not None else None
        out_width = width if concat else out_channels
        self.lin_skip = Linear(f_dst, out_width, bias=bias)  # PyG builds it even without root_weight
        self.lin_beta = Linear(3 * out_width, 1, bias=False) if self.beta else None
        self.reset_parameters()

    def reset_parameters(self):
        """PyG's initialisation (``Linear.reset_parameters``: Kaiming-uniform, as ``nn.Linear``)."""
        super().reset_parameters()
        for lin in (self.lin_key, self.lin_query, self.lin_value, self.lin_edge, self.lin_skip, self.lin_beta):
            if lin is not None:
                lin.reset_parameters()

    def forward(
        self,
        x,
        edge_index,
        edge_attr: Tensor | None = None,
        return_attention_weights: bool | None = None,
        *,
        size=None,
        batch: Tensor | None = None,
    ):
        """Attend along the edges into each target, add the root term.

        Parameters
        ----------
        x : Tensor, shape (N, F_in), or pair ``(x_src (S, F_src), x_dst (L, F_dst))``
        edge_index : Tensor (2, E), EdgeIndex, torch.sparse ``adj_t (L, S)`` or SparseTensor ``adj_t``
            Row 0 = source j (key/value), row 1 = target i (query); a sparse
            adjacency is PyG's transposed one: ``adj_t[i, j] != 0`` is the edge j -> i.
        edge_attr : Tensor, shape (E, F_e), optional
            Required with ``edge_dim``; in the order of ``edge_index`` (for a
            sparse adjacency, of its entries; multi-dimensional sparse values
            serve as ``edge_attr`` when none is given, as in PyG).
        return_attention_weights : bool, optional
            None (default): return ``out``. Any bool, also False (PyG 2.8's
            ``TransformerConv``): return ``(out, (edge_index, alpha))``.
        size : tuple (S, L), optional
            PyG's ``size``; checked against the features.
        batch : Tensor, shape (N,), optional
            PyG's ``batch`` vector. With a pattern as ``edge_index``
            (``patterns.full()``, ``patterns.causal()``, ...), the pattern
            applies within each graph of the batch (the ragged kernel of
            :func:`graphattn.ops.batched_attention`; no sum(n_b^2) edges are
            built unless the weights or the ``propagate`` path need them).
            With an edge list it is not needed (the edges are the graph) and ignored.

        Returns
        -------
        out : Tensor, shape (L, H * D) or (L, D)
        (edge_index, alpha) : ``alpha (E, H)``, only if requested (the adjacency
            object passed in; a ``SparseTensor`` comes back holding alpha).
        """
        check_not_jit(self, "trace")
        if return_attention_weights is not None:
            check_bool("return_attention_weights", return_attention_weights)
        need_weights = return_attention_weights is not None  # PyG 2.8: any bool, also False
        x_src, x_dst = self._features(x)
        S, L = x_src.size(0), x_dst.size(0)
        slow = (
            use_propagate(self, edge_index, batch)
            or not isinstance(self.aggr_module, SumAggregation)
            or (self.pyg_dropout and self.training and self.dropout > 0.0)
        )
        edge_index, plain, values = resolve(edge_index, size, batch, S, L, slow or need_weights, x_dst.device)
        if edge_attr is None and values is not None and values.dim() > 1:
            edge_attr = values
        H, C = self.heads, self.out_channels
        skips = (self.lin_skip,) if self.root_weight else ()
        lins = (self.lin_query, self.lin_key, self.lin_value)
        fast = not slow and edge_attr is None and batch is None  # the fused kernels take the rows
        query, key, value = routing.project_rows((x_dst, x_src, x_src), lins, H, C, fast)  # (L|S, H, D)
        x_r = [lin(x_dst) for lin in skips]
        edge_attr = self._check_edge_attr(edge_attr, plain)
        if slow:
            out, alpha = self._propagate(query, key, value, plain, edge_attr, (S, L))
        else:
            out, alpha = self._attend(query, key, value, plain, edge_attr, batch, need_weights)
        out = out.reshape(L, H * C) if self.concat else out.mean(dim=1)  # (L, H*D) or (L, D)
        if self.root_weight:
            x_r = x_r[0]  # (L, H*D) or (L, D): lin_skip(x_dst)
            if self.lin_beta is not None:
                beta = self.lin_beta(torch.cat([out, x_r, out - x_r], dim=-1)).sigmoid()  # (L, 1)
                out = beta * x_r + (1 - beta) * out
            else:
                out = out + x_r
        if not need_weights:
            return out
        if type(edge_index).__name__ == "SparseTensor":
            return out, edge_index.set_value(alpha, layout="coo")
        return out, (edge_index, alpha)

    def _features(self, x) -> tuple[Tensor, Tensor]:
        """``(x_src (S, F_src), x_dst (L, F_dst))`` from ``x`` or a pair."""
        if isinstance(x, Tensor):
            x_src = x_dst = x
        elif isinstance(x, (tuple, list)) and len(x) == 2:
            x_src, x_dst = x
            if x_dst is None:
                raise ValueError(
                    message(
                        "x",
                        "a Tensor or a pair (x_src, x_dst) with target features",
                        "(x_src, None)",
                        "TransformerConv's queries are the targets' features",
                    )
                )
        else:
            raise TypeError(message("x", "a Tensor or a pair (x_src, x_dst)", type(x).__name__))
        one = x_src is x_dst
        order = "" if one else "a pair is (x_src, x_dst): sources (keys) first, targets (queries) second"
        check_features("x" if one else "x_src", x_src, self.lin_key.weight, order)  # width, dtype: before any matmul
        check_features("x" if one else "x_dst", x_dst, self.lin_query.weight, order)
        return x_src, x_dst

    def _check_edge_attr(self, edge_attr: Tensor | None, edge_index) -> Tensor | None:
        if self.lin_edge is None:
            if edge_attr is not None:
                got = f"shape {tuple(edge_attr.shape)}" if isinstance(edge_attr, Tensor) else type(edge_attr).__name__
                raise ValueError(
                    message("edge_attr", "None for a layer built without edge_dim", got, "pass edge_dim=F_e")
                )
            return None
        if edge_attr is None:
            raise ValueError(message("edge_attr", f"a Tensor of shape (E, {self.edge_dim}) (edge_dim is set)", None))
        if not isinstance(edge_index, Tensor):
            how = "build its edges: pattern.edge_index(L, S)"
            raise ValueError(message("edge_index", "an edge list with 'edge_attr'", "a pattern", how))
        E = edge_index.size(1) if edge_index.dim() == 2 else -1
        check_tensor("edge_attr", edge_attr, dim=2, shape_text=f"(E, {self.edge_dim})", floating=True)
        check_features("edge_attr", edge_attr, self.lin_edge.weight)  # width and dtype
        if edge_attr.shape != (E, self.edge_dim):
            raise ValueError(
                message("edge_attr", f"of shape (E, F_e) = {(E, self.edge_dim)}", f"shape {tuple(edge_attr.shape)}")
            )
        return edge_attr

    def _attend(self, query, key, value, edge_index, edge_attr, batch, need_weights):
        """The fast path: :func:`graphattn.attention`, edge terms without ``(E, H, D)`` node copies."""
        L, H, C = query.shape
        if edge_attr is None:
            return attend(
                query,
                key,
                value,
                edge_index,
                batch,
                dropout=self.dropout,
                training=self.training,
                need_weights=need_weights,
            )  # (L, H, D), (E, H) or None
        if not torch.compiler.is_compiling():  # reads the indices on the host (the operator checks them when traced)
            check_edge_index(edge_index, key.size(0), L)
        w_edge = self.lin_edge.weight.view(H, C, self.edge_dim)  # (H, D, F_e)
        src_dst = edge_index[1]  # (E,) target i of each edge
        q_edge = torch.einsum("lhd,hdf->lhf", query, w_edge)  # (L, H, F_e): W_6^T q_i
        bias = torch.einsum("ehf,ef->eh", q_edge[src_dst], edge_attr) / math.sqrt(C)  # (E, H): q_i · W_6 e_ij
        if not torch.compiler.is_compiling() and not _finite_edge_terms(edge_attr, bias):
            # NaN/inf edge features (or scores overflowing): PyG's own computation, NaN only in the rows they reach
            return self._propagate(query, key, value, edge_index, edge_attr, (key.size(0), L))
        out, alpha = ops.attention(
            query,
            key,
            value,
            edge_index,
            edge_bias=bias,
            dropout=self.dropout,
            training=self.training,
            need_weights=True,
        )  # (L, H, D), (E, H)
        terms = alpha.unsqueeze(-1) * edge_attr.unsqueeze(1)  # (E, H, 1) * (E, 1, F_e) -> (E, H, F_e)
        summed = terms.new_zeros(L, H, self.edge_dim).index_add_(0, src_dst, terms)  # (L, H, F_e)
        out = out + torch.einsum("lhf,hdf->lhd", summed, w_edge)  # (L, H, D): W_6 sum_j alpha_ij e_ij
        return out, alpha

    def _propagate(self, query, key, value, edge_index, edge_attr, size):
        """The readable path: ``edge_update`` (scores, softmax) then ``propagate`` (``message``).

        Under ``torch.compile`` (``impl="message_passing"``, or a hook) the index
        check, which reads values on the host, is skipped (an out-of-range index
        then fails in ``index_select``).
        """
        if not torch.compiler.is_compiling():
            check_edge_index(edge_index, size[0], size[1])
        edge_index = propagate_index(edge_index)  # int32 as int64 (routing.propagate_index)
        H, C = self.heads, self.out_channels
        edge_emb = None if edge_attr is None else self.lin_edge(edge_attr).view(-1, H, C)  # (E, H, D)
        alpha = self.edge_updater(edge_index, query=query, key=key, edge_emb=edge_emb, size=size)  # (E, H)
        self._alpha = alpha  # before dropout, as PyG's: read by message hooks and AttentionExplainer
        try:
            out = self.propagate(edge_index, value=value, alpha=alpha, edge_emb=edge_emb, size=size)  # (L, H, D)
        finally:
            self._alpha = None  # PyG resets it after propagate
        return out, alpha

    def edge_update(
        self, query_i: Tensor, key_j: Tensor, edge_emb: Tensor | None, index: Tensor, size_i: int
    ) -> Tensor:
        if edge_emb is not None:
            key_j = key_j + edge_emb  # (E, H, D)
        score = (query_i * key_j).sum(dim=-1) / math.sqrt(query_i.size(-1))  # (E, H, D) · (E, H, D) -> (E, H)
        return ops.segment_softmax(score, index, size_i)  # (E, H), sums to 1 over the edges into i

    def message(self, value_j: Tensor, alpha: Tensor, edge_emb: Tensor | None) -> Tensor:
        alpha = F.dropout(alpha, p=self.dropout, training=self.training)  # PyG's draw: one (E, H) mask, edge order
        if edge_emb is not None:
            value_j = value_j + edge_emb  # (E, H, D)
        return alpha.unsqueeze(-1) * value_j  # (E, H, 1) * (E, H, D) -> (E, H, D)

    def __prepare_scriptable__(self):
        check_not_jit(self, "script")  # torch.jit.script calls this first: one clear refusal

    def __repr__(self) -> str:
        """PyG's: ``TransformerConv(in_channels, out_channels, heads=H)`` (PyG code and tests compare it)."""
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, heads={self.heads})"

    # -- torch_geometric.nn.TransformerConv interop -------------------------------------------------

    @classmethod
    def from_transformer_conv(cls, conv, impl: str = "auto", pyg_dropout: bool = False) -> TransformerConv:
        """A layer computing exactly what ``conv`` (``torch_geometric.nn.TransformerConv``) computes.

        Same weights (``load_state_dict``), aggregation, dtype, device and
        train/eval mode; ``pyg_dropout=True`` also draws its dropout mask.

        Raises
        ------
        TypeError
            If ``conv`` is not a ``torch_geometric.nn.TransformerConv``.
        ValueError
            If it uses another ``flow``.
        """
        from torch_geometric.nn import TransformerConv as PyGTransformerConv

        if not isinstance(conv, PyGTransformerConv):
            raise TypeError(message("conv", "a torch_geometric.nn.TransformerConv", type(conv).__name__))
        layer = cls(**_constructor_args(conv), impl=impl, pyg_dropout=pyg_dropout, flow=conv.flow)
        return copy_weights(conv, layer)

    def to_transformer_conv(self):
        """A ``torch_geometric.nn.TransformerConv`` with exactly this layer's weights, dtype, device and mode."""
        from torch_geometric.nn import TransformerConv as PyGTransformerConv

        return copy_weights(self, PyGTransformerConv(**_constructor_args(self)))


def _constructor_args(conv) -> dict:
    """The constructor arguments both layers share, read from either (this one or PyG's ``TransformerConv``)."""
    return dict(
        in_channels=conv.in_channels,
        out_channels=conv.out_channels,
        heads=conv.heads,
        concat=conv.concat,
        beta=conv.beta,
        dropout=conv.dropout,
        edge_dim=conv.edge_dim,
        bias=conv.lin_key.bias is not None,
        root_weight=conv.root_weight,
        aggr=_aggr(conv),
    )


def _aggr(conv):
    """``conv``'s aggregation as its constructor takes it: the name it was given, else the module itself."""
    named = isinstance(conv.aggr, list) or (isinstance(conv.aggr, str) and not conv.aggr.endswith(")"))
    return conv.aggr if named else conv.aggr_module
