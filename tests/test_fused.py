"""The fused CPU kernel of the CSR path (graphattn.ops.fused) against the library path and a dense oracle."""

from __future__ import annotations

import pytest
import torch
from conftest import DTYPES, assert_close

import graphattn as ga
from graphattn.ops import fused, operators

pytest.importorskip("numba")


def _dense(q, k, v, edge_index, scale, bias=None):
    """Masked dense softmax, duplicates by multiplicity (log count in the score): out (L, H, Dv), alpha (E, H)."""
    (L, H, _), S = q.shape, k.size(0)
    src, dst = edge_index
    count = torch.zeros(L, S, dtype=q.dtype).index_put_(
        (dst, src), torch.ones_like(src, dtype=q.dtype), accumulate=True
    )  # (L, S)
    score = torch.einsum("ihd,jhd->hij", q, k) * scale + count.log()  # (H, L, S); no edge: -inf
    if bias is not None:  # one bias per (i, j) pair (the graphs with a bias have no duplicates)
        dense_bias = torch.zeros(H, L, S, dtype=q.dtype)
        dense_bias[:, dst, src] = bias.t().expand(H, -1)
        score = score + dense_bias
    dead = torch.isneginf(score).all(-1, keepdim=True)  # (H, L, 1) a row without edges (or weights)
    weight = torch.softmax(score.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)  # (H, L, S); dead rows: 0
    out = torch.einsum("hij,jhd->ihd", weight, v)  # (L, H, Dv)
    return out, (weight[:, dst, src] / count[dst, src]).t()  # (E, H)


