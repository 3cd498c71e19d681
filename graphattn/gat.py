"""PyG's GAT and GATv2 semantics on graphattn's kernels: ``GATConv`` and ``GATv2Conv`` drop-ins.

Both classes *are* PyG's layers (subclasses of
:class:`torch_geometric.nn.GATConv` / :class:`torch_geometric.nn.GATv2Conv`):
the same constructor, parameters (``lin``, ``lin_src``, ``att_src``, ...,
so ``state_dict`` moves both ways), ``reset_parameters``, ``repr`` and return
tuple. Only ``forward`` differs: the additive scores are formed per edge as
``(E, H)`` tensors and the softmax over each target's incoming edges and the
weighted sum of the source features run on :func:`graphattn.ops.scored_attention`
(the ``graphattn::attention`` operator), so no ``(E, H, C)`` message tensor is
formed for the aggregation. GAT's scores need only per-node halves and one
edge term; GATv2's apply LeakyReLU to ``x_i + x_j`` before the dot product
with ``att``, an ``(E, H, C)`` computation, which on the CPU (one thread,
float32/float64) runs as one operator, ``graphattn::gatv2_score`` (:mod:`graphattn.ops.additive`:
one pass over the edges each way, no ``(E, H, C)`` tensor); elsewhere as
PyG's PyTorch operations (``ops.additive.readable``, tests pin the two).

PyG's own ``forward`` (``propagate``) runs where PyG machinery must see every
message: ``impl="message_passing"``, explain mode, message-passing hooks
(:func:`graphattn.routing.needs_propagate`), an ``aggr`` other than a sum or
``flow="target_to_source"``, and adjacencies given as
``SparseTensor`` or ``torch.sparse`` tensors.

Dropout draws its mask on graphattn's kernel, not in PyG's order: same
distribution, other bits (``impl="message_passing"`` draws PyG's).

At one thread (CPU, float32/float64, 2-16 heads of 2-16 channels) both layers project their rows with the
weights' rows permuted, so that memory is ``(n, C, H)``, heads innermost
(:func:`graphattn.routing.project_rows`): the same values, read by kernels of their own for that layout
(:mod:`graphattn.ops.heads_last`, and ``graphattn::gatv2_score``'s), whose loops over heads vectorise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import GATConv as PyGGATConv
from torch_geometric.nn import GATv2Conv as PyGGATv2Conv
from torch_geometric.nn.aggr import SumAggregation
from torch_geometric.utils import add_self_loops, remove_self_loops, scatter

from graphattn import _compat, graphs, ops
from graphattn.routing import copy_weights, needs_propagate, plain_linear, project_rows, propagate_index
from graphattn.validate import check_choice, check_edge_list, message

__all__ = ["GATConv", "GATv2Conv"]


def _fast(module, edge_index) -> bool:
    """The fused path: an edge list (plain or ``EdgeIndex``) and nothing that needs ``propagate``.

    The kernels sum the weighted messages into each edge's target (row 1): another ``aggr`` (``"mean"``,
    ``"max"``, ...) or ``flow="target_to_source"`` runs PyG's own ``propagate``.
    """
    return (
        module.impl == "auto"
        and not needs_propagate(module)
        and isinstance(edge_index, Tensor)
        and edge_index.layout == torch.strided
        and isinstance(module.aggr_module, SumAggregation)
        and module.flow == "source_to_target"
    )


def _keep_pygs_explain_path(module) -> None:
    """PyG's explain mode applies edge masks in ``MessagePassing.propagate``: keep it (:mod:`graphattn._compat`)."""
    _compat.keep_pyg_explain_path(type(module))


def _plain(edge_index: Tensor) -> Tensor:
    """An ``EdgeIndex``'s plain tensor (zero-copy) for the operator; a plain tensor itself."""
    return edge_index.as_tensor() if hasattr(edge_index, "as_tensor") else edge_index


