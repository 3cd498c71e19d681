"""The public entries :func:`attention` and :func:`batched_attention`: argument checks, then the operators.

Everything here is traceable by ``torch.compile`` (shape, dtype and type
checks only); what depends on the edges' values runs inside the operators
of :mod:`graphattn.ops.operators` (the structure, the kernel choice, the
range and NaN checks of ``edge_index`` and ``edge_bias``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from graphattn import _compat
from graphattn.graphs import check_edge_index
from graphattn.ops.guard import causal_guards, check_bias_values
from graphattn.ops.operators import (
    attention_op,
    choose_impl,
    ragged_attention_op,
    reference_attention,
)
from graphattn.ops.ragged import (
    RAGGED_KINDS,
    fits_one_padded_call,
    group_sizes,
    padded_attention,
    per_graph_edges,
    ragged_forward,
)
from graphattn.ops.sdpa import run_sdpa
from graphattn.ops.shared import apply_keep, compute_dtype, draw_keep, resolve_scale
from graphattn.ops.structure import pattern_edges
from graphattn.patterns import is_pattern
from graphattn.validate import (
    check_bool,
    check_choice,
    check_edge_list,
    check_float,
    check_probability,
    check_tensor,
    message,
    shape_message,
)

__all__ = ["attention", "batched_attention", "check_qkv", "check_edge_bias", "choose_impl", "IMPLS"]

IMPLS = ("auto", "sdpa", "block", "csr")


def check_qkv(query: Tensor, key: Tensor, value: Tensor) -> None:
    """Validate ``query (L, H, D)``, ``key (S, H, D)``, ``value (S, H, D_v)``.

    Raises
    ------
    TypeError
        If they are not floating-point tensors of one dtype.
    ValueError
        If their shapes do not agree.
    """
    for name, t in (("query", query), ("key", key), ("value", value)):
        check_tensor(name, t, dim=3, shape_text="(n, H, D)", floating=True)
    for name, t in (("key", key), ("value", value)):
        if t.dtype != query.dtype:
            raise TypeError(message(name, f"of the dtype of 'query' ({query.dtype})", t.dtype))
    if key.shape[:2] != value.shape[:2]:
        raise ValueError(
            message(
                "key",
                "(S, H, D) agreeing on S and H with 'value' (S, H, D_v)",
                f"{tuple(key.shape)} and {tuple(value.shape)}",
            )
        )
    if query.size(-1) == 0 or value.size(-1) == 0:
        raise ValueError(
            message("query", "at least one channel per head", f"D = {query.size(-1)}, D_v = {value.size(-1)}")
        )
    if query.shape[1:] != key.shape[1:]:
        raise ValueError(
            message(
                "query",
                "(L, H, D) agreeing on H and D with 'key' (S, H, D)",
                f"{tuple(query.shape)} and {tuple(key.shape)}",
            )
        )


def check_edge_bias(
    edge_bias: Tensor | None, num_edges: int, heads: int, dtype=None, check_values: bool = True
) -> Tensor | None:
    """Validate ``edge_bias`` of shape ``(E,)`` or ``(E, H)``; return it as ``(E, H)`` or ``(E, 1)``.

    Raises
    ------
    TypeError
        Not a floating-point tensor, or not of ``dtype`` (when given).
    ValueError
        Another shape, or (``check_values``, and not while compiling: the
        operator checks them then) a NaN or ``+inf`` entry.
    """
    if edge_bias is None:
        return None
    check_tensor("edge_bias", edge_bias, floating=True)
    if dtype is not None and edge_bias.dtype != dtype:
        raise TypeError(message("edge_bias", f"of the features' dtype {dtype}", edge_bias.dtype))
    got = tuple(edge_bias.shape)
    if edge_bias.dim() == 1:
        edge_bias = edge_bias.unsqueeze(-1)  # (E, 1)
    if edge_bias.dim() != 2 or edge_bias.size(0) != num_edges or edge_bias.size(1) not in (1, heads):
        raise ValueError(shape_message("edge_bias", f"(E,) or (E, H) = ({num_edges},) or ({num_edges}, {heads})", got))
    if check_values and not torch.compiler.is_compiling():
        check_bias_values(edge_bias)
    return edge_bias


def attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    edge_index,
    *,
    scale: float | None = None,
    edge_bias: Tensor | None = None,
    dropout: float = 0.0,
    training: bool = True,
    need_weights: bool = False,
    impl: str = "auto",
) -> tuple[Tensor, Tensor | None]:
    """Multi-head attention restricted to the edges of a graph (no parameters).

    .. math::
        \\alpha_{ij}^h = \\mathrm{softmax}_{j \\in \\mathcal{N}(i)}
        \\big(\\mathrm{scale}\\; q_i^h \\cdot k_j^h + b_{ij}^h\\big),
        \\qquad y_i^h = \\sum_{j \\in \\mathcal{N}(i)} \\alpha_{ij}^h v_j^h

    where :math:`\\mathcal{N}(i)` are the sources of the edges into target i.

    Parameters
    ----------
    query : Tensor, shape (L, H, D)
        One row per query (target) node i.
    key : Tensor, shape (S, H, D)
        One row per key (source) node j.
    value : Tensor, shape (S, H, D_v)
    edge_index : Tensor, shape (2, E), or graphattn.patterns.Pattern
        Row 0 = source j (key), row 1 = target i (query). Any order; duplicate
        edges count as separate edges (each gets its own weight, so a pair
        listed twice gets twice the share). A ``Pattern`` stands for
        ``pattern.edge_index(L, S)``; for kind ``"full"``/``"causal"`` the
        edges are never built.
    scale : float, optional
        Default ``1 / sqrt(D)``.
    edge_bias : Tensor, shape (E,) or (E, H), optional
        Added to the scaled scores before the softmax (relative positions,
        ALiBi, graph distances); ``-inf`` removes an edge.
    dropout : float, default 0.0
        Dropout probability on the attention weights, in [0, 1).
    training : bool, default True
        Apply dropout only when True (pass ``module.training``).
    need_weights : bool, default False
        Also return ``alpha``. Ask only when you use it: without weights the
        complete and causal graphs run SDPA's fused kernel, which never forms
        the ``(H, L, S)`` weights, and "block" skips gathering them; with
        weights "sdpa" runs SDPA's math (``softmax(q k^T * scale) v``).
    impl : {"auto", "sdpa", "block", "csr"}, default "auto"
        Kernel; ``"auto"`` picks the fastest exact one (:func:`choose_impl`).

    Returns
    -------
    output : Tensor, shape (L, H, D_v)
        A query with no incoming edge gets an exact zero row.
    alpha : Tensor, shape (E, H), or None
        Attention weight of each edge, in the order of ``edge_index``; for each
        query i they sum to 1 over its edges; with dropout applied they are
        returned after it, as ``nn.MultiheadAttention`` returns them (each
        kept weight divided by ``1 - dropout``, the others 0: the sum is 1
        only in expectation). None if ``need_weights`` is False.

    Raises
    ------
    TypeError
        Non-float features, mixed dtypes, a non-integer ``edge_index``, a
        non-number ``scale`` or ``dropout``, a non-bool flag.
    ValueError
        Shapes that do not agree, ``edge_bias`` of the wrong shape or holding
        NaN/+inf, ``dropout`` outside [0, 1), a non-finite ``scale``, an unknown ``impl``.
    IndexError
        An ``edge_index`` entry outside ``[0, S)`` (sources) or ``[0, L)`` (targets).
    NotImplementedError
        A forced ``impl`` that cannot run this graph (``"sdpa"`` on another
        edge set, ``"block"`` with duplicate edges).

    Notes
    -----
    No kernel copies features onto edges; extra memory is O(E H) + O(N H D).
    The kernel is chosen by :func:`choose_impl` inside the
    ``graphattn::attention`` operator (so ``torch.compile`` keeps it); the
    edges' structure is built once per graph (:func:`prepare`).

    NaN or inf in the features of a node that query i does not read never
    reaches query i's output: the dense kernels ("sdpa" for the causal DAG,
    "block") multiply zero weights by every key and value of a tile, so with
    non-finite features they run on finite copies and the queries that read
    a non-finite node are recomputed exactly on "csr"; every other output row
    is bitwise what it is with finite values there. (SDPA's own backward may
    still spread a NaN in ``dL/d output`` of a causal query to later keys.)

    Dropout draws its mask differently on each kernel (same distribution, not
    the same bits); with ``need_weights=False`` on "sdpa" the mask is SDPA's.

    A ``-inf`` in ``edge_bias`` gives the edge weight exactly 0 but keeps it in
    the graph, so a NaN/inf in that key's value still reaches the output
    (0 * NaN), as with SDPA's additive float masks; to remove an edge, leave it
    out of ``edge_index``. Second derivatives are exact on every kernel
    (``create_graph=True`` makes the operator's backward differentiable:
    :mod:`graphattn.ops.operators`). Inside a ``torch.func`` transform
    (``grad``, ``vmap``, ``jacrev``, ``vjp``) the call runs the per-edge
    formulation in plain PyTorch (O(E H D) memory), which composes with them;
    the operators do not in torch 2.13 (pytorch/pytorch#168393).

    float16/bfloat16: scores, softmax and weighted sums accumulate in
    float32, as SDPA's own kernels do, so a scaled score above 65504 stays
    finite; the output and the weights are rounded to the input dtype once.
    An edge list (every kernel) and a pattern with weights do this by
    converting the inputs to float32 for the call (a documented fallback:
    PyTorch's matmuls return half results, and its CPU sparse kernels lack
    half types); a ``"full"``/``"causal"`` pattern without weights is SDPA's
    fused kernel in the input dtype, whose own backward is coarser (several
    ulps of the largest gradient). Outputs of every kernel,
    with or without weights, agree to the dtype's rounding. A finite
    ``edge_bias`` is added in float32: ``finfo(float16).min`` is a large
    negative number (a row whose every edge carries it keeps its weights,
    the softmax being shift-invariant), ``finfo(bfloat16).min`` (-3.4e38)
    swamps any score (such a row gets uniform weights), both as in SDPA;
    only ``-inf`` gives an edge the weight 0.
    The structure cache is verified by content: any edit of ``edge_index``
    (in place, through ``.data`` or a shared NumPy array) is seen. Patterns
    are treated as immutable.
    With ``need_weights=False`` the "sdpa" output may be a non-contiguous view.

    Examples
    --------
    >>> import torch
    >>> q = k = v = torch.eye(2).reshape(2, 1, 2)          # L = S = 2, H = 1, D = 2
    >>> edge_index = torch.tensor([[0, 0, 1], [0, 1, 1]])  # 0 -> 0, 0 -> 1, 1 -> 1
    >>> out, alpha = attention(q, k, v, edge_index, need_weights=True)
    >>> alpha.squeeze(-1)
    tensor([1.0000, 0.3302, 0.6698])
    """
    check_qkv(query, key, value)
    dropout = check_probability("dropout", dropout)
    p = dropout if check_bool("training", training) else 0.0
    if scale is not None:
        check_float("scale", scale)
    check_bool("need_weights", need_weights)
    check_choice("impl", impl, IMPLS)
    L, H, D = query.shape
    S = key.size(0)
    scale = resolve_scale(scale, D)
    if not isinstance(edge_index, Tensor) and is_pattern(edge_index):
        if (
            edge_bias is None
            and impl in ("auto", "sdpa")
            and L > 0
            and S > 0
            and edge_index.kind in ("full", "causal")
            and not _compat.functorch_active()
        ):
            return _pattern_sdpa(query, key, value, edge_index.kind, scale, p, need_weights)  # no edge is built
        edge_index = pattern_edges(edge_index, L, S, device=query.device)  # (2, E)
    else:
        _check_edge_list(edge_index)
    edge_bias = check_edge_bias(edge_bias, edge_index.size(1), H, dtype=query.dtype, check_values=False)
    return _edge_attention(query, key, value, edge_index, edge_bias, scale, p, need_weights, impl)


def _check_edge_list(edge_index) -> None:
    """Type and shape of an edge list (its values are checked by the operator, which reads them)."""
    check_edge_list("edge_index", edge_index, "a LongTensor (2, E) or a graphattn.patterns.Pattern")


def _edge_attention(
    query, key, value, edge_index, edge_bias, scale: float, p: float, need_weights: bool, impl: str, loops: int = 0
):
    """``graphattn::attention`` on an edge list: half types in float32 (Notes), dropout applied to the weights.

    ``loops``: the edges ``(i, i)``, ``i < loops``, follow ``edge_index``'s (:func:`prepare`).
    """
    dtype = query.dtype
    acc = compute_dtype(dtype)
    if acc != dtype:  # half types: scores, softmax and sums in float32 (Notes); rounded once at the end
        query, key, value, edge_bias = (None if t is None else t.to(acc) for t in (query, key, value, edge_bias))
    if _compat.functorch_active():  # torch.func: plain PyTorch (the operators' autograd does not compose)
        out, alpha = _transformed_attention(query, key, value, edge_index, edge_bias, scale, p, loops)
        return out.to(dtype), None if not need_weights else alpha.to(dtype)
    tracked = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (query, key, value, edge_bias))
    out, alpha, keep = attention_op(
        query, key, value, edge_index, edge_bias, scale, p, need_weights or tracked, impl, not need_weights, loops
    )  # alpha only for the backward: kept in sorted order
    out = out.to(dtype)  # (L, H, D_v)
    if not need_weights:
        return out, None
    return out, apply_keep(alpha, keep if p > 0.0 else None, p).to(dtype)  # (E, H) after dropout, caller's order


def _transformed_attention(query, key, value, edge_index, edge_bias, scale: float, p: float, loops: int):
    """:func:`reference_attention` for a ``torch.func`` transform: ``out (L, H, D_v)``, ``alpha (E, H)`` after dropout.

    The indices are checked as the operator checks them; with ``loops``
    the own loops of ``edge_index`` are left out (weight 0) and ``(i, i)``, ``i < loops``, appended.
    """
    L, H = query.shape[:2]
    check_edge_index(edge_index, key.size(0), L)  # as the operator checks them
    E = edge_index.size(1)
    kept = None
    if loops:
        loop = torch.arange(loops, device=edge_index.device, dtype=edge_index.dtype)  # (N,)
        kept = torch.cat([edge_index[0] != edge_index[1], loop >= 0]).nonzero().squeeze(1)  # (E' + N,)
        edge_index = torch.cat([edge_index, loop.expand(2, -1)], dim=1)[:, kept]  # (2, E' + N)
        edge_bias = None if edge_bias is None else edge_bias.index_select(0, kept)
    keep = draw_keep(query.new_empty(edge_index.size(1), H), p) if p > 0.0 else None  # (E', H)
    out, alpha = reference_attention(query, key, value, edge_index, edge_bias, keep, scale, p)
    alpha = apply_keep(alpha, keep, p)  # (E' + N, H)
    if kept is not None:
        alpha = alpha.new_zeros(E + loops, H).index_copy(0, kept, alpha)  # the own loops: weight 0
    return out, alpha


def _pattern_sdpa(query, key, value, kind: str, scale: float, p: float, need_weights: bool):
    """A ``"full"``/``"causal"`` pattern on SDPA (PyTorch's autograd), guarded for non-finite features when eager."""
    L, S = query.size(0), key.size(0)
    dtype = query.dtype
    if need_weights and compute_dtype(dtype) != dtype:  # the math path accumulates half types in float32
        query, key, value = (t.to(compute_dtype(dtype)) for t in (query, key, value))
    guards = None if kind == "full" or torch.compiler.is_compiling() else causal_guards(L, S, query.device)

    def fix(sub_index, positions):  # the queries that read a non-finite row, exactly, on their own edges
        out, alpha = _edge_attention(query, key, value, sub_index, None, scale, p, True, "csr")
        return out, alpha.t(), None  # (L, H, D_v), (H, E')

    out, alpha = run_sdpa(query, key, value, kind, scale, p, need_weights, guards, fix)  # (L, H, D_v), (H, E)
    return out.to(dtype), None if alpha is None else alpha.t().to(dtype)  # (E, H), sorted = the pattern's order


def batched_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    pattern,
    batch: Tensor,
    *,
    scale: float | None = None,
    dropout: float = 0.0,
    training: bool = True,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """``pattern`` within each graph of a PyG batch: node i reads only nodes of its own graph.

    Parameters
    ----------
    query, key, value : Tensor, shape (N, H, D), (N, H, D), (N, H, D_v)
        One row per node (self-attention inside each graph: L = S = N).
    pattern : graphattn.patterns.Pattern
        Connectivity inside each graph; ``full()`` and ``causal()`` run the
        ragged kernel (:mod:`graphattn.ops.ragged`), other patterns their per-graph edges.
    batch : Tensor, shape (N,)
        PyG's ``batch`` vector (sorted graph index of each node).
    scale : float, optional
        Default ``1 / sqrt(D)``.
    dropout : float, default 0.0
    training : bool, default True
    need_weights : bool, default False
        Also return ``alpha (E, H)`` over the edges of
        ``graphs.batch_sequences(counts, pattern)`` (target-major inside each graph).

    Returns
    -------
    output : Tensor, shape (N, H, D_v)
    alpha : Tensor, shape (E, H), or None

    Raises
    ------
    TypeError
        ``pattern`` not a :class:`graphattn.patterns.Pattern` (an edge list, a mask, a name).
    ValueError
        A ``batch`` that is not a sorted ``(N,)`` vector, or ``L != S``.
    NotImplementedError
        A pattern that has no per-graph edges (e.g. one fixed to a length).

    Notes
    -----
    Under ``torch.compile`` the full and causal patterns without weights are
    one ``graphattn::ragged_attention`` operator (``fullgraph=True`` holds;
    its backward recomputes the forward). Other patterns, and the weights,
    need the graph sizes on the host: they run eagerly inside the compiled
    model (a graph break, so ``fullgraph=True`` refuses them).
    """
    check_qkv(query, key, value)
    N, H, D = query.shape
    if key.size(0) != N:
        raise ValueError(
            message("key", f"one row per node, N = {N} (attention within each graph)", f"shape {tuple(key.shape)}")
        )
    if not is_pattern(pattern):  # an edge list has no per-graph meaning here: the batch's graphs are the pattern's
        raise TypeError(
            message(
                "pattern",
                "a graphattn.patterns.Pattern, e.g. patterns.full() or patterns.causal()",
                type(pattern).__name__,
            )
        )
    check_tensor("batch", batch, dim=1, shape_text="(N,)")
    dropout = check_probability("dropout", dropout)
    p = dropout if check_bool("training", training) else 0.0
    scale = 1.0 / math.sqrt(D) if scale is None else float(check_float("scale", scale))
    kind = getattr(pattern, "kind", None)
    if kind not in RAGGED_KINDS or check_bool("need_weights", need_weights) or _compat.functorch_active():
        return _batched_on_edges(query, key, value, pattern, batch, scale, p, need_weights)
    causal = kind == "causal"
    if torch.compiler.is_compiling():  # one opaque operator; batch is validated inside, where it is read
        seed = torch.randint(0, 2**62, (), dtype=torch.long) if p > 0.0 else torch.zeros((), dtype=torch.long)
        return ragged_attention_op(query, key, value, batch, causal, scale, p, seed), None
    return ragged_forward(query, key, value, batch, causal, scale, p), None


@_compat.compiler_disable(
    "patterns other than full/causal, and the weights, read the graph sizes on the host; for "
    "fullgraph=True use patterns.full() or patterns.causal() without need_weights"
)
def _batched_on_edges(query, key, value, pattern, batch, scale: float, p: float, need_weights: bool):
    """Patterns other than full/causal (their per-graph edges), or the weights: the sizes are read on the host."""
    counts = group_sizes(batch, query.size(0))  # (B,)
    padded = getattr(pattern, "kind", None) in RAGGED_KINDS and not _compat.functorch_active()  # torch.func: edges
    if padded and query.size(0) and fits_one_padded_call(counts):
        return padded_attention(query, key, value, batch.long(), counts, pattern.kind == "causal", scale, p)
    if query.size(0) == 0:
        return value.new_zeros(0, query.size(1), value.size(-1)), value.new_zeros(0, query.size(1))
    edges = per_graph_edges(counts, pattern).to(query.device)  # (2, E): the pattern inside each graph
    return attention(query, key, value, edges, scale=scale, dropout=p, training=p > 0.0, need_weights=need_weights)
