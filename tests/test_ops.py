"""ops.attention: every kernel ("sdpa", "block", "csr") against the dense oracle and a per-edge loop;
float16/bfloat16 against SDPA in the same dtype and float64; the structure cache under threads.

References: ``dense.six_steps`` (the oracle; identity projections so that its
queries/keys/values are ours) for graphs without duplicate edges, and
``_loop_reference`` (one Python loop per query over its edges, so duplicates
count twice) for duplicates, unsorted input and ``edge_bias``.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import DTYPES, TOL, assert_close

import graphattn as ga
from graphattn import AttentionConv, graphs, ops, patterns
from graphattn.dense import six_steps

KERNELS = ["auto", "csr", "block"]


# ------------------------------------------------------------------------------------- references
def _oracle(q, k, v, edge_index, scale=None, bias=None):
    """Dense oracle: out (L, H, D_v) and alpha (E, H) for duplicate-free edges."""
    (L, H, D), S, Dv = q.shape, k.size(0), v.size(2)
    eye = torch.eye(H * D, dtype=q.dtype)
    w_k = torch.cat([eye, q.new_zeros(H * Dv, H * D)])  # picks k out of cat(k, v)
    w_v = torch.cat([q.new_zeros(H * D, H * Dv), torch.eye(H * Dv, dtype=q.dtype)])
    mask = graphs.edge_index_to_mask(edge_index, (S, L))  # (L, S)
    dense_bias = None
    if bias is not None:
        dense_bias = q.new_zeros(H, L, S)
        dense_bias[:, edge_index[1], edge_index[0]] = bias.reshape(edge_index.size(1), -1).T.expand(H, -1)
    steps = six_steps(
        q.reshape(L, H * D),
        eye,
        w_k,
        w_v,
        mask,
        heads=H,
        x_kv=torch.cat([k.reshape(S, -1), v.reshape(S, -1)], dim=1),
        scale=scale,
        bias=dense_bias,
    )
    alpha = steps.weights[:, edge_index[1], edge_index[0]].T  # (E, H)
    return steps.output.view(L, H, Dv), alpha


def _loop_reference(q, k, v, edge_index, scale=None, bias=None):
    """One query at a time over its edges (duplicates are separate edges): out (L, H, D_v), alpha (E, H)."""
    (L, H, D), Dv = q.shape, v.size(2)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    src, dst = edge_index
    bias = None if bias is None else bias.reshape(src.numel(), -1)
    out, alpha = [], [None] * src.numel()
    for i in range(L):
        edges = (dst == i).nonzero().flatten().tolist()
        if not edges:
            out.append(q.new_zeros(H, Dv))
            continue
        s = torch.stack([(q[i] * k[src[e]]).sum(-1) * scale for e in edges])  # (n_i, H)
        if bias is not None:
            s = s + torch.stack([bias[e] for e in edges])
        top = s.max(0).values
        top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
        w = torch.exp(s - top)
        w = w / w.sum(0).clamp_min(torch.finfo(q.dtype).tiny)  # all -inf -> 0 / tiny = 0
        for n, e in enumerate(edges):
            alpha[e] = w[n]
        out.append(sum(w[n].unsqueeze(-1) * v[src[e]] for n, e in enumerate(edges)))
    return torch.stack(out), (torch.stack(alpha) if alpha else q.new_zeros(0, H))


def _qkv(L, S, H=2, D=4, Dv=3, dtype=torch.float64):
    return [torch.randn(n, H, d, dtype=dtype, requires_grad=True) for n, d in ((L, D), (S, D), (S, Dv))]


def _grads(out, alpha, inputs, seed=1):
    g = torch.Generator().manual_seed(seed)
    loss = (out * torch.randn(out.shape, generator=g, dtype=out.dtype).to(out.device)).sum()
    loss = loss + (alpha * torch.randn(alpha.shape, generator=g, dtype=alpha.dtype).to(alpha.device)).sum()
    return torch.autograd.grad(loss, inputs, allow_unused=True)


def _random_edges(L, S, E, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randint(0, S, (E,), generator=g), torch.randint(0, L, (E,), generator=g)])


GRAPHS = {  # name -> (L, S, edge_index builder); all duplicate-free
    "window_2_1_L13": (13, 13, lambda: patterns.window(2, 1).edge_index(13)),
    "window_5_5_L150": (150, 150, lambda: patterns.window(5, 5).edge_index(150)),
    "causal_L9": (9, 9, lambda: patterns.causal().edge_index(9)),
    "complete_L6_S5": (6, 5, lambda: patterns.full().edge_index(6, 5)),
    "random_empty_rows_L7_S11": (7, 11, lambda: torch.unique(_random_edges(7, 11, 20), dim=1)),
    "bigbird_L97_S70": (97, 70, lambda: patterns.bigbird(8, random_blocks=1).edge_index(97, 70)),
    "single_node": (1, 1, lambda: torch.tensor([[0], [0]])),
    "window_and_key_0_L300": (300, 300, lambda: _window_and_key_0(300)),  # block kernel: gathered tiles
    "shifted_band_L100_S300": (100, 300, lambda: _shifted_band(100, 300, 150)),  # band starts right of i
}


def _window_and_key_0(L):
    """window(3, 3) plus every query reading key 0: tiles far from the diagonal."""
    extra = torch.stack([torch.zeros(L, dtype=torch.long), torch.arange(L)])
    edges = torch.cat([patterns.window(3, 3).edge_index(L), extra], dim=1)
    return torch.unique(edges, dim=1)  # duplicates dropped; unsorted (by source)


def _shifted_band(L, S, shift):
    """Query i reads keys shift + i - 3 ... shift + i + 3 (cross-attention, band right of the diagonal)."""
    i = torch.arange(L).repeat_interleave(7)
    return torch.stack([i + shift + torch.arange(-3, 4).repeat(L), i])


# ----------------------------------------------------------------------------------- equivalence
def _assert_same(out, alpha, ref_out, ref_alpha, inputs):
    """Outputs, weights and the gradients of every input equal the reference's."""
    assert_close(out, ref_out)
    assert_close(alpha, ref_alpha)
    for got, want in zip(_grads(out, alpha, inputs), _grads(ref_out, ref_alpha, inputs)):
        assert_close(got, want)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(GRAPHS))