def _check_size(size, x_src: Tensor, x_dst: Tensor | None) -> None:
    """PyG's ``size (S, L)`` against the features it describes (PyG raises; the fused path would ignore it)."""
    if size is None:
        return
    given = tuple(size)
    have = (x_src.size(0), given[1] if x_dst is None else x_dst.size(0))
    if len(given) != 2 or given != have:
        raise ValueError(message("size", f"(S, L) = {have}, the features' node counts", given))


def _check_dtypes(pairs) -> None:
    """Each ``(name, x, lin)``: ``x`` in ``lin``'s weight dtype (PyG's layer fails inside the matmul instead).

    A lazy projection's weight has the dtype it will be materialised in; a missing input (``x_dst=None``) or
    a parametrized weight (computed at each access) is not checked here.
    """
    for name, x, lin in pairs:
        weight = getattr(lin, "_parameters", {}).get("weight") if isinstance(x, Tensor) else None
        if weight is None or x.dtype == weight.dtype:
            continue
        fix = f"convert one of them, e.g. conv.to({x.dtype})"
        raise TypeError(message(name, f"the layer's dtype {weight.dtype}", x.dtype, fix, verb="have"))


def _edges(edge_index: Tensor, num_sources: int, num_targets: int) -> Tensor:
    """``edge_index``'s plain tensor, checked: type and shape always, the index range when eager.

    Before the kernels' gathers read it (they would fail inside torch). Compiled, the range is not
    read on the host (a data-dependent check would break the graph); the operator checks it.
    """
    plain = check_edge_list("edge_index", _plain(edge_index))
    if not torch.compiler.is_compiling():
        graphs.check_edge_index(plain, num_sources, num_targets)
    return plain


def _self_loops(module, edge_index: Tensor, edge_attr: Tensor | None, num_nodes):
    """PyG's self-loops with shapes known before the values: ``(src, dst, edge_attr)`` over ``E + N`` edges.

    PyG removes the graph's own loops (``remove_self_loops``: a data-dependent
    length) and appends one per node. Here the ``N`` loops are appended to all
    ``E`` edges, and the operator leaves the graph's own loops out
    (``ops.scored_attention(loops=N)``: they are not in its cached structure),
    so their weight is exactly 0 and they leave the output, the other weights
    and every gradient exactly as PyG's removal does (their scores, so their
    ``edge_attr``, get a zero gradient, as a removed edge's). Their scores are
    still computed (``E + N`` rows), never read. The loops' edge feature is
    PyG's (``compute_loop_attr``): the ``fill_value`` itself, or a reduction
    (``"mean"``, ``"add"``, ...) of each node's incoming edges' features
    without its own loops (they go to a spare row that is dropped). Nothing
    here reads the values on the host, so ``torch.compile(fullgraph=True)``
    and ``torch.export`` trace it; the structure of the ``E + N`` edges is
    built once per graph, cached under ``edge_index`` itself.
    """
    loop = torch.arange(num_nodes, device=edge_index.device, dtype=edge_index.dtype)  # (N,)
    src, dst = torch.cat([edge_index[0], loop]), torch.cat([edge_index[1], loop])  # (E + N,), (E + N,)
    if edge_attr is None:
        return src, dst, None
    fill = module.fill_value
    size = (num_nodes,) + tuple(edge_attr.shape[1:])
    if fill is None:
        loop_attr = edge_attr.new_ones(size)
    elif isinstance(fill, (int, float)) and not isinstance(fill, bool):
        loop_attr = edge_attr.new_full(size, fill)
    elif isinstance(fill, Tensor):
        loop_attr = fill.to(edge_attr.device, edge_attr.dtype)
        loop_attr = (loop_attr.unsqueeze(0) if edge_attr.dim() != loop_attr.dim() else loop_attr).expand(size)
    elif isinstance(fill, str):
        own = edge_index[0] == edge_index[1]  # (E,) the graph's own loops
        index = torch.where(own, num_nodes, edge_index[1])  # (E,) own loops into the spare row N
        loop_attr = scatter(edge_attr, index, 0, num_nodes + 1, fill)[:num_nodes]  # (N, F_e)
    else:
        raise AttributeError("No valid 'fill_value' provided")  # PyG's error
    return src, dst, torch.cat([edge_attr, loop_attr])


