"""The public entry :func:`attention`: argument checks, the kernel choice, and the call."""

from __future__ import annotations

import torch
from torch import Tensor

from graphattn.ops.block import BlockAttention
from graphattn.ops.csr import CSRAttention
from graphattn.ops.guard import causal_guards, graph_guards, guarded
from graphattn.ops.sdpa import run_sdpa
from graphattn.ops.shared import compute_dtype, resolve_scale
from graphattn.ops.structure import _Graph, prepare
from graphattn.patterns import is_pattern
from graphattn.validate import check_bool, check_choice, check_float, check_probability, check_tensor, message

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
        raise ValueError(message("key", "(S, H, D) agreeing on S and H with 'value' (S, H, D_v)",
                                 f"{tuple(key.shape)} and {tuple(value.shape)}"))
    if query.size(-1) == 0 or value.size(-1) == 0:
        raise ValueError(message("query", "at least one channel per head",
                                 f"D = {query.size(-1)}, D_v = {value.size(-1)}"))
    if query.shape[1:] != key.shape[1:]:
        raise ValueError(message("query", "(L, H, D) agreeing on H and D with 'key' (S, H, D)",
                                 f"{tuple(query.shape)} and {tuple(key.shape)}"))


def check_edge_bias(edge_bias: Tensor | None, num_edges: int, heads: int, dtype=None) -> Tensor | None:
    """Validate ``edge_bias`` of shape ``(E,)`` or ``(E, H)``; return it as ``(E, H)`` or ``(E, 1)``.

    Raises
    ------
    TypeError
        Not a floating-point tensor, or not of ``dtype`` (when given).
    ValueError
        Another shape, or a NaN or ``+inf`` entry.
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
        raise ValueError(f"Expected 'edge_bias' to have shape (E,) or (E, H) = ({num_edges},) or "
                         f"({num_edges}, {heads}) (got {got})")  # the template's shape form (STYLE.md)
    if edge_bias.numel() and bool((torch.isnan(edge_bias) | torch.isposinf(edge_bias)).any()):
        raise ValueError(message("edge_bias", "free of NaN and +inf", "a NaN or +inf entry",
                                 "-inf is allowed and gives the edge weight 0"))
    return edge_bias


def choose_impl(graph: _Graph, query: Tensor, key: Tensor, value: Tensor, edge_bias: Tensor | None = None,
                impl: str = "auto") -> str:
    """The kernel ``attention`` runs for these inputs: ``"sdpa"``, ``"block"`` or ``"csr"``.

    Rules, in order (``impl="auto"``):

    1. ``"sdpa"`` when there is no ``edge_bias`` and the edges are exactly the
       complete graph or exactly the causal DAG (top-left aligned).
    2. ``"block"`` when the edges have no duplicates and fill at least
       ``MIN_FILL`` of the padded ``BLOCK x BLOCK`` tiles.
    3. ``"csr"`` otherwise (exact for every input).

    A forced ``impl`` skips the cost rule of "block"; a forced kernel that
    cannot run the graph raises, it never runs another one.
    Non-finite features do not change the choice: "sdpa" and "block" then run
    on finite copies and the queries that read a non-finite node are redone
    exactly on "csr" (see :func:`attention`, Notes).

    Raises
    ------
    NotImplementedError
        A forced ``impl`` that cannot run this graph.
    """
    if impl in ("auto", "sdpa") and edge_bias is None and graph.edge_set() is not None:
        return "sdpa"
    if impl == "sdpa":
        raise NotImplementedError(message("edge_index", "the complete graph or the causal DAG (and no "
                                          "'edge_bias') for impl='sdpa'", "another edge set", "use impl='auto'"))
    if impl == "csr":
        return "csr"
    tiles = graph.tiles() if impl == "auto" else graph.tiles(min_fill=0.0)
    if tiles is None:
        if impl == "block":
            raise NotImplementedError(message("edge_index", "free of duplicates, with a tile table of at most "
                                              "max(4 E, 2^20) tiles, for impl='block'", "other edges",
                                              "use impl='csr'"))
        return "csr"
    return "block"


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
        query i they sum to 1 over its edges (after dropout if applied, as
        ``nn.MultiheadAttention`` returns them). None if ``need_weights`` is False.

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
    The kernel is chosen by :func:`choose_impl`; the edges' structure is built
    once per ``edge_index`` object (:func:`prepare`).

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
    out of ``edge_index``. The "block" and "csr" kernels are differentiable
    once (no double backward, e.g. gradient penalties: use
    ``AttentionConv(impl="message_passing")``).

    float16/bfloat16: scores, softmax and weighted sums accumulate in
    float32, as SDPA's own kernels do, so a scaled score above 65504 stays
    finite; the output and the weights are rounded to the input dtype once.
    "block", "csr" and "sdpa" with weights do this by converting the inputs
    to float32 for the call (a documented fallback: PyTorch's matmuls return
    half results, and its CPU sparse kernels lack half types); "sdpa" without
    weights is SDPA's fused kernel in the input dtype, whose own backward is
    coarser (several ulps of the largest gradient). Outputs of every kernel,
    with or without weights, agree to the dtype's rounding. A finite
    ``edge_bias`` is added in float32: ``finfo(float16).min`` is a large
    negative number (a row whose every edge carries it keeps its weights,
    the softmax being shift-invariant), ``finfo(bfloat16).min`` (-3.4e38)
    swamps any score (such a row gets uniform weights), both as in SDPA;
    only ``-inf`` gives an edge the weight 0.
    The structure cache notices in-place edits of ``edge_index`` through its
    version counter; edits that bypass it (``.data``, a shared NumPy array)
    are not seen: pass a new tensor. Patterns are treated as immutable.
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
    graph, chosen, bias = _plan(query, key, value, edge_index, edge_bias, impl)
    dtype = query.dtype
    upcast = compute_dtype(dtype) != dtype and (chosen != "sdpa" or need_weights)  # SDPA's fused: native
    if upcast:  # half types: scores, softmax and sums in float32 (Notes); rounded once at the end
        query, key, value, bias = (None if t is None else t.float() for t in (query, key, value, bias))
    if chosen == "sdpa":
        kind = edge_index.kind if graph is None else graph.edge_set()
        guards = None if kind == "full" else causal_guards(L, S, query.device) if graph is None else graph_guards(graph)
        out, alpha = run_sdpa(query, key, value, kind, scale, p, need_weights, guards)  # (L, H, D_v), (H, E)
    elif chosen == "block":
        tiles = graph.tiles(min_fill=0.0) if impl == "block" else graph.tiles()

        def kernel(q, k, v, b):
            return BlockAttention.apply(q, k, v, b, graph, tiles, scale, p, need_weights)

        out, alpha = guarded(kernel, query, key, value, *graph_guards(graph), bias, scale, p)
    else:
        out, alpha = CSRAttention.apply(query, key, value, bias, graph, scale, p)
    if upcast:
        out, alpha = out.to(dtype), alpha if alpha is None else alpha.to(dtype)
    if not need_weights:
        return out, None
    alpha = alpha.t()  # (E, H) sorted
    return out, alpha if graph is None else graph.unsort(alpha)  # (L, H, D_v), (E, H) in the caller's order


def _plan(query, key, value, edge_index, edge_bias, impl):
    """``(graph or None, kernel, bias (E, H or 1) sorted or None)``; no graph for a full/causal pattern on "sdpa"."""
    L, H, _ = query.shape
    S = key.size(0)
    if not isinstance(edge_index, Tensor) and is_pattern(edge_index):
        if edge_bias is None and impl in ("auto", "sdpa") and L > 0 and S > 0 and edge_index.kind in ("full", "causal"):
            return None, "sdpa", None  # the edges are never built
    graph = prepare(edge_index, L, S, device=query.device)
    edge_bias = check_edge_bias(edge_bias, graph.E, H, dtype=query.dtype)
    chosen = choose_impl(graph, query, key, value, edge_bias, impl)
    return graph, chosen, None if edge_bias is None else graph.sort(edge_bias)  # (E, H) or (E, 1)
