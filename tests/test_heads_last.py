"""Rows stored heads innermost (graphattn.ops.heads_last): the kernels against the library path, the layer against PyG."""

from __future__ import annotations

import pytest
import torch
from conftest import DTYPES, assert_close

import graphattn as ga
from graphattn.ops import fused

pytest.importorskip("numba")


def _graph(L, S, E, seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.stack([torch.randint(0, S, (E,), generator=g), torch.randint(0, L - 3, (E,), generator=g)])
    return torch.cat([ei, ei[:, :10]], 1)  # duplicates; the last targets without edges


def _heads_last(x):
    """The same values, stored ``(n, D, H)``: a ``(n, H, D)`` view with strides ``(H D, 1, H)``."""
    return x.detach().transpose(1, 2).contiguous().transpose(1, 2)


def _attend(q, k, v, ei, bias, need_weights, dropout=0.0):
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    torch.manual_seed(11)
    out, alpha = ga.attention(
        *leaves, ei, edge_bias=bias, impl="csr", scale=0.6, dropout=dropout, need_weights=need_weights
    )
    loss = (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum()
    if need_weights:
        loss = loss + (alpha * torch.linspace(0, 2, alpha.numel(), dtype=alpha.dtype).view_as(alpha)).sum()
    loss.backward()
    return out.detach(), None if alpha is None else alpha.detach(), [t.grad for t in leaves]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "bias_kind, need_weights, dropout",
    [(None, False, 0.0), ("heads", True, 0.0), ("one", False, 0.3), (None, True, 0.3)],
)
def test_heads_last_kernels_equal_the_library_path(dtype, bias_kind, need_weights, dropout, one_thread, counted):
    """Heads-innermost q, k, v through ga.attention: outputs, weights and gradients equal the library path's
    on the same values stored (n, H, D) (same dropout mask under one seed); gradients keep the inputs' layout."""
    L, S, H, D, Dv = 40, 30, 4, 6, 5
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(n, H, D, dtype=dtype, generator=g) for n in (L, S))
    v = torch.randn(S, H, Dv, dtype=dtype, generator=g)
    ei = _graph(L, S, 200)
    bias = {
        None: None,
        "heads": torch.randn(ei.size(1), H, dtype=dtype, generator=g),
        "one": torch.randn(ei.size(1), 1, dtype=dtype, generator=g),
    }[bias_kind]
    views = [_heads_last(t).requires_grad_() for t in (q, k, v)]
    torch.manual_seed(11)
    out, alpha = ga.attention(
        *views, ei, edge_bias=bias, impl="csr", scale=0.6, dropout=dropout, need_weights=need_weights
    )
    loss = (out * torch.linspace(-1, 1, out.numel(), dtype=dtype).view_as(out)).sum()
    if need_weights:
        loss = loss + (alpha * torch.linspace(0, 2, alpha.numel(), dtype=dtype).view_as(alpha)).sum()
    loss.backward()
    assert counted["heads_last"] == 2 and counted["rows"] == 0  # forward and backward, the heads-last kernels
    for t in views:
        assert t.grad.stride() == t.stride()  # the layout the backward operator promises (its fake's)
    fused.ENABLED = False  # the reference: sampled matmul, segment softmax, sparse matmul, on (n, H, D) rows
    try:
        ref = _attend(q, k, v, ei, bias, need_weights, dropout)
    finally:
        fused.ENABLED = True
    assert_close(out, ref[0])
    if need_weights:
        assert_close(alpha.detach(), ref[1])
    for t, expected in zip(views, ref[2]):
        assert_close(t.grad, expected)