def _weights(edge_index: Tensor, alpha: Tensor, num_nodes) -> tuple[Tensor, Tensor]:
    """PyG's returned ``(edge_index, alpha)``: the graph's own loops dropped, the added ones last.

    Their number depends on the values: under ``torch.compile(fullgraph=True)`` torch 2.13 traces it
    as a size known only when run (older releases may need dynamo's ``capture_dynamic_output_shape_ops``). An ``EdgeIndex`` comes back as
    PyG returns it (its own ``remove_self_loops`` / ``add_self_loops``: the same edges, in the same order).
    """
    plain = _plain(edge_index)
    kept = torch.cat([plain[0] != plain[1], plain.new_ones(num_nodes, dtype=torch.bool)])  # (E + N,) own loops out
    if hasattr(edge_index, "as_tensor"):  # an EdgeIndex: PyG's own functions keep its type and metadata
        return add_self_loops(remove_self_loops(edge_index)[0], num_nodes=num_nodes)[0], alpha[kept]
    loop = torch.arange(num_nodes, device=edge_index.device, dtype=edge_index.dtype)  # (N,)
    return torch.cat([edge_index, loop.expand(2, -1)], dim=1)[:, kept], alpha[kept]  # (2, E'), (E', H)


def _finish(module, out: Tensor, res: Tensor | None, edge_index, alpha, return_attention_weights, loops):
    """Heads concatenated or averaged, residual, bias; PyG's return (the weights when the flag is truthy, as PyG 2.8)."""
    out = out.flatten(1) if module.concat else out.mean(dim=1)  # (L, H*C) or (L, C); L = 0 too
    if res is not None:
        out = out + res
    if module.bias is not None:
        out = out + module.bias
    if not return_attention_weights:
        return out
    if loops:
        edge_index, alpha = _weights(edge_index, alpha, loops)
    return out, (edge_index, alpha)


def _attend(module, score, x_src, edge_index, num_targets, res, given, return_attention_weights, loops):
    """The scores ``(E + loops, H)`` to PyG's return: fused softmax (own loops left out) and sum, then :func:`_finish`."""
    try:
        out, alpha = ops.scored_attention(
            score,
            x_src,
            edge_index,
            num_targets,
            dropout=module.dropout if module.training else 0.0,  # PyG takes dropout=1.0 (unused in eval)
            training=module.training,
            need_weights=bool(return_attention_weights),
            loops=loops,
        )  # (L, H, C), (E, H)
    except ValueError as error:  # the kernel checks the scores once; name what the caller passed
        if not str(error).startswith("Expected 'score' to be free of NaN"):
            raise
        raise ValueError(  # a NaN or inf in x, edge_attr or the weights: PyG's layer returns NaN rows instead
            message("x", "finite, with finite edge_attr and weights", "attention scores with a NaN or +inf entry")
        ) from error
    return _finish(module, out, res, given, alpha, return_attention_weights, loops)


def _config(conv) -> dict:
    """The constructor arguments (after the channels) of a GAT or GATv2 layer, PyG's or graphattn's."""
    kwargs = dict(
        heads=conv.heads,
        concat=conv.concat,
        negative_slope=conv.negative_slope,
        dropout=conv.dropout,
        add_self_loops=conv.add_self_loops,
        edge_dim=conv.edge_dim,
        fill_value=conv.fill_value,
        bias=conv.bias is not None,
        residual=conv.residual,
    )
    if isinstance(conv, PyGGATv2Conv):
        kwargs["share_weights"] = conv.share_weights
    return kwargs


def _from(cls, conv, impl: str):
    """A graphattn layer with ``conv``'s configuration and a copy of its weights."""
    layer = cls(conv.in_channels, conv.out_channels, impl=impl, aggr=conv.aggr, flow=conv.flow, **_config(conv))
    return copy_weights(conv, layer)


def _to(layer, pyg_cls):
    return copy_weights(layer, pyg_cls(layer.in_channels, layer.out_channels, **_config(layer)))


