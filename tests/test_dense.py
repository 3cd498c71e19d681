"""The oracle against PyTorch's own attention (SDPA, nn.MultiheadAttention), and its defined edge cases."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import DTYPES, TOL, assert_close

from graphattn import dense


def _sdpa_reference(steps, mask=None, bias=None, is_causal=False):
    attn_mask = bias if mask is None else (mask if bias is None else bias.masked_fill(~mask, float("-inf")))
    out = F.scaled_dot_product_attention(
        steps.queries, steps.keys, steps.values, attn_mask=attn_mask, is_causal=is_causal
    )  # (H, L, D)
    return out.transpose(0, 1).flatten(-2)  # (L, H*D)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("L,S,heads", [(1, 1, 1), (7, 7, 2), (5, 11, 3), (12, 4, 4)])
def test_six_steps_equals_sdpa(dtype, L, S, heads):
    """Reference: F.scaled_dot_product_attention for the output, a masked softmax for the weights."""
    f_in, width = 6, 4 * heads
    x, x_kv = torch.randn(L, f_in, dtype=dtype), torch.randn(S, f_in, dtype=dtype)
    w_q, w_k, w_v = (torch.randn(f_in, width, dtype=dtype) / math.sqrt(f_in) for _ in range(3))
    mask = torch.rand(L, S) < 0.6
    mask[:, 0] = True  # SDPA gives NaN on fully masked rows; the oracle's zero rows are tested below
    steps = dense.six_steps(x, w_q, w_k, w_v, mask, heads=heads, x_kv=x_kv)
    assert_close(steps.output, _sdpa_reference(steps, mask))
    ref_weights = torch.softmax((steps.queries @ steps.keys.mT / 2.0).masked_fill(~mask, float("-inf")), -1)
    assert_close(steps.weights, ref_weights)


@pytest.mark.parametrize("dtype", DTYPES)
def test_six_steps_causal_and_bias_equal_sdpa(dtype):
    """Reference: SDPA with is_causal=True, and with an additive float mask (bias) and -inf."""
    L, f_in, heads = 9, 8, 2
    x = torch.randn(L, f_in, dtype=dtype)
    w = [torch.randn(f_in, 8, dtype=dtype) / math.sqrt(f_in) for _ in range(3)]
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    steps = dense.six_steps(x, *w, causal, heads=heads)
    assert_close(steps.output, _sdpa_reference(steps, is_causal=True))
    bias = torch.randn(heads, L, L, dtype=dtype)
    steps = dense.six_steps(x, *w, causal, heads=heads, bias=bias)
    assert_close(steps.output, _sdpa_reference(steps, mask=causal, bias=bias))


def _mha_like(w_q, w_k, w_v, heads):
    """An nn.MultiheadAttention with the oracle's projections and an identity output projection."""
    width = w_q.shape[1]
    mha = torch.nn.MultiheadAttention(width, heads, bias=False, dtype=w_q.dtype)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([w_q.T, w_k.T, w_v.T]))  # nn.Linear stores W^T
        mha.out_proj.weight.copy_(torch.eye(width, dtype=w_q.dtype))
    return mha