@pytest.mark.parametrize("threads, H, D", [(2, 4, 6), (1, 4, 32), (1, 20, 5)])
def test_heads_last_only_for_one_thread_and_small_rows(threads, H, D, counted):
    """With two threads, 32 channels or 20 heads, heads-innermost inputs take the (n, H, D) kernels: the same
    outputs and gradients as contiguous inputs, gradients in the inputs' layout (a serial backward crashed
    in numba's typing on non-contiguous inputs before: its gradients took their strides)."""
    L = 30
    ei = _graph(L, L, 120)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        base = [torch.randn(L, H, D, dtype=torch.float64) for _ in range(3)]
        views = [_heads_last(t).requires_grad_() for t in base]
        out, _ = ga.attention(*views, ei, impl="csr")
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        assert counted == {"heads_last": 0, "rows": 2}
        leaves = [t.clone().requires_grad_() for t in base]
        expected, _ = ga.attention(*leaves, ei, impl="csr")
        (expected * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
    finally:
        torch.set_num_threads(before)
    assert_close(out, expected)
    for t, leaf in zip(views, leaves):
        assert t.grad.stride() == t.stride()
        assert_close(t.grad, leaf.grad)


@pytest.mark.parametrize("dtype", DTYPES)
def test_transformer_conv_projects_heads_last_and_equals_pyg(dtype, one_thread, counted):
    """At one thread ga.TransformerConv projects to heads-innermost rows and runs their kernels; output and
    every gradient equal PyG's TransformerConv with the same weights."""
    from torch_geometric.nn import TransformerConv

    torch.manual_seed(2)
    N, F, H, C = 60, 12, 4, 8
    ei = _graph(N, N, 400)
    ours = ga.TransformerConv(F, C, heads=H).to(dtype)
    ref = TransformerConv(F, C, heads=H).to(dtype)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(N, F, dtype=dtype)
    out = ours(x.requires_grad_(), ei)
    assert counted == {"heads_last": 1, "rows": 0}
    x_ref = x.detach().requires_grad_()
    expected = ref(x_ref, ei)
    assert_close(out, expected)
    w = torch.randn_like(out)
    got = torch.autograd.grad((out * w).sum(), [x, *ours.parameters()])
    want = torch.autograd.grad((expected * w).sum(), [x_ref, *ref.parameters()])
    for a, b in zip(got, want):
        assert_close(a, b)


def test_compiled_transformer_conv_runs_heads_last_and_equals_eager(one_thread, counted):
    """Compiled with fullgraph=True, the layer still projects heads innermost (the decision is a traced constant)
    and runs those kernels; outputs and gradients equal eager. Run later at two threads it stays right."""
    torch.manual_seed(3)
    N, F, H, C = 50, 16, 4, 4
    ei = _graph(N, N, 300)
    layer = ga.TransformerConv(F, C, heads=H)
    torch.compiler.reset()  # a fresh budget of recompilations, and none left behind (the end of the test)
    compiled = torch.compile(layer, fullgraph=True)
    x = torch.randn(N, F)
    xc = x.clone().requires_grad_()
    out = compiled(xc, ei)
    out.sum().backward()
    assert counted["heads_last"] == 2 and counted["rows"] == 0
    xe = x.clone().requires_grad_()
    eager = layer(xe, ei)
    eager.sum().backward()
    assert_close(out, eager)
    assert_close(xc.grad, xe.grad)
    torch.set_num_threads(2)  # (one_thread restores it)
    counted.update(heads_last=0, rows=0)
    again = compiled(x, ei)
    assert counted == {"heads_last": 0, "rows": 1}  # the operator checks the layout itself
    assert_close(again, eager.detach())
    torch.compiler.reset()


def test_hooks_on_the_projections_keep_the_rows_layout(one_thread, counted):
    """A forward hook on lin_key sees the call: the layer then projects with the modules, (n, H, D)."""
    layer = ga.TransformerConv(8, 4, heads=2)
    seen = []
    layer.lin_key.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    layer(torch.randn(10, 8), _graph(10, 10, 40))
    assert seen == [(10, 8)] and counted == {"heads_last": 0, "rows": 1}


def _with_pyg(F, C, H, N=20):
    """``(x (N, F), edge_index, ours, ref)``: ``ga.TransformerConv`` and PyG's with the same weights, float64."""
    from torch_geometric.nn import TransformerConv

    ours = ga.TransformerConv(F, C, heads=H).double()
    ref = TransformerConv(F, C, heads=H).double()
    ref.load_state_dict(ours.state_dict())
    return torch.randn(N, F, dtype=torch.float64), _graph(N, N, 60), ours, ref


def test_projections_that_compute_more_than_their_weights_keep_the_rows_layout(one_thread, counted):
    """A Linear subclass with its own forward (an adapter, fake quantisation), a patched forward, or a
    module without ``weight`` as a projection: the layer calls it, as PyG does, and equals PyG's layer."""
    from torch import nn

    class Doubled(nn.Linear):
        def forward(self, x):
            return 2.0 * super().forward(x)

    F, H, C = 5, 4, 3
    x, ei, ours, ref = _with_pyg(F, C, H)
    for module in (ours, ref):
        doubled = Doubled(F, H * C).double()
        doubled.load_state_dict(module.lin_query.state_dict())
        module.lin_query = doubled
        plain = module.lin_key.forward
        module.lin_key.forward = lambda z, plain=plain: 0.5 * plain(z)
        module.lin_value = nn.Sequential(module.lin_value, nn.Tanh())
    assert_close(ours(x, ei), ref(x, ei))
    assert counted["heads_last"] == 0


@pytest.mark.parametrize("threads", [1, 2])
def test_parametrized_projection_is_evaluated_as_often_at_any_thread_count(threads, one_thread, counted):
    """A parametrized weight (torch.nn.utils.parametrize) is computed at each access: the layer calls the module,
    as it does at two threads (at one thread the layout check evaluated it once more), and equals PyG's layer
    with the same parametrization."""
    from torch import nn
    from torch.nn.utils import parametrize

    calls: list[int] = []

    class Scaled(nn.Module):
        def forward(self, weight):
            calls.append(1)
            return 1.5 * weight

    torch.set_num_threads(threads)  # (one_thread restores it)
    x, ei, ours, ref = _with_pyg(6, 4, 2)
    for module in (ours, ref):
        parametrize.register_parametrization(module.lin_key, "weight", Scaled())
    calls.clear()
    ref(x, ei)
    expected_calls, calls[:] = len(calls), []
    out = ours(x, ei)
    assert len(calls) - expected_calls <= 1  # ours checks the width against the weight once (PyG does not)
    assert counted["heads_last"] == 0
    assert_close(out, ref(x, ei))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bipartite", [False, True])
def test_attention_conv_projects_heads_last_and_equals_the_dense_oracle(dtype, bipartite, one_thread, counted):
    """At one thread ga.AttentionConv projects to heads-innermost rows and runs their kernels; output and every
    gradient equal the dense oracle (masked softmax attention, graphattn.dense.DenseAttention) with the same
    weights, targets without keys included."""
    from graphattn import graphs
    from graphattn.dense import DenseAttention

    torch.manual_seed(4)
    L, S, H, D = 30, 24 if bipartite else 30, 4, 6
    f_kv, f_q = (5, 7) if bipartite else (9, 9)
    conv = ga.AttentionConv((f_kv, f_q) if bipartite else f_q, H * D, heads=H).to(dtype)
    oracle = DenseAttention((f_kv, f_q) if bipartite else f_q, H * D, heads=H).to(dtype)
    oracle.load_state_dict(conv.state_dict())
    mask = torch.rand(L, S) < 0.3
    mask[5] = False  # a target without keys: a zero attention row
    edge_index = graphs.mask_to_edge_index(mask)
    x_kv, x_q = torch.randn(S, f_kv, dtype=dtype), torch.randn(L, f_q, dtype=dtype)
    inputs = (x_kv.requires_grad_(), x_q.requires_grad_()) if bipartite else x_q.requires_grad_()
    out = conv(inputs, edge_index)
    assert counted == {"heads_last": 1, "rows": 0}
    ref_kv, ref_q = x_kv.detach().requires_grad_(), x_q.detach().requires_grad_()
    expected, _ = oracle((ref_kv, ref_q) if bipartite else ref_q, mask)
    assert_close(out, expected)
    w = torch.randn_like(out)
    leaves = [x_kv, x_q] if bipartite else [x_q]
    ref_leaves = [ref_kv, ref_q] if bipartite else [ref_q]
    got = torch.autograd.grad((out * w).sum(), [*leaves, *conv.parameters()])
    want = torch.autograd.grad((expected * w).sum(), [*ref_leaves, *oracle.parameters()])
    assert counted["heads_last"] == 2
    for a, b in zip(got, want):
        assert_close(a, b)


def test_attention_conv_edge_bias_and_compiled_run_heads_last(one_thread, counted):
    """With an edge bias per head the heads-last layer equals SDPA with the bias as a float mask (on the same
    projections, PyTorch's layout); compiled with fullgraph=True it runs the same kernels and equals eager."""
    import torch.nn.functional as F

    from graphattn import graphs

    torch.manual_seed(5)
    L, H, D = 16, 2, 4
    conv = ga.AttentionConv(H * D, H * D, heads=H, output_projection=False).double()
    x = torch.randn(L, H * D, dtype=torch.float64)
    mask = torch.rand(L, L) < 0.5
    mask.fill_diagonal_(True)
    edge_index = graphs.mask_to_edge_index(mask)
    bias = torch.randn(edge_index.size(1), H, dtype=torch.float64)
    dense_bias = torch.full((H, L, L), float("-inf"), dtype=torch.float64)
    dense_bias[:, edge_index[1], edge_index[0]] = bias.T
    out = conv(x, edge_index, edge_bias=bias)
    assert counted == {"heads_last": 1, "rows": 0}
    q, k, v = (t.transpose(0, 1) for t in conv._project(x))  # (H, L, D), the rows layout
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=dense_bias)
    assert_close(out, ref.transpose(0, 1).reshape(L, H * D))
    torch.compiler.reset()
    compiled = torch.compile(conv, fullgraph=True)
    xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    counted.update(heads_last=0, rows=0)
    got = compiled(xc, edge_index, edge_bias=bias)
    got.sum().backward()
    assert counted == {"heads_last": 2, "rows": 0}
    eager = conv(xe, edge_index, edge_bias=bias)
    eager.sum().backward()
    assert_close(got, eager)
    assert_close(xc.grad, xe.grad)
    torch.compiler.reset()


