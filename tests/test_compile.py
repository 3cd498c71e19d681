"""torch.compile and torch.export keep the fast path: the graphattn operators are in the traced graph,
``propagate`` is not, and outputs and gradients equal eager (which tests/test_ops.py pins to the dense oracle).

Backends: ``aot_eager`` traces forward and backward through AOTAutograd (what
inductor receives) without code generation, so these tests stay fast; one
inductor test runs the real compiler on a small graph.
"""

import pytest
import torch
from conftest import assert_close
from torch._dynamo.testing import CompileCounterWithBackend
from torch_geometric.nn import GATConv as PyGGATConv
from torch_geometric.nn import GATv2Conv as PyGGATv2Conv
from torch_geometric.nn import TransformerConv as PyGTransformerConv

import graphattn as ga
from graphattn import patterns


def _recording(backend="aot_eager"):
    """A backend that keeps every FX graph dynamo hands it (the forward graphs, before AOT)."""
    graphs = []

    def compiler(gm, inputs):
        graphs.append(gm)
        return torch._dynamo.backends.registry.lookup_backend(backend)(gm, inputs)

    return compiler, graphs


def _targets(graphs) -> set[str]:
    return {str(node.target) for gm in graphs for node in gm.graph.nodes}


def _no_propagate(conv):
    def refuse(*args, **kwargs):
        raise AssertionError("propagate ran: the slow path")

    conv.propagate = refuse
    return conv