def test_every_kernel_equals_oracle(name, dtype, kernel):
    L, S, build = GRAPHS[name]
    edge_index = build()
    inputs = _qkv(L, S, dtype=dtype)
    out, alpha = ops.attention(*inputs, edge_index, impl=kernel, need_weights=True)
    ref_out, ref_alpha = _oracle(*inputs, edge_index)
    _assert_same(out, alpha, ref_out, ref_alpha, inputs)


@pytest.mark.parametrize(
    "name,band", [("window_5_5_L150", True), ("window_and_key_0_L300", False), ("shifted_band_L100_S300", True)]
)
def test_block_layouts(name, band):
    """The band layout (strided key views) and the gathered layout are both exercised above."""
    L, S, build = GRAPHS[name]
    tiles = ops._Graph(build(), L, S).tiles(min_fill=0.0)
    assert tiles.band == band


@pytest.mark.parametrize("kernel", ["csr", "block"])
def test_block_chunks_and_padding(kernel, monkeypatch):
    """Several chunks of query blocks, padded rows and a dummy key block (L, S not multiples of 64)."""
    monkeypatch.setattr(ops.structure, "TILE_FLOATS", 1)
    L, S = 200, 190
    edge_index = patterns.window(40, 3).edge_index(L, S)
    inputs = _qkv(L, S)
    bias = torch.randn(edge_index.size(1), 2, dtype=torch.float64, requires_grad=True)
    graph = ops._Graph(edge_index, L, S)
    assert len(graph.tiles(min_fill=0.0).chunks) > 1
    out, alpha = ops.attention(*inputs, edge_index, edge_bias=bias, impl=kernel, need_weights=True)
    ref_out, ref_alpha = _oracle(*inputs, edge_index, bias=bias)
    assert_close(out, ref_out)
    assert_close(alpha, ref_alpha)
    for got, want in zip(_grads(out, alpha, inputs + [bias]), _grads(ref_out, ref_alpha, inputs + [bias])):
        assert_close(got, want)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("bias_heads", [1, 2], ids=["bias_E", "bias_EH"])
def test_edge_bias_with_minus_inf_and_unsorted_input(bias_heads, kernel):
    """-inf removes an edge; a query whose edges are all -inf gets a zero row; order does not matter."""
    L = 70
    edge_index = patterns.window(3, 3).edge_index(L)
    E = edge_index.size(1)
    perm = torch.randperm(E)
    edge_index = edge_index[:, perm]
    bias = torch.randn(E, bias_heads, dtype=torch.float64)
    bias[edge_index[1] == 5] = float("-inf")  # query 5: no edge left
    bias[torch.arange(E) % 7 == 0] = float("-inf")
    bias = bias.squeeze(-1).requires_grad_() if bias_heads == 1 else bias.requires_grad_()
    inputs = _qkv(L, L)
    out, alpha = ops.attention(*inputs, edge_index, edge_bias=bias, impl=kernel, need_weights=True)
    ref_out, ref_alpha = _loop_reference(*inputs, edge_index, bias=bias)
    assert torch.equal(out[5], torch.zeros_like(out[5]))
    assert_close(out, ref_out)
    assert_close(alpha, ref_alpha)
    for got, want in zip(_grads(out, alpha, inputs + [bias]), _grads(ref_out, ref_alpha, inputs + [bias])):
        assert_close(got, want)