@pytest.mark.parametrize("threads", [1, 2])
def test_attention_conv_projection_without_weight_is_called_as_it_is(threads, one_thread):
    """A projection replaced by a module without ``weight`` (``nn.Sequential(Linear, Tanh)``) is called, as PyG
    calls it: the layer equals PyG's TransformerConv (root_weight=False) with the same modules, then lin_out."""
    from torch import nn
    from torch_geometric.nn import TransformerConv

    torch.set_num_threads(threads)  # (one_thread restores it)
    N, F, H, D = 20, 6, 2, 4
    x, ei = torch.randn(N, F, dtype=torch.float64), _graph(N, N, 60)
    conv = ga.AttentionConv(F, H * D, heads=H).double()
    ref = TransformerConv(F, D, heads=H, root_weight=False).double()
    ref.lin_query.load_state_dict(conv.lin_query.state_dict())
    ref.lin_key.load_state_dict(conv.lin_key.state_dict())
    conv.lin_value = ref.lin_value = nn.Sequential(nn.Linear(F, H * D), nn.Tanh()).double()
    assert_close(conv(x, ei), conv.lin_out(ref(x, ei)))


KINDS = ["TransformerConv", "AttentionConv", "GATConv", "GATv2Conv"]


def _checkpoint_layer(kind):
    torch.manual_seed(5)
    if kind == "TransformerConv":
        return ga.TransformerConv(12, 4, heads=3).double()
    if kind.startswith("GAT"):
        return getattr(ga, kind)(12, 4, heads=3).double()
    return ga.AttentionConv(12, 12, heads=3).double()


