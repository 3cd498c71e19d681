"""The oracle: plain dense self-attention in six named steps.

No fused kernels and no fast paths: every intermediate is computed with
ordinary matrix products and returned under its name, for teaching and as the
reference every fast path is tested against.

The six steps (Vaswani et al. 2017, eq. 1 [1]_), for one head of width ``d_k``:

1) project   ``Q = X W_Q,  K = X W_K,  V = X W_V``
2) score     ``Q K^T``                         (rows = queries i, columns = keys j)
3) scale     ``Q K^T / sqrt(d_k)``             (+ an optional additive bias)
4) mask      disallowed (i, j) set to ``-inf``, *before* the softmax
5) softmax   per row i over the allowed keys j; a row with no allowed key is 0
6) combine   ``Y = A V``                       (heads concatenated)

References
----------
.. [1] A. Vaswani et al., "Attention Is All You Need", NeurIPS 2017, eq. (1).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor, nn

from graphattn.validate import as_int, check_bool, check_float, check_int, check_tensor, message

__all__ = ["SixSteps", "six_steps", "DenseAttention"]


class SixSteps(NamedTuple):
    """Every intermediate of :func:`six_steps` (``...`` = optional batch dims)."""

    queries: Tensor  # (..., H, L, D)   1) project
    keys: Tensor  # (..., H, S, D)
    values: Tensor  # (..., H, S, D)
    scores: Tensor  # (..., H, L, S)   2) Q K^T
    scaled: Tensor  # (..., H, L, S)   3) / sqrt(d_k) (+ bias)
    masked: Tensor  # (..., H, L, S)   4) -inf where not allowed
    weights: Tensor  # (..., H, L, S)   5) softmax per row; rows sum to 1 or are all 0
    output: Tensor  # (..., L, H * D)  6) weights @ values, heads concatenated


def _split_heads(x: Tensor, heads: int) -> Tensor:
    *batch, n, f = x.shape
    return x.reshape(*batch, n, heads, f // heads).transpose(-3, -2)  # (..., H, n, D)


def _check_projections(x: Tensor, x_kv: Tensor, w_q: Tensor, w_k: Tensor, w_v: Tensor) -> None:
    """Floating-point features (..., n, F) and (F, H * D) weights whose sizes meet."""
    for name, t in (("x", x), ("x_kv", x_kv)):
        check_tensor(name, t, dim=tuple(range(2, 64)), shape_text="(..., n, F)", floating=True)
    for name, w, f in (("w_q", w_q, x), ("w_k", w_k, x_kv), ("w_v", w_v, x_kv)):
        check_tensor(name, w, dim=2, shape_text="(F, H * D)", floating=True)
        width = w_q.shape[1] if name == "w_k" else w.shape[1]  # keys meet queries; values may be wider
        if w.shape != (f.shape[-1], width):
            raise ValueError(message(name, f"of shape ({f.shape[-1]}, {width}), (F, H * D)", tuple(w.shape)))
    for name, t in (("x_kv", x_kv), ("w_q", w_q), ("w_k", w_k), ("w_v", w_v)):
        if t.dtype != x.dtype:
            raise TypeError(message(name, f"of the dtype of 'x' ({x.dtype})", t.dtype))


def six_steps(
    x: Tensor,
    w_q: Tensor,
    w_k: Tensor,
    w_v: Tensor,
    mask: Tensor | None = None,
    *,
    heads: int = 1,
    x_kv: Tensor | None = None,
    b_q: Tensor | None = None,
    b_k: Tensor | None = None,
    b_v: Tensor | None = None,
    scale: float | None = None,
    bias: Tensor | None = None,
) -> SixSteps:
    """Dense multi-head attention in six named steps (the oracle).

    .. math::
        \\alpha_{ij} = \\mathrm{softmax}_{j:\\,M_{ij}}\\Big(\\frac{q_i \\cdot k_j}{\\sqrt{d_k}} + b_{ij}\\Big),
        \\qquad y_i = \\sum_j \\alpha_{ij} v_j

    Parameters
    ----------
    x : Tensor, shape (..., L, F_q)
        Query-side token features (also keys/values unless ``x_kv`` is given).
    w_q : Tensor, shape (F_q, H * D)
        Query projection, used as ``x @ w_q`` (textbook orientation; an
        ``nn.Linear`` weight is its transpose).
    w_k, w_v : Tensor, shape (F_kv, H * D)
        Key and value projections.
    mask : Tensor, shape (L, S) or broadcastable to (..., H, L, S), dtype bool, optional
        True = query i may attend key j (SDPA polarity). ``None``: all allowed.
    heads : int, default 1
        H; ``H * D`` must equal the projections' width.
    x_kv : Tensor, shape (..., S, F_kv), optional
        Key/value token features for cross-attention (default ``x``).
    b_q, b_k, b_v : Tensor, shape (H * D,), optional
        Projection biases.
    scale : float, optional
        Score scale, default ``1 / sqrt(D)`` with D = d_k the per-head width.
    bias : Tensor, broadcastable to (..., H, L, S), optional
        Additive score bias, added after scaling and before masking.

    Returns
    -------
    SixSteps
        ``queries, keys, values`` (..., H, n, D); ``scores, scaled, masked,
        weights`` (..., H, L, S); ``output`` (..., L, H * D). ``weights`` rows sum
        to 1 over the allowed j, or are exactly 0 when no key is allowed (by the
        mask or a ``-inf`` bias). Step 6 is a plain matrix product, so a NaN or
        inf in *any* value reaches every output row (0 * NaN = NaN); the fast
        kernels of :func:`graphattn.attention` never read non-neighbours.

    Raises
    ------
    TypeError
        ``x``, ``x_kv`` or a weight not a floating-point Tensor; ``mask`` not bool;
        ``heads`` not an int; ``scale`` not a number; features and weights of different dtypes.
    ValueError
        ``heads`` < 1 or not dividing the projection width; a ``mask`` that does
        not broadcast; a non-finite ``scale``.

    Examples
    --------
    >>> import torch
    >>> x = torch.eye(3)
    >>> steps = six_steps(x, torch.eye(3), torch.eye(3), torch.eye(3))
    >>> steps.weights.shape, steps.output.shape
    (torch.Size([1, 3, 3]), torch.Size([3, 3]))
    >>> torch.allclose(steps.weights.sum(-1), torch.ones(1, 3))  # each row i sums to 1 over j
    True
    """
    _check_projections(x, x if x_kv is None else x_kv, w_q, w_k, w_v)
    if mask is not None and (not isinstance(mask, Tensor) or mask.dtype != torch.bool):
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(message("mask", "a bool tensor where True means may attend", got))
    heads = check_int("heads", heads, 1)
    for width in (w_q.shape[-1], w_v.shape[-1]):
        if width % heads != 0:
            raise ValueError(message("heads", f"a positive int dividing the projection width {width}", heads))
    for name, b, w in (("b_q", b_q, w_q), ("b_k", b_k, w_k), ("b_v", b_v, w_v)):
        if b is not None and check_tensor(name, b, floating=True).shape != (w.shape[1],):
            raise ValueError(message(name, f"a Tensor of shape ({w.shape[1]},)", f"shape {tuple(b.shape)}"))
    scale = None if scale is None else check_float("scale", scale)
    x_kv = x if x_kv is None else x_kv

    # 1) project: Q = X W_Q, K = X W_K, V = X W_V, split into heads
    q, k, v = x @ w_q, x_kv @ w_k, x_kv @ w_v  # (..., L, H*D), (..., S, H*D), (..., S, H*D)
    q, k, v = (t if b is None else t + b for t, b in ((q, b_q), (k, b_k), (v, b_v)))
    queries, keys, values = (_split_heads(t, heads) for t in (q, k, v))  # (..., H, L|S, D)

    # 2) score: every query against every key
    scores = queries @ keys.transpose(-1, -2)  # (..., H, L, D) · (..., H, D, S) -> (..., H, L, S)

    # 3) scale by 1/sqrt(d_k) so the softmax does not saturate as d_k grows
    scale = 1.0 / math.sqrt(queries.size(-1)) if scale is None else scale
    scaled = scores * scale  # (..., H, L, S)
    if bias is not None:
        try:
            scaled = scaled + check_tensor("bias", bias, floating=True)  # (..., H, L, S)
        except RuntimeError:
            raise ValueError(
                message("bias", f"broadcastable to (..., H, L, S) = {tuple(scaled.shape)}", tuple(bias.shape))
            ) from None

    # 4) mask before the softmax: a disallowed key gets -inf, i.e. weight exactly 0
    allowed = torch.ones_like(scaled, dtype=torch.bool)
    if mask is not None:
        try:
            allowed = allowed & mask  # (..., H, L, S)
        except RuntimeError:
            raise ValueError(
                message("mask", f"broadcastable to (..., H, L, S) = {tuple(scaled.shape)}", tuple(mask.shape))
            ) from None
    allowed = allowed & ~torch.isneginf(scaled)  # a -inf bias removes the key too
    masked = scaled.masked_fill(~allowed, float("-inf"))  # (..., H, L, S)

    # 5) softmax per row; a row with no allowed key would be 0/0, define it as 0
    has_key = allowed.any(dim=-1, keepdim=True)  # (..., H, L, 1)
    weights = torch.softmax(masked.masked_fill(~has_key, 0.0), dim=-1)  # (..., H, L, S)
    weights = weights.masked_fill(~allowed, 0.0)

    # 6) combine: weighted sum of the values, heads concatenated
    out = weights @ values  # (..., H, L, S) · (..., H, S, D) -> (..., H, L, D)
    output = out.transpose(-3, -2).flatten(-2)  # (..., L, H*D)
    return SixSteps(queries, keys, values, scores, scaled, masked, weights, output)


def reset_like_mha(projections, lin_out: nn.Linear | None) -> None:
    """``nn.MultiheadAttention``'s initialisation: Xavier-uniform ``projections`` and zero biases; ``lin_out``
    its own ``reset_parameters`` and a zero bias (this oracle's and :class:`graphattn.AttentionConv`'s).
    """
    for lin in projections:
        nn.init.xavier_uniform_(lin.weight)
        if lin.bias is not None:
            nn.init.zeros_(lin.bias)
    if lin_out is not None:
        lin_out.reset_parameters()
        if lin_out.bias is not None:
            nn.init.zeros_(lin_out.bias)


class DenseAttention(nn.Module):
    """Dense multi-head attention, the twin of :class:`~graphattn.conv.AttentionConv`.

    Same constructor arguments in the same order, same parameter names, same initialisation
    (:meth:`reset_parameters`) and the same input forms, so ``load_state_dict`` moves weights between
    the two and an equivalence test is one line. The graph is a dense mask instead of an edge list:
    ``mask[i, j]`` is True exactly when ``(j, i)`` is an edge. The computation is :func:`six_steps`,
    then ``lin_out``.

    Parameters
    ----------
    in_channels : int or (int, int) or (int, int, int)
        ``F_in``, or ``(F_kv, F_q)`` for cross-attention, or ``(F_k, F_v, F_q)``.
    out_channels : int
        ``F_out = H * D``, the total width (as ``embed_dim`` in ``nn.MultiheadAttention``).
    heads : int, default 1
        H; must divide ``out_channels``.
    bias : bool, default True
        Biases in the four projections (keyword only, like every argument after ``heads``: the
        layer's fourth positional argument is ``dropout``, which the oracle does not have).
    output_projection : bool, default True
        Apply ``lin_out`` (``F_out -> F_out``) after concatenating the heads.

    Raises
    ------
    TypeError, ValueError
        Sizes that are not positive ints, ``heads`` not dividing ``out_channels``.

    Examples
    --------
    >>> import torch, graphattn as ga
    >>> conv = ga.AttentionConv(8, 8, heads=2).double()
    >>> oracle = ga.dense.DenseAttention(8, 8, heads=2).double()
    >>> _ = oracle.load_state_dict(conv.state_dict())
    >>> x = torch.randn(5, 8, dtype=torch.float64)
    >>> out, weights = oracle(x, ga.patterns.causal().mask(5))
    >>> torch.allclose(out, conv(x, ga.patterns.causal().edge_index(5)), atol=1e-12), weights.shape
    (True, torch.Size([2, 5, 5]))
    """

    def __init__(
        self, in_channels, out_channels: int, heads: int = 1, *, bias: bool = True, output_projection: bool = True
    ):
        super().__init__()
        sizes = _feature_sizes(in_channels)
        out_channels, heads = check_int("out_channels", out_channels, 1), check_int("heads", heads, 1)
        if out_channels % heads != 0:
            raise ValueError(message("heads", f"a positive int dividing out_channels = {out_channels}", heads))
        check_bool("bias", bias), check_bool("output_projection", output_projection)
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        f_k, f_v, f_q = sizes
        self.lin_query = nn.Linear(f_q, out_channels, bias=bias)
        self.lin_key = nn.Linear(f_k, out_channels, bias=bias)
        self.lin_value = nn.Linear(f_v, out_channels, bias=bias)
        self.lin_out = nn.Linear(out_channels, out_channels, bias=bias) if output_projection else None
        self.reset_parameters()

    def reset_parameters(self):
        """Initialise as ``nn.MultiheadAttention`` and ``AttentionConv`` do (Xavier-uniform weights, zero biases)."""
        reset_like_mha((self.lin_query, self.lin_key, self.lin_value), self.lin_out)

    def forward(self, x, mask: Tensor | None = None, attn_bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Return ``(output (..., L, F_out), weights (..., H, L, S))``.

        Parameters
        ----------
        x : Tensor or (Tensor, Tensor) or (Tensor, Tensor, Tensor)
            ``x (..., N, F_in)``, or ``(x_kv (..., S, F_kv), x_q (..., L, F_q))``, or
            ``(x_k, x_v, x_q)``: the layer's input forms, keys and values first.
        mask : Tensor, shape (L, S) or broadcastable to (..., H, L, S), dtype bool, optional
            True = query i may attend key j. ``None``: all allowed.
        attn_bias : Tensor, broadcastable to (..., H, L, S), optional
            Additive score bias (the dense form of the layer's ``edge_bias``).
        """
        x_k, x_v, x_q = _inputs(x)
        w_k, w_v = self.lin_key.weight.T, self.lin_value.weight.T  # (F_k, H*D), (F_v, H*D)
        if x_k is not x_v:  # one key/value input [x_k | x_v] with block weights: the zero blocks add exact zeros
            x_k = torch.cat([x_k, x_v], dim=-1)  # (..., S, F_k + F_v)
            w_k, w_v = torch.cat([w_k, torch.zeros_like(w_v)]), torch.cat([torch.zeros_like(w_k), w_v])
        b = [lin.bias for lin in (self.lin_query, self.lin_key, self.lin_value)]
        steps = six_steps(
            x_q,
            self.lin_query.weight.T,
            w_k,
            w_v,
            mask,
            heads=self.heads,
            x_kv=x_k,
            b_q=b[0],
            b_k=b[1],
            b_v=b[2],
            bias=attn_bias,
        )
        out = steps.output if self.lin_out is None else self.lin_out(steps.output)
        return out, steps.weights

    def __repr__(self) -> str:
        extra = "".join(
            f", {k}={v}"
            for k, v in (("bias", self.lin_query.bias is not None), ("output_projection", self.lin_out is not None))
            if not v
        )
        return f"{type(self).__name__}({self.in_channels}, {self.out_channels}, heads={self.heads}{extra})"


def _feature_sizes(in_channels) -> tuple[int, int, int]:
    """``in_channels`` as ``(F_k, F_v, F_q)`` from ``F``, ``(F_kv, F_q)`` or ``(F_k, F_v, F_q)``."""
    if as_int(in_channels) is not None:
        return (check_int("in_channels", in_channels, 1),) * 3
    if isinstance(in_channels, (tuple, list)) and len(in_channels) in (2, 3):
        sizes = [check_int("in_channels", f, 1) for f in in_channels]
        return (sizes[0], sizes[0], sizes[1]) if len(sizes) == 2 else (sizes[0], sizes[1], sizes[2])
    raise TypeError(message("in_channels", "an int, a pair (F_kv, F_q) or a triple (F_k, F_v, F_q)", in_channels))


def _inputs(x) -> tuple[Tensor, Tensor, Tensor]:
    """``(x_k, x_v, x_q)`` from a tensor, a pair ``(x_kv, x_q)`` or a triple ``(x_k, x_v, x_q)``."""
    if isinstance(x, Tensor):
        return x, x, x
    if isinstance(x, (tuple, list)) and len(x) == 2:
        return x[0], x[0], x[1]
    if isinstance(x, (tuple, list)) and len(x) == 3:
        return x[0], x[1], x[2]
    raise TypeError(message("x", "a Tensor, a pair (x_kv, x_q) or a triple (x_k, x_v, x_q)", type(x).__name__))