def _graph(name, L, S, seed=0):
    g = torch.Generator().manual_seed(seed)
    if name == "duplicates":  # repeated pairs, unsorted, some targets without edges
        ei = torch.stack([torch.randint(0, S, (6 * L,), generator=g), torch.randint(0, L // 2, (6 * L,), generator=g)])
        return torch.cat([ei, ei[:, :L]], 1)
    cells = torch.randperm(L * S, generator=g)[: 4 * L]  # distinct pairs, unsorted
    return torch.stack([cells % S, cells // S])  # (2, E), some targets without edges


def _run(q, k, v, ei, bias, need_weights, enabled):
    fused.ENABLED = enabled
    try:
        for t in (q, k, v, bias):
            if t is not None:
                t.grad = None
        out, alpha = ga.attention(q, k, v, ei, edge_bias=bias, impl="csr", scale=0.7, need_weights=need_weights)
        loss = (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum()
        if need_weights:
            loss = loss + (alpha * torch.linspace(0, 2, alpha.numel(), dtype=alpha.dtype).view_as(alpha)).sum()
        loss.backward()
        grads = [None if t is None else t.grad.clone() for t in (q, k, v, bias)]
        return out.detach(), None if alpha is None else alpha.detach(), grads
    finally:
        fused.ENABLED = True


CASES = [("duplicates", 40, 40, None), ("random", 30, 50, None), ("random", 50, 20, "heads"), ("random", 40, 40, "one")]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("name, L, S, bias_kind", CASES)
def test_fused_equals_library_path_and_dense_oracle(name, L, S, bias_kind, need_weights, dtype, monkeypatch):
    calls = []
    monkeypatch.setattr(operators, "fused_forward", lambda *a: calls.append(1) or fused.fused_forward(*a))
    torch.manual_seed(1)
    H, D, Dv = 3, 5, 4
    ei = _graph(name, L, S)
    q, k, v = (torch.randn(n, H, d, dtype=dtype, requires_grad=True) for n, d in ((L, D), (S, D), (S, Dv)))
    bias = None
    if bias_kind:
        bias = torch.randn(ei.size(1), H if bias_kind == "heads" else 1, dtype=dtype)
        bias[::7] = float("-inf")  # edges without weight
        bias[ei[1] == ei[1, 0]] = float("-inf")  # one target with every score -inf: a zero row
        bias.requires_grad_()
    got = _run(q, k, v, ei, bias, need_weights, True)
    assert calls, "the fused kernel did not run"
    lib = _run(q, k, v, ei, bias, need_weights, False)
    assert len(calls) == 1
    tol = {} if dtype == torch.float64 else dict(atol=2e-6, rtol=2e-6)  # float32: the noise floor
    for a, b in zip([got[0], got[1], *got[2]], [lib[0], lib[1], *lib[2]]):
        if b is not None:
            assert_close(a, b, **tol)
    ref_out, ref_alpha = _dense(
        q.detach().double(),
        k.detach().double(),
        v.detach().double(),
        ei,
        0.7,
        None if bias is None else bias.detach().double(),
    )
    assert_close(got[0].double(), ref_out, dtype)
    assert (got[0][ei[1].max() + 1 :] == 0).all()  # targets without edges: zero rows
    if need_weights:
        assert_close(got[1].double(), ref_alpha, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_gradients_equal_dense_oracle(dtype):
    torch.manual_seed(2)
    L, S, H, D = 30, 25, 2, 6
    ei = _graph("duplicates", L, S)
    q, k, v = (torch.randn(n, H, D, dtype=dtype, requires_grad=True) for n in (L, S, S))
    got = _run(q, k, v, ei, None, True, True)[2]
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out, alpha = _dense(*leaves, ei, 0.7)
    loss = (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum()
    loss = loss + (alpha * torch.linspace(0, 2, alpha.numel(), dtype=alpha.dtype).view_as(alpha)).sum()
    loss.backward()
    for a, leaf in zip(got, leaves):
        assert_close(a.double(), leaf.grad, dtype)


def test_fused_result_does_not_depend_on_thread_count():
    torch.manual_seed(3)
    L, H, D = 200, 4, 8
    ei = _graph("duplicates", L, L)
    q, k, v = (torch.randn(L, H, D, requires_grad=True) for _ in range(3))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _run(q, k, v, ei, None, False, True)
        torch.set_num_threads(2)
        two = _run(q, k, v, ei, None, False, True)
    finally:
        torch.set_num_threads(before)
    for a, b in zip([one[0], *one[2][:3]], [two[0], *two[2][:3]]):
        assert torch.equal(a, b)


def test_fused_only_where_it_applies(monkeypatch):
    calls = []
    monkeypatch.setattr(operators, "fused_forward", lambda *a: calls.append(1) or fused.fused_forward(*a))
    q = torch.randn(20, 2, 4)
    ei = _graph("random", 20, 20)
    ga.attention(q, q, q, ei, impl="csr", dropout=0.5, training=True)  # dropout: fused, torch's mask
    ga.attention(q.half(), q.half(), q.half(), ei, impl="csr")  # half types run in float32: fused
    assert len(calls) == 2
    assert not fused.usable(q.to(torch.complex64), q, q, None)


def test_without_numba_the_library_path_runs(monkeypatch):
    calls = []
    monkeypatch.setattr(operators, "fused_forward", lambda *a: calls.append(1) or fused.fused_forward(*a))
    monkeypatch.setattr(fused, "_NUMBA", False)  # as if `import numba` had failed
    torch.manual_seed(4)
    q, k, v = (torch.randn(20, 2, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    ei = _graph("duplicates", 20, 20)
    out, _ = ga.attention(q, k, v, ei, impl="csr", scale=0.7)
    out.sum().backward()
    assert not calls
    assert_close(out.detach(), _dense(q.detach(), k.detach(), v.detach(), ei, 0.7)[0])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("need_weights", [False, True])
def test_fused_dropout_draws_the_library_paths_mask(threads, need_weights):
    """Dropout on the fused kernel: under one seed the same mask, outputs, weights and gradients as the
    library path, and both equal the dense oracle with that mask applied to the weights."""
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(30, 3, 5, dtype=torch.float64, generator=g).requires_grad_() for _ in range(3))
    ei = _graph("duplicates", 30, 30)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        results = []
        for enabled in (True, False):
            fused.ENABLED = enabled
            for t in (q, k, v):
                t.grad = None
            torch.manual_seed(11)
            out, alpha = ga.attention(q, k, v, ei, impl="csr", scale=0.7, dropout=0.4, need_weights=need_weights)
            loss = (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum()
            if need_weights:
                loss = loss + (alpha * torch.linspace(0, 2, alpha.numel(), dtype=alpha.dtype).view_as(alpha)).sum()
            loss.backward()
            results.append(
                (out.detach(), None if alpha is None else alpha.detach(), [t.grad.clone() for t in (q, k, v)])
            )
    finally:
        fused.ENABLED = True
        torch.set_num_threads(before)
    (out_f, alpha_f, grads_f), (out_l, alpha_l, grads_l) = results
    assert_close(out_f, out_l, atol=1e-12, rtol=1e-12)
    for a, b in zip(grads_f, grads_l):
        assert_close(a, b, atol=1e-12, rtol=1e-12)
    if need_weights:
        assert torch.equal(alpha_f == 0, alpha_l == 0)  # the same edges dropped
        assert_close(alpha_f, alpha_l, atol=1e-12, rtol=1e-12)
        # the oracle: the weights after dropout (the layer's return) times the values
        dense_alpha = _dense(q.detach(), k.detach(), v.detach(), ei, 0.7)[1]  # (E, H) before dropout
        kept = alpha_f != 0
        assert_close(alpha_f[kept], (dense_alpha / 0.6)[kept])
        src, dst = ei
        expected = torch.zeros_like(out_f).index_add_(0, dst, alpha_f.unsqueeze(-1) * v.detach()[src])
        assert_close(out_f, expected)


def test_a_row_whose_softmax_sum_is_nan_is_nan_on_both_paths():
    """An infinite key gives exp(inf - inf) = NaN in its row's sum: every weight of the row is NaN, as on
    the library path (the fused kernel gave its other edges the weight 0)."""
    q = torch.tensor([[[1.0]], [[-1.0]]], dtype=torch.float64)  # (2, 1, 1)
    k = torch.tensor([[[float("inf")]], [[0.5]]], dtype=torch.float64)
    v = torch.tensor([[[2.0]], [[3.0]]], dtype=torch.float64)
    ei = torch.tensor([[0, 1, 0, 1], [0, 0, 1, 1]])
    got = []
    for enabled in (True, False):
        fused.ENABLED = enabled
        try:
            got.append(ga.attention(q, k, v, ei, impl="csr", scale=1.0, need_weights=True)[1])
        finally:
            fused.ENABLED = True
    assert torch.equal(got[0].isnan(), got[1].isnan()) and got[0][:2].isnan().all()
    assert torch.equal(got[0][2:], got[1][2:])


def _applied(fn, a):
    a = a.copy()
    fn(a)
    return a


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kernel_exp_within_one_ulp_of_float64_and_exact_at_the_ends(dtype):
    """graphattn.ops.vexp.exp in a numba loop against float64 exp: 1 ulp on [-87.3, 0]; -inf -> 0, NaN -> NaN."""
    import numba
    import numpy as np

    from graphattn.ops.vexp import exp

    @numba.njit(fastmath={"reassoc", "contract"})
    def apply(a):  # the fused forward's loop shape: rows of heads
        for e in range(a.shape[0]):
            for h in range(a.shape[1]):
                a[e, h] = exp(a[e, h])

    g = torch.Generator().manual_seed(0)
    x = torch.cat([-87.3 * torch.rand(4096, generator=g, dtype=torch.float64), torch.tensor([0.0, -1e-30, -87.3])])
    got = torch.from_numpy(_applied(apply, x.to(dtype).reshape(-1, 1).numpy()).reshape(-1))
    exact = x.to(dtype).double().exp()
    ulp = torch.finfo(dtype).eps * exact  # one unit in the last place, relative to the value (within 2x)
    assert ((got.double() - exact).abs() <= ulp).all()
    ends = np.array(
        [[-np.inf, np.nan, -87.34, -100.0, -1e30]], dtype=np.float32 if dtype == torch.float32 else np.float64
    )
    got = _applied(apply, ends)[0]
    assert got[0] == 0.0 and np.isnan(got[1]) and (got[2:] >= 0.0).all() and (got[2:] < 1.2e-38).all()