def _grads(out, w, leaves):
    """d (out * w).sum() / d leaves through ``.backward()`` (reentrant checkpointing refuses ``autograd.grad``)."""
    for t in leaves:
        t.grad = None
    (out * w).sum().backward()
    return [t.grad.clone() for t in leaves]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("change", ["none", "threads 1 -> 2", "threads 2 -> 1", "hook"])
@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpoint_recomputation_in_the_other_layout_is_refused(kind, change, reentrant, one_thread):
    """torch.utils.checkpoint recomputes the forward in the backward. Non-reentrant, it hands the recomputed
    tensors to the first graph by order: a recomputation in the other projection layout (the thread count or a
    hook changed before the backward) gave silently wrong gradients (2.1 off here); now it raises, naming the
    ways out (or checkpoint's own check does, where the other thread count runs other operations: GATv2).
    Unchanged, or reentrant (which differentiates its own recomputed graph), the gradients equal those without
    checkpointing."""
    from torch.utils.checkpoint import checkpoint

    layer = _checkpoint_layer(kind)
    N = 30
    x, ei = torch.randn(N, 12, dtype=torch.float64, requires_grad=True), _graph(N, N, 150)
    leaves = [x, *layer.parameters()]
    first = 2 if change == "threads 2 -> 1" else 1
    torch.set_num_threads(first)  # (one_thread restores it)
    w = torch.randn(N, 12, dtype=torch.float64)
    want = _grads(layer(x, ei), w, leaves)
    out = checkpoint(layer, x, ei, use_reentrant=reentrant)
    if change.startswith("threads"):
        torch.set_num_threads(3 - first)
    elif change == "hook":
        projection = {"GATConv": "lin", "GATv2Conv": "lin_r"}.get(kind, "lin_key")
        getattr(layer, projection).register_forward_hook(lambda module, args, out: None)
    if change == "none" or reentrant:
        for a, b in zip(_grads(out, w, leaves), want):
            assert_close(a, b)
    else:  # GATv2 at two threads runs PyTorch's scores, not the operator: checkpoint counts other saved tensors
        ours = "recomputation.*use_reentrant=True, or impl='message_passing'"
        theirs = "torch.utils.checkpoint: (A different number of tensors|Recomputed values)"  # CheckpointError
        with pytest.raises(RuntimeError, match=theirs if kind == "GATv2Conv" and change != "hook" else ours):
            _grads(out, w, leaves)