@pytest.mark.parametrize("kernel", ["auto", "csr"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_duplicate_edges_are_separate_edges(dtype, kernel):
    """(j, i) listed twice gets two weights and twice the share; unsorted, L != S, empty rows."""
    L, S = 9, 6
    edge_index = torch.cat([_random_edges(L, S, 30), torch.tensor([[2, 2, 2], [4, 4, 4]])], dim=1)
    edge_index = edge_index[:, torch.randperm(edge_index.size(1))]
    inputs = _qkv(L, S, dtype=dtype)
    out, alpha = ops.attention(*inputs, edge_index, impl=kernel, need_weights=True)
    ref_out, ref_alpha = _loop_reference(*inputs, edge_index)
    _assert_same(out, alpha, ref_out, ref_alpha, inputs)


@pytest.mark.parametrize("block_cache", [True, False], ids=["blocks_kept", "blocks_per_call"])
@pytest.mark.parametrize("degree", [3, 20], ids=["short_rows", "fused_rows"])
def test_csr_uniform_degree_with_duplicates_and_dead_rows(degree, block_cache, monkeypatch):
    """Every query reads ``degree`` random keys (duplicates likely, as in sampled graphs); one query's
    edges are all -inf (the reference: the graph without them); two head counts on one graph (the
    block-diagonal indices are kept per H)."""
    if not block_cache:
        monkeypatch.setattr(ops.structure, "HEAD_BLOCK_ENTRIES", 0)
    L, S = 12, 5
    g = torch.Generator().manual_seed(3)
    edge_index = torch.stack(
        [torch.randint(0, S, (L * degree,), generator=g), torch.arange(L).repeat_interleave(degree)]
    )
    graph = ops.prepare(edge_index, L, S)
    assert graph.uniform_degree == degree and graph.has_duplicates
    for H in (2, 3, 2):
        inputs = _qkv(L, S, H=H)
        bias = torch.randn(edge_index.size(1), H, dtype=torch.float64)
        dead = edge_index[1] == 4
        bias[dead] = float("-inf")
        bias.requires_grad_()
        out, alpha = ops.attention(*inputs, edge_index, edge_bias=bias, impl="csr", need_weights=True)
        ref_out, kept_alpha = _loop_reference(*inputs, edge_index[:, ~dead], bias=bias[~dead])
        ref_alpha = torch.zeros_like(alpha).index_put((torch.nonzero(~dead).flatten(),), kept_alpha)  # (E, H)
        assert torch.equal(out[4], torch.zeros_like(out[4]))
        assert_close(out, ref_out)
        assert_close(alpha, ref_alpha)
        for got, want in zip(_grads(out, alpha, inputs + [bias]), _grads(ref_out, ref_alpha, inputs + [bias])):
            assert_close(got, want)


def test_duplicates_refused_by_forced_block_kernel():
    edge_index = torch.tensor([[0, 0, 1], [0, 0, 1]])
    with pytest.raises(NotImplementedError, match="duplicates"):
        ops.attention(*_qkv(2, 2), edge_index, impl="block")


def test_structure_cache_follows_in_place_edits():
    q, k, v = _qkv(6, 6)
    edge_index = patterns.window(1, 1).edge_index(6)
    first, _ = ops.attention(q, k, v, edge_index)
    assert ops.prepare(edge_index, 6) is ops.prepare(edge_index, 6)
    edge_index[0, 0] = 5  # in place: the cached structure must not be reused
    out, alpha = ops.attention(q, k, v, edge_index, need_weights=True)
    ref_out, ref_alpha = _loop_reference(q, k, v, edge_index)
    assert_close(out, ref_out)
    assert_close(alpha, ref_alpha)
    assert not torch.allclose(out, first)


def test_no_edges_and_no_nodes():
    q, k, v = _qkv(4, 3)
    out, alpha = ops.attention(q, k, v, torch.empty(2, 0, dtype=torch.long), need_weights=True)
    assert torch.equal(out, torch.zeros(4, 2, 3, dtype=torch.float64)) and alpha.shape == (0, 2)
    out.sum().backward()
    assert torch.equal(q.grad, torch.zeros_like(q))
    out, alpha = ops.attention(*_qkv(0, 3), patterns.full(), need_weights=True)
    assert out.shape == (0, 2, 3) and alpha.shape == (0, 2)


# ------------------------------------------------------------------------------ dense SDPA path
@pytest.mark.parametrize("need_weights", [True, False], ids=["weights", "no_weights"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "kind,L,S", [("full", 7, 7), ("full", 5, 8), ("causal", 7, 7), ("causal", 9, 4), ("causal", 3, 6)]
)
def test_sdpa_path_for_patterns_and_detected_edge_lists(kind, L, S, dtype, need_weights):
    pattern = patterns.full() if kind == "full" else patterns.causal()
    edge_index = pattern.edge_index(L, S)
    shuffled = edge_index[:, torch.randperm(edge_index.size(1))]
    graph = ops._Graph(shuffled, L, S)
    inputs = _qkv(L, S, dtype=dtype)
    assert graph.edge_set() == kind and ops.choose_impl(graph, *inputs) == "sdpa"
    ref_out, ref_alpha = _oracle(*inputs, edge_index)
    ref_grads = _grads(ref_out, ref_alpha if need_weights else ref_alpha * 0, inputs)
    for edges, ref_a in ((pattern, ref_alpha), (edge_index, ref_alpha), (shuffled, _oracle(*inputs, shuffled)[1])):
        out, alpha = ops.attention(*inputs, edges, need_weights=need_weights)
        assert_close(out, ref_out)
        if need_weights:
            assert_close(alpha, ref_a)
        else:
            assert alpha is None
        if edges is not shuffled:
            grads = _grads(out, alpha if need_weights else ref_alpha.detach() * 0, inputs)
            for got, want in zip(grads, ref_grads):
                assert_close(got, want)


def test_forced_sdpa_refuses_other_graphs():
    with pytest.raises(NotImplementedError, match="impl='sdpa'"):
        ops.attention(*_qkv(5, 5), patterns.window(1, 1).edge_index(5), impl="sdpa")


def test_choose_impl_rules():
    def chosen(edge_index, L, S, **kw):
        return ops.choose_impl(ops._Graph(edge_index, L, S), *_qkv(L, S), **kw)

    assert chosen(patterns.window(32, 32).edge_index(256), 256, 256) == "block"
    assert chosen(patterns.window(2, 2).edge_index(256), 256, 256) == "csr"
    assert chosen(patterns.random(4).edge_index(512), 512, 512) == "csr"
    assert chosen(patterns.full().edge_index(30), 30, 30) == "sdpa"
    assert chosen(patterns.causal().edge_index(30), 30, 30) == "sdpa"
    assert chosen(patterns.causal().edge_index(256), 256, 256, edge_bias=torch.zeros(32896, 1)) == "block"
    removed = torch.zeros(32896, 1).index_fill_(0, torch.arange(0, 32896, 5), float("-inf"))
    assert chosen(patterns.causal().edge_index(256), 256, 256, edge_bias=removed) == "block"  # no silent csr
    for forced in ("csr", "block"):
        assert chosen(patterns.window(32, 32).edge_index(256), 256, 256, impl=forced) == forced


def test_weights_only_when_asked():
    """need_weights defaults to False: no weights formed, and the complete graph reaches SDPA's fused kernel."""
    q, k, v = _qkv(9, 9)
    for edges in (patterns.full(), patterns.window(2, 2).edge_index(9)):
        out, alpha = ops.attention(q, k, v, edges)
        assert alpha is None
        assert_close(out, ops.attention(q, k, v, edges, need_weights=True)[0])
    with pytest.raises(TypeError, match="'need_weights'"):
        ops.attention(q, k, v, patterns.full(), need_weights=1)


# ------------------------------------------------------------------ non-finite features elsewhere
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("where", ["key", "value"])
@pytest.mark.parametrize("case", ["causal_pattern", "causal_edges", "window_block", "window_csr", "query_block"])
def test_non_finite_features_of_non_neighbours_do_not_leak(case, where, bad):
    """Query i's output and gradients ignore NaN/inf in the features of nodes it does not read."""
    L, poisoned = 80, 70
    pattern = patterns.causal() if case.startswith("causal") else patterns.window(4, 4)
    edge_index = pattern.edge_index(L)
    edges = pattern if case == "causal_pattern" else edge_index
    kernel = {"window_csr": "csr", "window_block": "block", "query_block": "block"}.get(case, "auto")
    q, k, v = _qkv(L, L)
    readers = torch.tensor([poisoned]) if case == "query_block" else edge_index[1][edge_index[0] == poisoned].unique()
    safe = torch.ones(L, dtype=torch.bool)
    safe[readers] = False
    clean_out, _ = ops.attention(q, k, v, edges, impl=kernel)
    clean_grad = torch.autograd.grad(clean_out[safe].sum(), q)[0]
    with torch.no_grad():
        (q if case == "query_block" else k if where == "key" else v)[poisoned] = bad
    out, _ = ops.attention(q, k, v, edges, impl=kernel)
    assert torch.equal(out[safe], clean_out[safe])  # bitwise: the same kernel ran on the same numbers
    ref_out, _ = _loop_reference(q.detach(), k.detach(), v.detach(), edge_index)
    torch.testing.assert_close(out, ref_out, atol=1e-10, rtol=0, equal_nan=True)  # readers: IEEE as the loop
    grad = torch.autograd.grad(out[safe].sum(), q)[0]  # readers get NaN (0 * NaN), as in dense autograd
    assert_close(grad[safe], clean_grad[safe])


@pytest.mark.parametrize("kernel", ["block", "csr"])
def test_non_finite_gradient_rows_do_not_leak(kernel):
    """A NaN in dL/d out_i reaches only the keys and values that i reads."""
    L, bad_row = 130, 100
    edge_index = patterns.window(3, 3).edge_index(L)
    q, k, v = _qkv(L, L)
    out, _ = ops.attention(q, k, v, edge_index, impl=kernel)
    grad = torch.randn_like(out)
    grad[bad_row] = float("nan")
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
    read = torch.zeros(L, dtype=torch.bool)
    read[edge_index[0][edge_index[1] == bad_row]] = True
    assert torch.isfinite(dv[~read]).all() and torch.isfinite(dk[~read]).all()
    grad[bad_row] = 0.0
    ref = torch.autograd.grad(ops.attention(q, k, v, edge_index, impl="csr")[0], (q, k, v), grad)
    assert_close(dv[~read], ref[2][~read])


# ------------------------------------------------------------------------------------- dropout
@pytest.mark.parametrize("kernel", KERNELS)
def test_dropout_is_consistent_with_returned_weights(kernel):
    """out = sum_j alpha_dropped v_j, alpha_dropped in {0, alpha / (1 - p)}; gradients through the same mask."""
    L, p = 70, 0.4
    edge_index = patterns.window(4, 2).edge_index(L)
    inputs = _qkv(L, L)
    out, alpha_d = ops.attention(*inputs, edge_index, dropout=p, impl=kernel, need_weights=True)
    _, alpha = _oracle(*inputs, edge_index)
    keep = alpha_d != 0
    assert 0.3 < keep.double().mean() < 0.9
    assert_close(alpha_d, torch.where(keep, alpha / (1 - p), torch.zeros_like(alpha)))
    ref_alpha = alpha * keep / (1 - p)
    src, dst = edge_index
    ref_out = torch.zeros_like(out).index_add(0, dst, ref_alpha.unsqueeze(-1) * inputs[2][src])
    assert_close(out, ref_out)
    for got, want in zip(_grads(out, alpha_d, inputs), _grads(ref_out, ref_alpha, inputs)):
        assert_close(got, want)
    eval_out, _ = ops.attention(*inputs, edge_index, dropout=p, training=False, impl=kernel)
    assert_close(eval_out, _oracle(*inputs, edge_index)[0])


def test_dropout_on_the_sdpa_path():
    L, p = 16, 0.5
    inputs = _qkv(L, L)
    out, alpha_d = ops.attention(*inputs, patterns.causal(), dropout=p, need_weights=True)
    ref_out, alpha = _oracle(*inputs, patterns.causal().edge_index(L))
    keep = alpha_d != 0
    assert_close(alpha_d, torch.where(keep, alpha / (1 - p), torch.zeros_like(alpha)))
    src, dst = patterns.causal().edge_index(L)
    assert_close(out, torch.zeros_like(out).index_add(0, dst, alpha_d.unsqueeze(-1) * inputs[2][src]))
    fused, _ = ops.attention(*inputs, patterns.full(), dropout=p, need_weights=False)
    assert torch.isfinite(fused).all() and not torch.allclose(fused, _oracle(*inputs, patterns.full().edge_index(L))[0])
    fused, _ = ops.attention(*inputs, patterns.full(), dropout=p, need_weights=False, training=False)
    assert_close(fused, _oracle(*inputs, patterns.full().edge_index(L))[0])


# ------------------------------------------------------------------------------------- gradcheck
@pytest.mark.parametrize("kernel", ["csr", "block"])
def test_gradcheck_autograd_functions(kernel):
    L, S = 6, 5
    edge_index = torch.tensor([[0, 1, 4, 2, 3, 0, 4, 1], [0, 0, 1, 2, 2, 3, 3, 5]])  # query 4: no edge
    q, k, v = _qkv(L, S, H=2, D=3, Dv=2)
    bias = torch.randn(edge_index.size(1), 2, dtype=torch.float64, requires_grad=True)

    def f(q, k, v, bias):
        return ops.attention(q, k, v, edge_index, edge_bias=bias, impl=kernel, need_weights=True)

    assert torch.autograd.gradcheck(f, (q, k, v, bias))


# ------------------------------------------------------------------------- layer and public API
@pytest.mark.parametrize("pattern", [patterns.window(6, 6), patterns.random(5)], ids=["block", "csr"])
def test_message_passing_path_equals_fast_path(pattern):
    L, heads = 100, 4
    fast = AttentionConv(16, 16, heads=heads).double()
    slow = AttentionConv(16, 16, heads=heads, impl="message_passing").double()
    slow.load_state_dict(fast.state_dict())
    edge_index = pattern.edge_index(L)
    x = torch.randn(L, 16, dtype=torch.float64)
    ys = [conv(x, edge_index, return_attention_weights=True) for conv in (fast, slow)]
    assert_close(ys[0][0], ys[1][0])
    assert_close(ys[0][1][1], ys[1][1][1])
    grads = [
        torch.autograd.grad(y.sum() + (a**2).sum(), conv.parameters()) for (y, (_, a)), conv in zip(ys, (fast, slow))
    ]
    for got, want in zip(*grads):
        assert_close(got, want)


def test_segment_softmax_equals_dense_softmax():
    L, S = 6, 5
    edge_index = torch.unique(_random_edges(L, S, 20), dim=1)
    score = torch.randn(edge_index.size(1), 3, dtype=torch.float64)
    dense = torch.full((3, L, S), float("-inf"), dtype=torch.float64)
    dense[:, edge_index[1], edge_index[0]] = score.T
    ref = torch.softmax(dense, -1).nan_to_num(0.0)[:, edge_index[1], edge_index[0]].T
    assert_close(ops.segment_softmax(score, edge_index[1], L), ref)


def test_bad_input():
    q, k, v = _qkv(3, 3)
    edge_index = patterns.full().edge_index(3)
    with pytest.raises(ValueError, match="'impl'"):
        ops.attention(q, k, v, edge_index, impl="fast")
    with pytest.raises(TypeError, match="'edge_index'"):
        ops.attention(q, k, v, [[0], [0]])
    with pytest.raises(ValueError, match="'dropout'"):
        ops.attention(q, k, v, edge_index, dropout=1.0)
    with pytest.raises(ValueError, match="'edge_bias'"):
        ops.attention(q, k, v, edge_index, edge_bias=torch.zeros(4, dtype=torch.float64))
    with pytest.raises(IndexError, match="S = 3"):
        ops.attention(q, k, v, torch.tensor([[3], [0]]))


def test_tolerance_table_is_the_shared_one():
    assert TOL[torch.float64]["atol"] == 1e-10


# ------------------------------------------------------------------------ benchmark plumbing
@pytest.mark.parametrize("method", ["graphattn", "sdpa_mask", "pyg"])
def test_bench_worker_measures_one_case(method):
    """``graphattn bench`` measures in-process what its subprocesses measure (tiny case, no timing checks)."""
    from graphattn import bench

    case = dict(
        pattern="window",
        L=96,
        method=method,
        mode="fwdbwd",
        heads=2,
        dim=8,
        dtype="float64",
        device="cpu",
        repeats=1,
        threads=None,
    )
    result = bench.worker(case)
    assert result["time_s"] > 0 and result["runs"] == 1 and result["peak_bytes"] >= 0
    assert result["gflops"] == pytest.approx(3 * 4 * bench.num_edges("window", 96) * 2 * 8 / result["time_s"] / 1e9)


def test_bench_ratios_and_targets():
    from graphattn import bench

    def row(method, mode, t, m, pattern="random", L=4096):
        return dict(pattern=pattern, L=L, mode=mode, method=method, status="ok", time_s=t, peak_bytes=m)

    rows = [
        row("graphattn", "fwd", 1.0, 10),
        row("flex", "fwd", 12.0, 5),
        row("sdpa_mask", "fwd", 15.0, 50),
        row("graphattn", "fwdbwd", 2.0, 10),
        row("sdpa_mask", "fwdbwd", 16.0, 50),
    ]
    bench.add_ratios(rows)
    assert rows[1]["time_ratio"] == 12.0 and rows[2]["memory_ratio"] == 5.0
    lines = bench.targets(rows)
    assert "[met] random: >= 10x faster than flex: time flex/graphattn = 12.00 (random L=4096 fwd)" in lines
    assert any(line.startswith("[MISSED] random: >= 20x faster than SDPA+mask") for line in lines)
    assert any(line.startswith("[met] fwd+bwd ratio >= fwd ratio / 2: sdpa_mask/graphattn 8.00") for line in lines)
    assert bench.num_edges("window", 200) == 200 * 129 - 64 * 65
    assert bench.num_edges("window", 200) == patterns.window(64, 64).edge_index(200).size(1)


# -- found by adversarial testing -----------------------------------------------------------------


def _dense_reference(q, k, v, edge_index):
    """Per-edge loop: softmax over each query's edges (duplicates included), weighted sum."""
    L, H, _ = q.shape
    out = q.new_zeros(L, H, v.size(-1))
    for i in range(L):
        src = edge_index[0][edge_index[1] == i]
        if src.numel():
            w = torch.softmax(torch.einsum("hd,ehd->eh", q[i], k[src]) / q.size(-1) ** 0.5, dim=0)  # (e, H)
            out[i] = torch.einsum("eh,ehd->hd", w, v[src])
    return out


def test_more_duplicate_edges_than_grid_cells():
    q = k = v = torch.randn(2, 2, 3, dtype=torch.float64)
    edge_index = torch.tensor([[0, 0, 0, 1, 1, 1, 0], [0, 0, 0, 0, 1, 1, 1]])  # E = 7 > L * S = 4
    out, alpha = ga.attention(q, k, v, edge_index, need_weights=True)
    torch.testing.assert_close(out, _dense_reference(q, k, v, edge_index), atol=1e-10, rtol=0)
    assert torch.allclose(alpha[:3, 0], alpha[0, 0].expand(3))


def test_inference_mode_and_in_place_edits():
    q = k = v = torch.randn(5, 2, 4)
    with torch.inference_mode():
        edge_index = ga.patterns.window(1, 1).edge_index(5)
        out, _ = ga.attention(q, k, v, edge_index)
    torch.testing.assert_close(out, _dense_reference(q, k, v, edge_index), atol=1e-5, rtol=1e-5)
    edge_index = ga.patterns.window(1, 1).edge_index(5)
    ga.attention(q, k, v, edge_index)
    edge_index[1, 0] = 4  # an in-place edit bumps the version: the cache must notice
    torch.testing.assert_close(
        ga.attention(q, k, v, edge_index)[0], _dense_reference(q, k, v, edge_index), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_half_types_on_a_random_graph(dtype):
    q, k, v = (torch.randn(9, 2, 4) for _ in range(3))
    edge_index = ga.patterns.random(3, seed=1).edge_index(9)
    out, _ = ga.attention(q.to(dtype), k.to(dtype), v.to(dtype), edge_index)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), _dense_reference(q, k, v, edge_index), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(scale=float("nan")), ValueError, "'scale' to be a finite float"),
        (dict(dropout="0.1"), TypeError, "'dropout' to be a finite float"),
        (dict(edge_bias=torch.zeros(13, dtype=torch.float64)), TypeError, "'edge_bias' to be of the features' dtype"),
    ],
    ids=["scale_nan", "dropout_str", "bias_dtype"],
)
def test_bad_arguments(kwargs, exc, match):
    q = k = v = torch.randn(5, 2, 4)
    with pytest.raises(exc, match=match):
        ga.attention(q, k, v, ga.patterns.window(1, 1).edge_index(5), **kwargs)
    with pytest.raises(ValueError, match="at least one channel"):
        ga.attention(*(torch.randn(5, 2, 0),) * 3, ga.patterns.window(1, 1).edge_index(5))