class GATConv(PyGGATConv):
    r"""PyG's graph attention layer [1]_ on graphattn's kernels (exact, same parameters).

    .. math::
        \alpha_{ij} = \mathrm{softmax}_{j \in \mathcal{N}(i)} \mathrm{LeakyReLU}\big(
        a_s^\top \Theta_s x_j + a_t^\top \Theta_t x_i + a_e^\top \Theta_e e_{ij}\big), \qquad
        x_i' = \sum_{j \in \mathcal{N}(i)} \alpha_{ij} \Theta_s x_j

    (per head; heads concatenated or averaged, then residual and bias), with
    ``add_self_loops`` PyG's: the graph's self-loops removed and one per node
    added, its edge feature from ``fill_value``.

    Parameters
    ----------
    in_channels, out_channels, heads, concat, negative_slope, dropout, add_self_loops, edge_dim, fill_value, bias, residual
        As :class:`torch_geometric.nn.GATConv` (``out_channels`` per head; PyG's
        defaults: ``heads=1``, ``add_self_loops=True``, ``fill_value="mean"``).
    impl : {"auto", "message_passing"}, default "auto"
        ``"auto"``: the fused path (PyG's ``propagate`` only where PyG
        machinery needs every message, see the module); ``"message_passing"``:
        always PyG's own forward.
    **kwargs
        Passed to :class:`torch_geometric.nn.MessagePassing`.

    Shapes: ``x (N, F_in)`` or ``(x_src (S, F_s), x_dst (L, F_t))``,
    ``edge_index (2, E)`` (row 0 = source j, row 1 = target i), ``edge_attr
    (E, F_e)`` -> ``(L, H * C)`` (``concat``) or ``(L, C)``; with
    ``return_attention_weights`` not None also ``(edge_index, alpha (E', H))``
    over the edges attended (self-loops included), as PyG.

    References
    ----------
    .. [1] Velickovic et al., "Graph Attention Networks", ICLR 2018, eq. (1)-(4).
    """

    def __init__(
        self,
        in_channels,
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        negative_slope: float = 0.2,
        dropout: float = 0.0,
        add_self_loops: bool = True,
        edge_dim=None,
        fill_value="mean",
        bias: bool = True,
        residual: bool = False,
        impl: str = "auto",
        **kwargs,
    ):
        self.impl = check_choice("impl", impl, ("auto", "message_passing"))
        super().__init__(
            in_channels,
            out_channels,
            heads=heads,
            concat=concat,
            negative_slope=negative_slope,
            dropout=dropout,
            add_self_loops=add_self_loops,
            edge_dim=edge_dim,
            fill_value=fill_value,
            bias=bias,
            residual=residual,
            **kwargs,
        )
        _keep_pygs_explain_path(self)

    def forward(self, x, edge_index, edge_attr: Tensor | None = None, size=None, return_attention_weights=None):
        """PyG's ``GATConv.forward``, fused (module docstring)."""
        # PyG generates propagate/edge_updater from these comments in the class's own source (checked on 2.8):
        # edge_updater_type: (alpha: OptPairTensor, edge_attr: OptTensor)
        # propagate_type: (x: OptPairTensor, alpha: Tensor)
        if not _fast(self, edge_index):
            return super().forward(x, propagate_index(edge_index), edge_attr, size, return_attention_weights)
        H, C = self.heads, self.out_channels
        x_src, x_dst = (x, x) if isinstance(x, Tensor) else x
        _check_size(size, x_src, x_dst)
        lin_src = self.lin if self.lin is not None else self.lin_src
        lin_dst = self.lin if self.lin is not None else self.lin_dst
        _check_dtypes((("x", x_src, lin_src), ("x", x_dst, lin_dst)))
        res = None if self.res is None or x_dst is None else self.res(x_dst)  # (L, H*C) or (L, C)
        same = x_src is x_dst and self.lin is not None  # one projection of one input
        (x_src,) = project_rows((x_src,), (lin_src,), H, C, fast=True)  # (S, H, C); heads innermost at one thread
        x_dst = x_src if same else (None if x_dst is None else lin_dst(x_dst).view(-1, H, C))  # (L, H, C)
        alpha_src = (x_src * self.att_src).sum(-1)  # (S, H, C) · (1, H, C) -> (S, H)
        alpha_dst = None if x_dst is None else (x_dst * self.att_dst).sum(-1)  # (L, H)
        num_targets = x_dst.size(0) if x_dst is not None else (size[1] if size is not None else x_src.size(0))
        given, edge_index = edge_index, _edges(edge_index, x_src.size(0), num_targets)
        src, dst, loops = edge_index[0], edge_index[1], 0  # (E,), (E,)
        if self.add_self_loops:
            loops = x_src.size(0) if x_dst is None else min(x_src.size(0), x_dst.size(0))
            loops = min(size) if size is not None else loops
            src, dst, edge_attr = _self_loops(self, edge_index, edge_attr, loops)  # E + N edges
        score = alpha_src.index_select(0, src)  # (E, H): a_s · Θ_s x_j
        if alpha_dst is not None:
            score = score + alpha_dst.index_select(0, dst)  # (E, H): + a_t · Θ_t x_i
        if edge_attr is not None and self.lin_edge is not None:
            edge_attr = edge_attr.view(-1, 1) if edge_attr.dim() == 1 else edge_attr  # (E, F_e)
            if plain_linear(self.lin_edge):  # a_e^T Θ_e folded: (H, F_e), no (E, H, C) tensor
                w_edge = (self.lin_edge.weight.view(H, C, -1) * self.att_edge.view(H, C, 1)).sum(1)
                score = score + edge_attr @ w_edge.t()  # (E, F_e) @ (F_e, H) -> (E, H)
            else:  # a hook, a subclass or a parametrized weight: the module is called, as PyG calls it
                score = score + (self.lin_edge(edge_attr).view(-1, H, C) * self.att_edge).sum(-1)  # (E, H)
        score = F.leaky_relu(score, self.negative_slope)  # (E, H)
        return _attend(self, score, x_src, edge_index, num_targets, res, given, return_attention_weights, loops)

    @classmethod
    def from_gat_conv(cls, conv: PyGGATConv, impl: str = "auto") -> GATConv:
        """An exact copy of a PyG ``GATConv`` (configuration and weights)."""
        return _from(cls, conv, impl)

    def to_gat_conv(self) -> PyGGATConv:
        """PyG's ``GATConv`` with this layer's configuration and a copy of its weights."""
        return _to(self, PyGGATConv)