@pytest.mark.parametrize("kind", KINDS)
def test_lazy_layer_first_called_under_checkpoint_is_exact(kind, one_thread, counted):
    """A lazy layer (in_channels=-1) whose first call is inside a non-reentrant checkpoint: its projections are
    materialised before the layout is chosen, so the recomputation takes the same one (it raised, found by a
    helper; PyG's layer takes it). Heads-last from the first call; gradients equal those without checkpoint."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(6)
    layer = (
        ga.AttentionConv(-1, 16, heads=4) if kind == "AttentionConv" else getattr(ga, kind)(-1, 4, heads=4)
    ).double()
    N = 25
    x, ei = torch.randn(N, 10, dtype=torch.float64, requires_grad=True), _graph(N, N, 100)
    w = torch.randn(N, 16, dtype=torch.float64)
    out = checkpoint(layer, x, ei, use_reentrant=False)
    assert counted == {"heads_last": 1, "rows": 0}
    leaves = [x, *layer.parameters()]
    got = _grads(out, w, leaves)
    want = _grads(layer(x, ei), w, leaves)
    for a, b in zip(got, want):
        assert_close(a, b)


def test_kernels_compile_with_the_slp_vectoriser_and_are_called_without_typing_each_argument(one_thread, monkeypatch):
    """Each compilation (or load from numba's cache) runs with LLVM's SLP vectoriser on, and only it (the flag is
    numba's global); a call whose types are compiled goes straight to numba's dispatcher, without a
    ``numba.typeof`` per argument first (20 us a call; it was done on every call)."""
    import numba
    from numba.core.dispatcher import Dispatcher

    from graphattn.ops import heads_last

    flags = []
    compile_signature = Dispatcher.compile

    def spy(self, signature):
        if self.py_func.__module__ == heads_last.__name__ and self.py_func.__name__ in ("forward", "backward"):
            flags.append(numba.config.SLP_VECTORIZE)  # (numba functions they call compile too, in a fresh process)
        return compile_signature(self, signature)

    monkeypatch.setattr(Dispatcher, "compile", spy)
    monkeypatch.setattr(fused, "_KERNELS_HL", {})  # built afresh, through the spy
    before = numba.config.SLP_VECTORIZE
    q, k, v = (_heads_last(torch.randn(12, 3, 5)).requires_grad_() for _ in range(3))
    ei = _graph(12, 12, 40)
    out, _ = ga.attention(q, k, v, ei)
    out.sum().backward()
    assert flags == [1, 1] and numba.config.SLP_VECTORIZE == before  # forward and backward compiled (or loaded)

    def refuse(value):
        raise AssertionError("numba.typeof called per argument")

    monkeypatch.setattr(numba, "typeof", refuse)
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    again, _ = ga.attention(q, k, v, ei)
    again.sum().backward()
    assert flags == [1, 1]  # nothing compiled again
    assert_close(again, out)
    for t, g in zip((q, k, v), grads):
        assert_close(t.grad, g)
