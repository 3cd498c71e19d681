"""graphattn::gatv2_score (GATv2's edge scores without an (E, H, C) tensor) against the readable formulation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close

from graphattn.ops import gatv2

pytest.importorskip("numba")


def _inputs(S=13, L=9, E=60, H=3, C=5, edge=True, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x_l, x_r = torch.randn(S, H, C, dtype=dtype, generator=g), torch.randn(L, H, C, dtype=dtype, generator=g)
    att = torch.randn(H, C, dtype=dtype, generator=g)
    src, dst = torch.randint(0, S, (E,), generator=g), torch.randint(0, L, (E,), generator=g)  # duplicates too
    e = torch.randn(E, H, C, dtype=dtype, generator=g) if edge else None
    return x_l, x_r, att, src, dst, e


def _pyg_formula(x_l, x_r, att, src, dst, edge, slope):
    """PyG's GATv2Conv.edge_update, written out independently of graphattn."""
    x = x_l[src] + x_r[dst]
    if edge is not None:
        x = x + edge
    return (F.leaky_relu(x, slope) * att.unsqueeze(0)).sum(dim=-1)


@pytest.mark.parametrize("edge", [False, True])
@pytest.mark.parametrize("slope", [0.2, 0.0, 1.5])
def test_scores_and_gradients_equal_the_formula(edge, slope):
    inputs = _inputs(edge=edge)
    leaves = [t.clone().requires_grad_() if t is not None and t.is_floating_point() else t for t in inputs]
    ref_leaves = [t.clone().requires_grad_() if t is not None and t.is_floating_point() else t for t in inputs]
    got = gatv2.gatv2_score(*leaves, negative_slope=slope)
    want = _pyg_formula(*ref_leaves, slope)
    assert_close(got, want, atol=1e-12, rtol=1e-12)
    grad = torch.randn_like(want)
    got.backward(grad)
    want.backward(grad)
    for a, b in zip(leaves, ref_leaves):
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            assert_close(a.grad, b.grad, atol=1e-12, rtol=1e-12)


def test_float32_matches_float64_formula():
    x_l, x_r, att, src, dst, e = _inputs(dtype=torch.float32, E=500)
    got = gatv2.gatv2_score(x_l, x_r, att, src, dst, e, 0.2)
    want = _pyg_formula(x_l.double(), x_r.double(), att.double(), src, dst, e.double(), 0.2)
    assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_one_tensor_for_both_halves_sums_both_gradients():
    """share_weights: x_l is x_r; its gradient is the sum of the source and the target parts."""
    x, _, att, src, dst, _ = _inputs(S=9, L=9, edge=False)
    a = x.clone().requires_grad_()
    gatv2.gatv2_score(a, a, att, src, dst, None, 0.2).sum().backward()
    b = x.clone().requires_grad_()
    _pyg_formula(b, b, att, src, dst, None, 0.2).sum().backward()
    assert_close(a.grad, b.grad, atol=1e-12, rtol=1e-12)


def test_second_derivatives_are_exact():
    inputs = [t.clone().requires_grad_() if t is not None and t.is_floating_point() else t for t in _inputs(E=25)]
    floats = [t for t in inputs if isinstance(t, torch.Tensor) and t.is_floating_point()]
    # LeakyReLU is piecewise linear: gradgradcheck holds away from its kink (random inputs are, almost surely)
    assert torch.autograd.gradgradcheck(
        lambda *f: gatv2.gatv2_score(f[0], f[1], f[2], inputs[3], inputs[4], f[3], 0.2), floats
    )


def test_reference_path_when_the_kernels_do_not_run(monkeypatch):
    """Several threads (or no numba): the readable formulation and its written-out gradients; same numbers."""
    inputs = _inputs()
    leaves = [t.clone().requires_grad_() if t is not None and t.is_floating_point() else t for t in inputs]
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got = gatv2.gatv2_score(*leaves, negative_slope=0.2)
        got.backward(torch.ones_like(got))
    finally:
        torch.set_num_threads(before)
    ref = [t.clone().requires_grad_() if t is not None and t.is_floating_point() else t for t in inputs]
    want = _pyg_formula(*ref, 0.2)
    want.backward(torch.ones_like(want))
    assert_close(got, want, atol=1e-12, rtol=1e-12)
    for a, b in zip(leaves, ref):
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            assert_close(a.grad, b.grad, atol=1e-12, rtol=1e-12)


def test_compiles_fullgraph_as_one_operator():
    x_l, x_r, att, src, dst, e = _inputs()
    fn = torch.compile(lambda *a: gatv2.gatv2_score(*a, negative_slope=0.2), fullgraph=True, backend="aot_eager")
    assert_close(fn(x_l, x_r, att, src, dst, e), _pyg_formula(x_l, x_r, att, src, dst, e, 0.2), atol=1e-12, rtol=1e-12)
    torch.library.opcheck(gatv2.gatv2_score_op, (x_l, x_r, att, src, dst, e, 0.2))