class GATv2Conv(PyGGATv2Conv):
    r"""PyG's GATv2 layer [1]_ on graphattn's kernels (exact, same parameters).

    .. math::
        \alpha_{ij} = \mathrm{softmax}_{j \in \mathcal{N}(i)}\, a^\top \mathrm{LeakyReLU}\big(
        \Theta_s x_j + \Theta_t x_i + \Theta_e e_{ij}\big), \qquad
        x_i' = \sum_{j \in \mathcal{N}(i)} \alpha_{ij} \Theta_s x_j

    Parameters
    ----------
    in_channels, out_channels, heads, concat, negative_slope, dropout, add_self_loops, edge_dim, fill_value, bias, share_weights, residual
        As :class:`torch_geometric.nn.GATv2Conv` (PyG's defaults).
    impl : {"auto", "message_passing"}, default "auto"
        As :class:`GATConv`.
    **kwargs
        Passed to :class:`torch_geometric.nn.MessagePassing`.

    Notes
    -----
    The scores need ``LeakyReLU(Θ_s x_j + Θ_t x_i)`` per edge, head and channel
    (the nonlinearity comes before the dot product with ``a``): on the CPU
    (one thread) the ``graphattn::gatv2_score`` operator forms them in one pass over the
    edges, forward and backward, without an ``(E, H, C)`` tensor; otherwise
    PyTorch's operations form that tensor (as PyG's). The softmax and
    aggregation then run fused.

    References
    ----------
    .. [1] Brody, Alon and Yahav, "How Attentive are Graph Attention Networks?", ICLR 2022, eq. (7).
    """

    def __init__(
        self,
        in_channels,
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        negative_slope: float = 0.2,
        dropout: float = 0.0,
        add_self_loops: bool = True,
        edge_dim=None,
        fill_value="mean",
        bias: bool = True,
        share_weights: bool = False,
        residual: bool = False,
        impl: str = "auto",
        **kwargs,
    ):
        self.impl = check_choice("impl", impl, ("auto", "message_passing"))
        super().__init__(
            in_channels,
            out_channels,
            heads=heads,
            concat=concat,
            negative_slope=negative_slope,
            dropout=dropout,
            add_self_loops=add_self_loops,
            edge_dim=edge_dim,
            fill_value=fill_value,
            bias=bias,
            share_weights=share_weights,
            residual=residual,
            **kwargs,
        )
        _keep_pygs_explain_path(self)

    def forward(self, x, edge_index, edge_attr: Tensor | None = None, return_attention_weights=None):
        """PyG's ``GATv2Conv.forward``, fused (module docstring)."""
        # PyG generates propagate/edge_updater from these comments in the class's own source (checked on 2.8):
        # edge_updater_type: (x: PairTensor, edge_attr: OptTensor)
        # propagate_type: (x: PairTensor, alpha: Tensor)
        if not _fast(self, edge_index):
            return super().forward(x, propagate_index(edge_index), edge_attr, return_attention_weights)
        H, C = self.heads, self.out_channels
        x_l, x_r = (x, x) if isinstance(x, Tensor) else x
        _check_dtypes((("x", x_l, self.lin_l), ("x", x_r, self.lin_r)))
        res = None if self.res is None or x_r is None else self.res(x_r)
        one = x_l is x_r and self.share_weights  # one projection of one input
        given, edge_index = edge_index, _edges(edge_index, x_l.size(0), x_r.size(0))
        src, dst, loops = edge_index[0], edge_index[1], 0  # (E,), (E,)
        if self.add_self_loops:
            loops = min(x_l.size(0), x_r.size(0))
            src, dst, edge_attr = _self_loops(self, edge_index, edge_attr, loops)  # E + N edges
        if edge_attr is not None and self.lin_edge is None:  # PyG asserts; it was a 'NoneType' call here
            raise ValueError(message("edge_attr", "None for a layer built without edge_dim", "a Tensor"))
        xs, lins = ((x_l,), (self.lin_l,)) if one else ((x_l, x_r), (self.lin_l, self.lin_r))
        if edge_attr is not None:  # (E + loops, F_e): Θ_e e_ij projected with the nodes, PyG's order
            xs, lins = (*xs, edge_attr.view(-1, 1) if edge_attr.dim() == 1 else edge_attr), (*lins, self.lin_edge)
        # (S, H, C), (L, H, C), (E + loops, H, C): heads innermost at one thread, for graphattn::gatv2_score's kernel
        rows = project_rows(xs, lins, H, C, fast=ops.additive.usable(x_l, x_r, self.att))
        x_l, x_r = rows[0], rows[0 if one else 1]
        edge = rows[-1] if edge_attr is not None else None
        att = self.att.view(H, C)
        scores = ops.additive.gatv2_score if ops.additive.usable(x_l, x_r, att, edge) else ops.additive.readable
        score = scores(x_l, x_r, src, dst, att, edge, self.negative_slope)  # (E, H): a · LeakyReLU(Θ_s x_j + Θ_t x_i)
        return _attend(self, score, x_l, edge_index, x_r.size(0), res, given, return_attention_weights, loops)

    @classmethod
    def from_gatv2_conv(cls, conv: PyGGATv2Conv, impl: str = "auto") -> GATv2Conv:
        """An exact copy of a PyG ``GATv2Conv`` (configuration and weights)."""
        return _from(cls, conv, impl)

    def to_gatv2_conv(self) -> PyGGATv2Conv:
        """PyG's ``GATv2Conv`` with this layer's configuration and a copy of its weights."""
        return _to(self, PyGGATv2Conv)