@pytest.mark.parametrize("heads", [1, 2])
def test_named_steps_equal_multihead_attention(heads):
    """Reference: nn.MultiheadAttention (its mask polarity inverted: True = blocked) gives the
    per-head weights and the concatenated output; queries are X W_Q by definition."""
    x = torch.randn(5, 4, dtype=torch.float64)
    w_q, w_k, w_v = (torch.randn(4, 4, dtype=torch.float64) for _ in range(3))
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    s = dense.six_steps(x, w_q, w_k, w_v, mask, heads=heads)
    out, weights = _mha_like(w_q, w_k, w_v, heads)(x, x, x, attn_mask=~mask, average_attn_weights=False)
    assert_close(s.weights, weights)
    assert_close(s.output, out)
    assert_close(s.queries.transpose(0, 1).flatten(-2), x @ w_q)
    assert torch.isneginf(s.masked[:, ~mask]).all() and torch.equal(s.masked[:, mask], s.scaled[:, mask])
    assert_close(s.scaled, s.scores / math.sqrt(4 // heads))  # d_k = 4 / heads


def test_dense_attention_module_equals_multihead_attention():
    """Reference: nn.MultiheadAttention with the same weights (DenseAttention's names map onto it)."""
    mha = torch.nn.MultiheadAttention(6, 3, dtype=torch.float64)
    layer = dense.DenseAttention(6, 6, heads=3).double()
    w_q, w_k, w_v = mha.in_proj_weight.chunk(3)
    b_q, b_k, b_v = mha.in_proj_bias.chunk(3)
    with torch.no_grad():
        for lin, w, b in (
            (layer.lin_query, w_q, b_q),
            (layer.lin_key, w_k, b_k),
            (layer.lin_value, w_v, b_v),
            (layer.lin_out, mha.out_proj.weight, mha.out_proj.bias),
        ):
            lin.weight.copy_(w)
            lin.bias.copy_(b)
    x = torch.randn(7, 6, dtype=torch.float64)
    out, weights = layer(x)
    ref_out, ref_weights = mha(x, x, x, average_attn_weights=False)
    assert_close(out, ref_out)
    assert_close(weights, ref_weights)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_six_steps_in_half_precision_is_within_the_tolerance_table(dtype):
    """Reference: float64 SDPA on the same unit-scale inputs, rounded to ``dtype`` (conftest's TOL)."""
    x = torch.randn(16, 8, dtype=torch.float64)
    w = [torch.randn(8, 8, dtype=torch.float64) / math.sqrt(8) for _ in range(3)]
    exact = dense.six_steps(x, *w, heads=2)
    ref = F.scaled_dot_product_attention(exact.queries, exact.keys, exact.values).transpose(0, 1).flatten(-2)
    half = dense.six_steps(x.to(dtype), *(t.to(dtype) for t in w), heads=2)
    assert half.output.dtype == dtype
    torch.testing.assert_close(half.output, ref.to(dtype), **TOL[dtype])


def test_row_without_keys_is_zero_not_nan():
    """Known answer: a query with no allowed key has weights and output exactly 0, finite gradients."""
    x = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
    w = [torch.randn(4, 4, dtype=torch.float64) for _ in range(3)]
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[2] = False
    s = dense.six_steps(x, *w, mask)
    assert torch.equal(s.weights[0, 2], torch.zeros(4, dtype=torch.float64))
    assert torch.equal(s.output[2], torch.zeros(4, dtype=torch.float64))
    s.output.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_mask_must_be_bool():
    """Known refusal, naming the polarity."""
    x = torch.randn(3, 4)
    with pytest.raises(TypeError, match="True means may attend"):
        dense.six_steps(x, *(torch.eye(4),) * 3, mask=torch.ones(3, 3))


def test_heads_must_divide_width():
    """Known refusal: 3 heads cannot split a width of 4."""
    with pytest.raises(ValueError, match="heads"):
        dense.six_steps(torch.randn(3, 4), *(torch.eye(4),) * 3, heads=3)


def test_minus_inf_bias_row_is_zero_and_biases_are_independent():
    """Known answers: an all -inf bias row gives 0; b_q shifts the queries only (x W_Q + b_Q)."""
    x = torch.randn(3, 4, dtype=torch.float64)
    w = [torch.randn(4, 4, dtype=torch.float64) for _ in range(3)]
    bias = torch.zeros(1, 3, 3, dtype=torch.float64)
    bias[0, 1] = float("-inf")
    s = dense.six_steps(x, *w, bias=bias)
    assert torch.equal(s.weights[0, 1], torch.zeros(3, dtype=torch.float64))
    b_q = torch.randn(4, dtype=torch.float64)
    only_q = dense.six_steps(x, *w, b_q=b_q)
    assert_close(only_q.queries[0], x @ w[0] + b_q)
    assert_close(only_q.keys[0], x @ w[1])


def test_bad_mask_shape_and_heads():
    """Refusals in validate's template, before any product is taken."""
    with pytest.raises(
        ValueError, match=r"'mask' to be broadcastable to \(..., H, L, S\) = \(1, 3, 3\) \(got \(2, 2\)\)"
    ):
        dense.six_steps(torch.randn(3, 4), *(torch.eye(4),) * 3, mask=torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="heads"):
        dense.six_steps(torch.randn(3, 4), *(torch.eye(4),) * 3, heads=0)
    with pytest.raises(ValueError, match=r"'w_k' to be of shape \(4, 4\), \(F, H \* D\) \(got \(3, 4\)\)"):
        dense.six_steps(torch.randn(3, 4), torch.eye(4), torch.eye(3, 4), torch.eye(4))
    with pytest.raises(TypeError, match="'x' to be a floating-point Tensor"):
        dense.six_steps(torch.ones(3, 4, dtype=torch.long), *(torch.eye(4),) * 3)
    with pytest.raises(ValueError, match=r"'bias' to be broadcastable to \(..., H, L, S\) = \(1, 3, 3\)"):
        dense.six_steps(torch.randn(3, 4), *(torch.eye(4),) * 3, bias=torch.zeros(2, 2))
    with pytest.raises(ValueError, match="'scale' to be a finite float"):
        dense.six_steps(torch.randn(3, 4), *(torch.eye(4),) * 3, scale=float("nan"))


@pytest.mark.parametrize("bad", ["x_kv", "w_q", "w_k", "w_v"])
def test_six_steps_refuses_mixed_dtypes_naming_the_argument(bad):
    """float64 weights with float32 features used to fail inside torch's matmul."""
    x = torch.randn(3, 4)
    args = dict(x=x, x_kv=x, w_q=torch.randn(4, 4), w_k=torch.randn(4, 4), w_v=torch.randn(4, 4))
    args[bad] = args[bad].double()
    with pytest.raises(TypeError, match=rf"^Expected '{bad}' to be of the dtype of 'x' \(torch.float32\)"):
        dense.six_steps(**args)
    args[bad] = args[bad].float()
    same = dense.six_steps(**args)  # the same values in one dtype: the SDPA result
    ref = F.scaled_dot_product_attention(x @ args["w_q"], args["x_kv"] @ args["w_k"], args["x_kv"] @ args["w_v"])
    torch.testing.assert_close(same.output, ref, atol=1e-5, rtol=1e-5)