def _graph(N=40, degree=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    dst = torch.arange(N).repeat_interleave(degree)  # (E,)
    return torch.stack([torch.randint(0, N, (N * degree,), generator=g), dst])  # (2, E), duplicates allowed


def _grads(module, x, fn):
    module.zero_grad()
    x = x.detach().requires_grad_()
    out = fn(x)
    out.square().sum().backward()
    return out.detach(), [x.grad] + [p.grad.clone() for p in module.parameters() if p.grad is not None]


LAYERS = [
    pytest.param(lambda: ga.TransformerConv(16, 4, heads=4), id="TransformerConv"),
    pytest.param(lambda: ga.TransformerConv(16, 4, heads=4, edge_dim=3, beta=True), id="TransformerConv-edge_attr"),
    pytest.param(lambda: ga.AttentionConv(16, 16, heads=4), id="AttentionConv"),
]


@pytest.mark.parametrize("make", LAYERS)
def test_compiled_layer_runs_the_operators_and_equals_eager(make):
    torch.manual_seed(0)
    conv = _no_propagate(make().double())
    x, edge_index = torch.randn(40, 16, dtype=torch.float64), _graph()
    args = (
        (torch.randn(edge_index.size(1), 3, dtype=torch.float64),)
        if conv.__class__ is ga.TransformerConv and conv.lin_edge is not None
        else ()
    )
    backend, graphs = _recording()
    compiled = torch.compile(conv, fullgraph=True, backend=backend)
    got = _grads(conv, x, lambda x: compiled(x, edge_index, *args))
    want = _grads(conv, x, lambda x: conv(x, edge_index, *args))
    assert "graphattn.attention.default" in _targets(graphs)
    assert_close(got[0], want[0])
    for a, b in zip(got[1], want[1]):
        assert_close(a, b)


def test_compiled_pattern_with_batch_is_one_ragged_operator():
    """patterns.full() with a PyG batch: fullgraph (no .item(), no data-dependent shapes), equal to eager."""
    torch.manual_seed(1)
    conv = _no_propagate(ga.AttentionConv(16, 16, heads=4).double())
    batch = torch.tensor([0] * 5 + [1] * 9 + [2] * 7)
    x = torch.randn(21, 16, dtype=torch.float64)
    for pattern in (patterns.full(), patterns.causal()):
        backend, graphs = _recording()
        compiled = torch.compile(conv, fullgraph=True, backend=backend)
        got = _grads(conv, x, lambda x, compiled=compiled, pattern=pattern: compiled(x, pattern, batch=batch))
        want = _grads(conv, x, lambda x, pattern=pattern: conv(x, pattern, batch=batch))
        assert "graphattn.ragged_attention.default" in _targets(graphs)
        for a, b in zip([got[0]] + got[1], [want[0]] + want[1]):
            assert_close(a, b)


def test_ragged_operator_backward_redraws_the_forwards_dropout():
    """The ragged operator with dropout: its gradients are those of the same seeded forward under autograd."""
    from graphattn.ops.operators import ragged_attention_op
    from graphattn.ops.ragged import bucket_layout, core_reference

    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(13, 2, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    batch, seed = torch.tensor([0] * 6 + [1] * 7), torch.tensor(1234)
    out = ragged_attention_op(q, k, v, batch, False, 0.5, 0.4, seed)
    got = torch.autograd.grad(out.square().sum(), (q, k, v))
    source, back, buckets = bucket_layout(batch, torch.tensor([6, 7]), 2)
    rows = (t.reshape(-1, 4)[source] for t in (q, k, v))  # the readable path: gather, attention per size, gather back
    ref = core_reference(*rows, buckets, 2, False, 0.5, 0.4, 1234)[back].view(13, 2, 4)
    want = torch.autograd.grad(ref.square().sum(), (q, k, v))
    assert_close(out, ref)
    assert not torch.allclose(out, ragged_attention_op(q, k, v, batch, False, 0.5, 0.0, seed))  # it dropped some
    for a, b in zip(got, want):
        assert_close(a, b)


def test_dynamic_shapes_compile_once_for_sampled_batches():
    """Five sampled graphs of different sizes, dynamic=True: one compilation, each equal to eager."""
    torch.manual_seed(3)
    conv = ga.TransformerConv(16, 4, heads=2)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(conv, fullgraph=True, dynamic=True, backend=counter)
    for n in (30, 45, 61, 80, 97):
        x, edge_index = torch.randn(n, 16), _graph(n, degree=3, seed=n)[:, : 3 * n - n // 3].contiguous()
        assert_close(compiled(x, edge_index), conv(x, edge_index))
    real = [gm for gm in counter.graphs if any(node.op == "call_function" for node in gm.graph.nodes)]
    assert len(real) == 1  # (dynamo may also count an empty frame)


def test_inductor_compiles_the_layer():
    """The real compiler (inductor, C++ codegen): one graph, the operator inside, equal to eager forward and backward."""
    torch.manual_seed(4)
    conv = _no_propagate(ga.TransformerConv(16, 4, heads=4))
    x, edge_index = torch.randn(64, 16), _graph(64, 5)
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(conv, fullgraph=True, backend=counter)
    got, want = _grads(conv, x, lambda x: compiled(x, edge_index)), _grads(conv, x, lambda x: conv(x, edge_index))
    assert counter.frame_count == 1
    assert_close(got[0], want[0])
    for a, b in zip(got[1], want[1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)  # inductor fuses the projections: float32 reordering


def test_export_names_the_operator():
    conv = ga.TransformerConv(16, 4, heads=4).eval()
    x, edge_index = torch.randn(40, 16), _graph()
    exported = torch.export.export(conv, (x, edge_index))
    assert "graphattn.attention.default" in {str(n.target) for n in exported.graph.nodes}
    assert_close(exported.module()(x, edge_index), conv(x, edge_index))


# ---------------------------------------------------------------------------------------- GAT, PyG's defaults
GAT = [
    pytest.param(lambda: PyGGATConv(16, 4, heads=3, edge_dim=3), ga.GATConv.from_gat_conv, id="GATConv-edge_attr"),
    pytest.param(lambda: PyGGATv2Conv(16, 4, heads=3), ga.GATv2Conv.from_gatv2_conv, id="GATv2Conv"),
]


def _looped(N=40):
    """A graph with duplicate edges and its own self-loops (one twice), which PyG's add_self_loops=True removes."""
    return torch.cat([_graph(N), torch.tensor([[3, 7, 7], [3, 7, 7]])], dim=1)  # (2, E)


def _gat_grads(conv, x, edge_attr, call):
    conv.zero_grad()
    x = x.detach().requires_grad_()
    edge_attr = None if edge_attr is None else edge_attr.detach().requires_grad_()
    out = call(x, edge_attr)
    out.square().sum().backward()
    extra = [] if edge_attr is None else [edge_attr.grad]
    return [out.detach(), x.grad, *extra] + [p.grad.clone() for p in conv.parameters() if p.grad is not None]


@pytest.mark.parametrize("make,convert", GAT)
def test_compiled_gat_with_self_loops_runs_the_operator_and_equals_eager_and_pyg(make, convert):
    """add_self_loops=True, fill_value="mean" (PyG's defaults) trace fullgraph: the graph's own loops are left
    out by the operator's cached structure, not filtered (no data-dependent shape) nor masked in the graph, the
    operator is in the graph, and outputs and every gradient (x, edge_attr, parameters) equal eager and PyG's
    layer to 1e-10 in float64. The structure is built once."""
    torch.manual_seed(7)
    ref = make().double()
    conv = _no_propagate(convert(ref))
    x, edge_index = torch.randn(40, 16, dtype=torch.float64), _looped()
    edge_attr = torch.randn(edge_index.size(1), 3, dtype=torch.float64) if ref.edge_dim else None
    backend, graphs = _recording()
    compiled = torch.compile(conv, fullgraph=True, backend=backend)
    got = _gat_grads(conv, x, edge_attr, lambda x, e: compiled(x, edge_index, e))
    misses = ga.ops.structure._CACHE.misses
    for _ in range(3):  # later steps on the same graph: the structure cache hits
        _gat_grads(conv, x, edge_attr, lambda x, e: compiled(x, edge_index, e))
    assert ga.ops.structure._CACHE.misses == misses
    eager = _gat_grads(conv, x, edge_attr, lambda x, e: conv(x, edge_index, e))
    pyg = _gat_grads(ref, x, edge_attr, lambda x, e: ref(x, edge_index, e))
    assert "graphattn.attention.default" in _targets(graphs)
    assert not any("masked_fill" in t for t in _targets(graphs))  # no per-step masking of the own loops
    assert len(got) == len(eager) == len(pyg)
    for a, b, c in zip(got, eager, pyg):
        assert (a - b).abs().max() < 1e-10 and (a - c).abs().max() < 1e-10


def test_export_gat_with_self_loops_names_the_operator():
    torch.manual_seed(8)
    conv = ga.GATConv(16, 4, heads=2, edge_dim=3).eval()
    edge_index = _looped()
    args = (torch.randn(40, 16), edge_index, torch.randn(edge_index.size(1), 3))
    exported = torch.export.export(conv, args)
    assert "graphattn.attention.default" in {str(n.target) for n in exported.graph.nodes}
    assert_close(exported.module()(*args), conv(*args))


def test_compiled_double_backward_is_refused_loudly():
    """AOTAutograd has no double backward: the error is PyTorch's own, never a silently wrong value."""
    conv = ga.TransformerConv(16, 4, heads=2).double()
    compiled = torch.compile(conv, backend="aot_eager")
    x = torch.randn(40, 16, dtype=torch.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match="double backward|create_graph"):
        (g,) = torch.autograd.grad(compiled(x, _graph()).square().sum(), x, create_graph=True)
        g.square().sum().backward()


# ---------------------------------------------------------------------------------------- second order
def _penalty(module, x, call):
    """d/dθ of ||dL/dx||^2: the gradient penalty (WGAN-GP, R1), a second derivative through the layer."""
    module.zero_grad()
    x = x.detach().requires_grad_()
    (dx,) = torch.autograd.grad(call(x).square().sum(), x, create_graph=True)
    dx.square().sum().backward()
    return [dx.detach()] + [p.grad.clone() for p in module.parameters()]


@pytest.mark.parametrize("edge_dim", [None, 3], ids=["plain", "edge_attr"])
def test_gradient_penalty_equals_pygs(edge_dim):
    """Through ga.TransformerConv's fast path and PyG's TransformerConv with the same weights, float64, 1e-8."""
    torch.manual_seed(5)
    ref = PyGTransformerConv(16, 4, heads=4, edge_dim=edge_dim, beta=True).double()
    ours = ga.TransformerConv.from_transformer_conv(ref)
    x, edge_index = torch.randn(40, 16, dtype=torch.float64), _graph()
    args = () if edge_dim is None else (torch.randn(edge_index.size(1), 3, dtype=torch.float64),)
    got = _penalty(ours, x, lambda x: ours(x, edge_index, *args))
    want = _penalty(ref, x, lambda x: ref(x, edge_index, *args))
    for a, b in zip(got, want):
        assert (a - b).abs().max() < 1e-8


@pytest.mark.parametrize("graph", ["edges", "full", "causal", "batch"])
def test_attention_conv_gradient_penalty_equals_message_passing(graph):
    """Every fast path of AttentionConv (operator, SDPA for patterns, the ragged kernel) against propagate."""
    torch.manual_seed(6)
    fast = ga.AttentionConv(16, 16, heads=4).double()
    slow = ga.AttentionConv(16, 16, heads=4, impl="message_passing").double()
    slow.load_state_dict(fast.state_dict())
    x, batch = torch.randn(21, 16, dtype=torch.float64), torch.tensor([0] * 5 + [1] * 9 + [2] * 7)
    edges = {
        "edges": _graph(21, 4),
        "full": patterns.full().edge_index(21),
        "causal": patterns.causal().edge_index(21),
        "batch": ga.graphs.batch_sequences(torch.tensor([5, 9, 7]), patterns.full())[0],
    }[graph]
    call = {
        "edges": lambda c, x: c(x, edges),
        "full": lambda c, x: c(x, patterns.full()),
        "causal": lambda c, x: c(x, patterns.causal()),
        "batch": lambda c, x: c(x, patterns.full(), batch=batch),
    }[graph]
    got = _penalty(fast, x, lambda x: call(fast, x))
    want = _penalty(slow, x, lambda x: slow(x, edges))
    for a, b in zip(got, want):
        assert (a - b).abs().max() < 1e-8


@pytest.mark.parametrize("shape", ["full", "causal"])
def test_ragged_kernel_refuses_create_graph_loudly(shape):
    """The ragged operator (patterns with batch=, as compiled) has no double backward: called directly with
    create_graph=True it names the way out; compiled, AOTAutograd refuses first. Never a silently wrong value."""
    from graphattn.ops.operators import ragged_attention_op

    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(13, 2, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    batch = torch.tensor([0] * 6 + [1] * 7)
    out = ragged_attention_op(q, k, v, batch, shape == "causal", 0.5, 0.0, torch.tensor(0))
    with pytest.raises(NotImplementedError, match="'create_graph' to be False for the ragged kernel.*eagerly"):
        torch.autograd.grad(out.square().sum(), q, create_graph=True)
    conv = ga.AttentionConv(16, 16, heads=4).double()
    compiled = torch.compile(conv, fullgraph=True, backend="aot_eager")
    x = torch.randn(13, 16, dtype=torch.float64, requires_grad=True)
    pattern = patterns.full() if shape == "full" else patterns.causal()
    with pytest.raises((RuntimeError, NotImplementedError), match="double backward|create_graph"):
        (dx,) = torch.autograd.grad(compiled(x, pattern, batch=batch).square().sum(), x, create_graph=True)
        dx.square().sum().backward()


def test_hf_bridge_gradient_penalty_equals_eager():
    """A gradient penalty through a GPT-2 (random weights, float64) on the Hugging Face bridge equals the same
    model on transformers' eager attention: d/dθ of ||dL/d inputs_embeds||^2, padded and unpadded."""
    pytest.importorskip("transformers")
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(n_layer=2, n_head=2, n_embd=8, vocab_size=11, n_positions=16, bos_token_id=0, eos_token_id=0)
    ga.interop.register()
    models = []
    for impl in ("graphattn", "eager"):
        torch.manual_seed(10)
        model = GPT2Model(config).double().eval()
        model.set_attn_implementation(impl)
        models.append(model)
    embeds = torch.randn(3, 7, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(11))
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, 5:] = 0  # right padding: only valid positions enter the loss
    for attention_mask in (None, mask):
        valid = (mask if attention_mask is not None else torch.ones_like(mask)).bool()
        results = []
        for model in models:
            model.zero_grad()
            x = embeds.clone().requires_grad_()
            hidden = model(inputs_embeds=x, attention_mask=attention_mask).last_hidden_state  # (B, T, F)
            (dx,) = torch.autograd.grad(hidden[valid].square().sum(), x, create_graph=True)
            dx.square().sum().backward()
            results.append([dx.detach()] + [p.grad for p in model.parameters() if p.grad is not None])
        assert len(results[0]) == len(results[1]) > 20  # every weight but the unused token embedding
        for a, b in zip(*results):
            assert (a - b).abs().max() < 1e-8
