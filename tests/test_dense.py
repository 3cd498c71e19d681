"""The oracle against PyTorch's own attention, and its defined edge cases."""

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import DTYPES, assert_close
from graphattn import dense


def _sdpa_reference(steps, mask=None, bias=None, is_causal=False):
    attn_mask = bias if mask is None else (mask if bias is None else bias.masked_fill(~mask, float("-inf")))
    out = F.scaled_dot_product_attention(steps.queries, steps.keys, steps.values, attn_mask=attn_mask,
                                         is_causal=is_causal)  # (H, L, D)
    return out.transpose(0, 1).flatten(-2)  # (L, H*D)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("L,S,heads", [(1, 1, 1), (7, 7, 2), (5, 11, 3), (12, 4, 4)])
def test_six_steps_equals_sdpa(dtype, L, S, heads):
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
    L, f_in, heads = 9, 8, 2
    x = torch.randn(L, f_in, dtype=dtype)
    w = [torch.randn(f_in, 8, dtype=dtype) / math.sqrt(f_in) for _ in range(3)]
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    steps = dense.six_steps(x, *w, causal, heads=heads)
    assert_close(steps.output, _sdpa_reference(steps, is_causal=True))
    bias = torch.randn(heads, L, L, dtype=dtype)
    steps = dense.six_steps(x, *w, causal, heads=heads, bias=bias)
    assert_close(steps.output, _sdpa_reference(steps, mask=causal, bias=bias))


def test_intermediates_are_the_named_steps():
    x = torch.randn(3, 4, dtype=torch.float64)
    w_q, w_k, w_v = (torch.randn(4, 4, dtype=torch.float64) for _ in range(3))
    mask = torch.tensor([[True, False, False], [True, True, False], [True, True, True]])
    s = dense.six_steps(x, w_q, w_k, w_v, mask)
    assert_close(s.queries[0], x @ w_q)
    assert_close(s.scores[0], (x @ w_q) @ (x @ w_k).T)
    assert_close(s.scaled, s.scores / 2.0)  # d_k = 4
    assert torch.isneginf(s.masked[0][~mask]).all() and torch.equal(s.masked[0][mask], s.scaled[0][mask])
    assert_close(s.weights.sum(-1), torch.ones(1, 3, dtype=torch.float64))
    assert_close(s.output, s.weights[0] @ (x @ w_v))
    assert s.output.shape == x.shape


def test_row_without_keys_is_zero_not_nan():
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
    x = torch.randn(3, 4)
    with pytest.raises(TypeError, match="True means may attend"):
        dense.six_steps(x, *(torch.eye(4),) * 3, mask=torch.ones(3, 3))


def test_heads_must_divide_width():
    with pytest.raises(ValueError, match="heads"):
        dense.six_steps(torch.randn(3, 4), *(torch.eye(4),) * 3, heads=3)


def test_minus_inf_bias_row_is_zero_and_biases_are_independent():
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
    with pytest.raises(ValueError, match=r"'mask' to be broadcastable to \(..., H, L, S\) = \(1, 3, 3\) \(got \(2, 2\)\)"):
        dense.six_steps(torch.randn(3, 4), *(torch.eye(4),) * 3, mask=torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="heads"):
        dense.six_steps(torch.randn(3, 4), *(torch.eye(4),) * 3, heads=0)