@pytest.mark.parametrize("pattern", [patterns.full(), patterns.causal()], ids=["full", "causal"])
def test_pattern_path_backward_twice_and_gradcheck(pattern):
    """SDPA's path for a pattern keeps its graph for a second backward (retain_graph) and passes gradcheck."""
    q, k, v = (torch.randn(5, 2, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out, _ = ga.attention(q, k, v, pattern)
    out.sum().backward(retain_graph=True)
    first = q.grad.clone()
    out.sum().backward()
    assert_close(q.grad, 2 * first)
    assert torch.autograd.gradcheck(lambda q, k, v: ga.attention(q, k, v, pattern)[0], (q, k, v))


SECOND_ORDER = [
    pytest.param(kernel, graph, id=f"{kernel}-{graph}")
    for kernel, graph in [
        ("csr", "random"),
        ("block", "window"),
        ("auto", "full"),
        ("auto", "causal"),
        ("csr", "duplicates"),
    ]
]


def _second_order_graph(name: str, L: int) -> torch.Tensor:
    if name == "duplicates":
        edges = patterns.random(2, seed=1).edge_index(L)
        return torch.cat([edges, edges[:, :3]], dim=1)  # three edges listed twice
    pattern = {
        "random": patterns.random(2, seed=1),
        "window": patterns.window(1, 2),
        "full": patterns.full(),
        "causal": patterns.causal(),
    }[name]
    return pattern.edge_index(L)


@pytest.mark.parametrize("kernel,graph", SECOND_ORDER)
def test_second_derivatives_are_exact(kernel, graph):
    """gradgradcheck (finite differences of the backward, float64) on every kernel, with and without a bias."""
    L = 7
    edge_index = _second_order_graph(graph, L)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(L, 2, 3, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    bias = torch.randn(edge_index.size(1), 2, generator=g, dtype=torch.float64, requires_grad=True)

    def plain(q, k, v):
        return ga.attention(q, k, v, edge_index, impl=kernel)[0]

    def with_bias_and_weights(q, k, v, b):
        out, alpha = ga.attention(q, k, v, edge_index, edge_bias=b, need_weights=True, impl=kernel)
        return out, alpha

    assert torch.autograd.gradgradcheck(plain, (q, k, v))
    if graph not in ("full", "causal"):  # with a bias "auto" leaves SDPA; block and csr take one
        assert torch.autograd.gradgradcheck(with_bias_and_weights, (q, k, v, bias))


def test_gradient_penalty_equals_the_dense_oracle():
    """d/dq of ||dL/dq||^2 through the fast path equals the same through the dense oracle (float64, 1e-10)."""
    L = 9
    edge_index = patterns.random(3, seed=2).edge_index(L)
    g = torch.Generator().manual_seed(1)
    q0, k0, v0 = (torch.randn(L, 2, 4, generator=g, dtype=torch.float64) for _ in range(3))

    def penalty(fn):
        q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
        out = fn(q, k, v)
        (dq,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
        return torch.autograd.grad(dq.square().sum(), (q, k, v))

    fast = penalty(lambda q, k, v: ga.attention(q, k, v, edge_index, impl="csr")[0])
    oracle = penalty(lambda q, k, v: _oracle(q, k, v, edge_index)[0])
    for a, b in zip(fast, oracle):
        assert (a - b).abs().max() < 1e-10


# ------------------------------------------------------------------ half precision (issue 13)
HALF = [pytest.param(torch.float16, id="float16"), pytest.param(torch.bfloat16, id="bfloat16")]
HALF_KERNELS = [
    pytest.param(k, w, id=f"{k}-{'weights' if w else 'no_weights'}")
    for k in ("sdpa", "block", "csr", "message_passing")
    for w in (False, True)
]


def _assert_half_close(got, want, dtype, factor=8.0):
    """Equal to the dtype's rounding noise: ``factor`` ulps (eps) of the largest reference entry."""
    eps = torch.finfo(dtype).eps
    want = want.double()
    torch.testing.assert_close(
        got.double(),
        want,
        rtol=factor * eps,
        atol=factor * eps * max(1.0, float(want.detach().abs().max()) if want.numel() else 1.0),
    )


def _half_attention(kernel, need_weights, q, k, v, edge_index, bias=None):
    """``out (L, H, D)`` and ``alpha (E, H)`` or None from one kernel; ``message_passing`` is AttentionConv's path."""
    if kernel != "message_passing":
        return ops.attention(q, k, v, edge_index, edge_bias=bias, need_weights=need_weights, impl=kernel)
    (L, H, D), S = q.shape, k.size(0)
    conv = AttentionConv(
        (H * D, H * D, H * D), H * D, heads=H, bias=False, output_projection=False, impl="message_passing"
    ).to(q.dtype)
    with torch.no_grad():
        for lin in (conv.lin_query, conv.lin_key, conv.lin_value):
            lin.weight.copy_(torch.eye(H * D))  # identity projections: the layer's query/key/value are q, k, v
    x = (k.reshape(S, H * D), v.reshape(S, H * D), q.reshape(L, H * D))
    if not need_weights:
        return conv(x, edge_index, edge_bias=bias).view(L, H, D), None
    out, (_, alpha) = conv(x, edge_index, edge_bias=bias, return_attention_weights=True)
    return out.view(L, H, D), alpha


def _sdpa_reference(q, k, v, edge_index, bias=None, dtype=None):
    """``F.scaled_dot_product_attention`` in ``dtype`` (default q's) with the edges as a float mask: out, alpha."""
    dtype = dtype or q.dtype
    (L, H, _), S = q.shape, k.size(0)
    mask = torch.full((H, L, S), float("-inf"), dtype=dtype)  # (H, L, S)
    mask[:, edge_index[1], edge_index[0]] = (
        0.0 if bias is None else bias.to(dtype).reshape(edge_index.size(1), -1).T.expand(H, -1)
    )
    t = [x.to(dtype).transpose(0, 1) for x in (q, k, v)]  # (H, n, D)
    out = F.scaled_dot_product_attention(*t, attn_mask=mask).transpose(0, 1)  # (L, H, D)
    scores = (t[0].double() @ t[1].double().mT) / math.sqrt(q.size(-1)) + mask.double()  # (H, L, S)
    alpha = torch.softmax(scores, -1)[:, edge_index[1], edge_index[0]].T  # (E, H)
    return out, alpha


def _half_inputs(dtype, L, H=2, D=32, offset=128.0, spread=16.0):
    """Queries and keys near ``offset``: scaled scores about ``offset^2 sqrt(D)`` (> 65504 for 128, D = 32)."""
    g = torch.Generator().manual_seed(3)
    q, k = ((offset + spread * torch.randn(L, H, D, generator=g)).to(dtype) for _ in range(2))
    v = torch.randn(L, H, D, generator=g).to(dtype)
    return [t.requires_grad_() for t in (q, k, v)]


def _compare_half(kernel, need_weights, dtype, inputs, edge_index, bias=None):
    """Forward (and weights) against SDPA in ``dtype`` and in float64; backward against float64.

    An edge list runs the operator in float32 on every kernel ("sdpa" included),
    so its gradients are compared with float64 (a full/causal *pattern* is
    SDPA's own fused kernel in ``dtype``: ``test_half_pattern_is_sdpas_fused_kernel``).
    """
    out, alpha = _half_attention(kernel, need_weights, *inputs, edge_index, bias)
    assert out.dtype == dtype and torch.isfinite(out).all()
    ref, ref_alpha = _sdpa_reference(*inputs, edge_index, bias)
    wide = [t.detach().double().requires_grad_() for t in inputs]
    wide_bias = None if bias is None else bias.detach().double().requires_grad_()
    ref64, _ = _sdpa_reference(*wide, edge_index, wide_bias)
    _assert_half_close(out, ref, dtype)
    _assert_half_close(out, ref64, dtype)
    if need_weights:
        assert alpha.dtype == dtype
        _assert_half_close(alpha, ref_alpha, dtype)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(4)).to(dtype)
    got = torch.autograd.grad(out, inputs + ([] if bias is None else [bias]), grad)
    want = torch.autograd.grad(ref64, wide + ([] if bias is None else [wide_bias]), grad.double())
    for g_got, g_want in zip(got, want):
        assert torch.isfinite(g_got).all()
        _assert_half_close(g_got, g_want, dtype, factor=16.0)


@pytest.mark.parametrize("kernel,need_weights", HALF_KERNELS)
@pytest.mark.parametrize("dtype", HALF)
def test_half_types_pytorch_overflow_regression(dtype, kernel, need_weights):
    """PyTorch's own regression input: q = k = v = 256, scaled scores 586k, far above float16's 65504."""
    x = torch.full((23, 32, 80), 256.0, dtype=dtype, requires_grad=True)  # (L, H, D) of (1, 32, 23, 80)
    edge_index = patterns.full().edge_index(23)
    out, _ = _half_attention(kernel, need_weights, x, x, x, edge_index)
    assert torch.equal(out, torch.full_like(out, 256.0))  # what SDPA returns in the same dtype
    ref = F.scaled_dot_product_attention(*(x.detach().transpose(0, 1)[None],) * 3)[0].transpose(0, 1)
    assert torch.equal(out, ref)
    (grad,) = torch.autograd.grad(out.sum(), x)
    assert torch.isfinite(grad).all()


@pytest.mark.parametrize("kernel,need_weights", HALF_KERNELS)
@pytest.mark.parametrize("dtype", HALF)
def test_half_types_large_scores_and_extreme_biases(dtype, kernel, need_weights):
    """Every kernel equals SDPA in the same dtype (and float64) with scores > 65504 and biases at finfo.min.

    ``finfo.min`` is a large finite negative bias, as in SDPA: a row whose every
    edge carries it has the weights it has without the bias (the softmax of a
    row is shift-invariant); only ``-inf`` gives an edge the weight 0.
    """
    L = 150
    inputs = _half_inputs(dtype, L)
    if kernel == "sdpa":  # the complete graph and the causal DAG, without bias
        _compare_half(kernel, need_weights, dtype, inputs, patterns.causal().edge_index(L))
        return
    edge_index = patterns.window(20, 20).edge_index(L)
    E, lowest = edge_index.size(1), torch.finfo(dtype).min
    bias = 100 * torch.randn(E, 2, generator=torch.Generator().manual_seed(5))
    bias[edge_index[1] == 7] = lowest  # a whole row at the dtype's minimum, both heads
    bias[edge_index[1] == 9, 0] = lowest  # one head only
    bias[(edge_index[1] == 11) & (edge_index[0] < 11)] = lowest  # part of a row
    _compare_half(kernel, need_weights, dtype, inputs, edge_index, bias.to(dtype).requires_grad_())
    out, _ = _half_attention(kernel, False, *inputs, edge_index, bias.to(dtype))
    if dtype == torch.float16:  # -65504 leaves float32 scores intact: the row's weights are the unbiased ones
        expected = _half_attention(kernel, False, *inputs, edge_index)[0][7]  # (H, D)
    else:  # bfloat16's minimum (-3.4e38) swamps every float32 score, as in SDPA: uniform weights
        expected = inputs[2][edge_index[0][edge_index[1] == 7]].double().mean(0)  # (H, D)
    _assert_half_close(out[7], expected, dtype)


@pytest.mark.parametrize("dtype", HALF)
def test_half_pattern_is_sdpas_fused_kernel(dtype):
    """``patterns.causal()`` without weights is SDPA's fused kernel in ``dtype``, forward and backward."""
    inputs = _half_inputs(dtype, 150)
    out, _ = ops.attention(*inputs, patterns.causal())
    fused = F.scaled_dot_product_attention(*(t.transpose(0, 1)[None] for t in inputs), is_causal=True)
    assert torch.equal(out, fused[0].transpose(0, 1))
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(4)).to(dtype)
    for got, want in zip(
        torch.autograd.grad(out, inputs, grad), torch.autograd.grad(fused[0].transpose(0, 1), inputs, grad)
    ):
        assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", HALF)
def test_half_output_does_not_depend_on_need_weights_or_kernel(dtype):
    L = 130
    inputs = [t.detach() for t in _half_inputs(dtype, L)]
    edge_index = patterns.causal().edge_index(L)
    outs = [
        ops.attention(*inputs, edge_index, impl=kernel, need_weights=w)[0]
        for kernel in ("sdpa", "block", "csr")
        for w in (False, True)
    ]
    for out in outs[1:]:
        _assert_half_close(out, outs[0], dtype)
    assert torch.equal(outs[2], outs[3]) and torch.equal(outs[4], outs[5])  # weights or not: the same numbers


# ------------------------------------------------------------------- concurrency (issue 13)
def test_structure_cache_under_threads():
    """8 threads x 20 calls over more live edge_index tensors than the cache holds equal single-threaded results."""
    from concurrent.futures import ThreadPoolExecutor

    L = 96
    graphs_ = [patterns.window(w, 2).edge_index(L) for w in range(1, 7)] + [
        patterns.random(3, seed=s).edge_index(L) for s in range(6)
    ]  # 12 > cache size 8: evictions
    q, k, v = (torch.randn(L, 2, 8, dtype=torch.float64) for _ in range(3))
    bias = [torch.randn(e.size(1), 2, dtype=torch.float64) for e in graphs_]
    assert ops.cache_size() < len(graphs_)

    def call(n):
        i = n % len(graphs_)
        return ops.attention(q, k, v, graphs_[i], edge_bias=bias[i] if n % 3 else None, need_weights=True)

    ops.structure._CACHE._warned = False  # the once-per-process thrash warning, asked for here
    with ThreadPoolExecutor(max_workers=8) as pool, pytest.warns(RuntimeWarning, match="set_cache_size") as seen:
        expected = [call(n) for n in range(160)]
        results = list(pool.map(call, range(160)))
    assert len([w for w in seen if "set_cache_size" in str(w.message)]) == 1  # once, from any thread
    for (out, alpha), (ref_out, ref_alpha) in zip(results, expected):
        assert torch.equal(out, ref_out) and torch.equal(alpha, ref_alpha)
    assert len(ops.structure._CACHE) <= ops.cache_size()


def test_cache_size_is_configurable():
    L = 16
    edges = [patterns.random(2, seed=s).edge_index(L) for s in range(12)]
    q = k = v = torch.randn(L, 1, 4)
    try:
        ops.set_cache_size(12)
        for e in edges:
            ops.attention(q, k, v, e)
        assert all(ops.prepare(e, L) is ops.prepare(e, L) for e in edges)  # all 12 kept
        assert len(ops.structure._CACHE) >= 12
        ops.set_cache_size(3)
        assert len(ops.structure._CACHE) <= 3
        with pytest.raises(ValueError, match="'n'"):
            ops.set_cache_size(-1)
        with pytest.raises(TypeError, match="'n'"):
            ops.set_cache_size(2.5)
    finally:
        ops.set_cache_size(ops.CACHE_SIZE)
    assert ops.cache_size() == ops.CACHE_SIZE == 8


@pytest.mark.parametrize("dtype", HALF)
def test_half_types_with_non_finite_features_on_the_fused_path(dtype):
    """The guard's exact recompute runs half types too: only the readers of a NaN key get NaN."""
    L, poisoned = 70, 30
    q, k, v = (torch.randn(L, 2, 8).to(dtype) for _ in range(3))
    k[poisoned] = float("nan")
    for edges in (patterns.causal(), patterns.causal().edge_index(L)):
        out, _ = ops.attention(q, k, v, edges)
        assert out.dtype == dtype and torch.isnan(out[poisoned:]).all()
        clean, _ = ops.attention(q[:poisoned], k[:poisoned], v[:poisoned], patterns.causal())
        _assert_half_close(out[:poisoned], clean, dtype)  # the earlier queries never read the NaN


# ------------------------------------------------------------------------- CUDA (skipped without)
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@CUDA
@pytest.mark.parametrize("kernel", KERNELS + ["sdpa"])
@pytest.mark.parametrize(
    "name",
    [
        "window_5_5_L150",
        "random_empty_rows_L7_S11",
        "complete_L6_S5",
        "causal_L9",
        "window_and_key_0_L300",
        "shifted_band_L100_S300",
        "duplicates",
    ],
)
def test_every_kernel_equals_oracle_on_cuda(name, kernel):
    """Outputs, weights and gradients on cuda (float64) equal the CPU references."""
    if name == "duplicates":
        L, S = 12, 5
        edge_index = torch.stack([torch.randint(0, S, (36,)), torch.arange(L).repeat_interleave(3)])
        reference = _loop_reference
    else:
        (L, S, build), reference = GRAPHS[name], _oracle
        edge_index = build()
    graph = ops._Graph(edge_index, L, S)
    can_run = {"sdpa": graph.edge_set() is not None, "block": graph.tiles(min_fill=0.0) is not None}
    if not can_run.get(kernel, True):
        pytest.skip(f"impl={kernel!r} does not run this graph (also on the CPU)")
    inputs = _qkv(L, S)
    ref_out, ref_alpha = reference(*inputs, edge_index)
    ref_grads = _grads(ref_out, ref_alpha, inputs)
    cuda = [t.detach().cuda().requires_grad_() for t in inputs]
    out, alpha = ops.attention(*cuda, edge_index.cuda(), impl=kernel, need_weights=True)
    assert out.is_cuda and alpha.is_cuda
    assert_close(out.cpu(), ref_out)
    assert_close(alpha.cpu(), ref_alpha)
    for got, want in zip(_grads(out, alpha, cuda), ref_grads):
        assert_close(got.cpu(), want)
