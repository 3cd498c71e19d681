"""PyG's own explainer tests (explain/algorithm/*) ported to ``graphattn.TransformerConv``.

Where PyG's tests check shapes and ranges, these also check the numbers:
every explanation equals the one PyG computes for ``torch_geometric.nn.TransformerConv``
with the same weights. PyG's layer tests (test_transformer_conv, test_gat_conv,
test_gatv2_conv) are restated in ``tests/test_pyg_restated.py``.
"""

import pytest
import torch
from torch_geometric.explain import AttentionExplainer, Explainer, GNNExplainer
from torch_geometric.nn import TransformerConv as PyGTransformerConv
from torch_geometric.nn import global_add_pool
from torch_geometric.utils import to_torch_csc_tensor

import graphattn as ga
import graphattn.routing
from tests.conftest import assert_close

X = torch.randn(8, 3, generator=torch.Generator().manual_seed(1))
EDGE_INDEX = torch.tensor([[0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7], [1, 0, 2, 1, 3, 2, 4, 3, 5, 4, 6, 5, 7, 6]])
BATCH = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])


# -- models: the same network on graphattn's layer and on PyG's -------------------------------------


class Net(torch.nn.Module):
    def __init__(self, layer, out_channels=7, graph_level=False):
        super().__init__()
        self.conv1 = layer(3, 8, heads=2)
        self.conv2 = layer(16, out_channels, heads=1)
        self.graph_level = graph_level

    def forward(self, x, edge_index, batch=None):
        x = self.conv2(self.conv1(x, edge_index).relu(), edge_index)
        return global_add_pool(x, batch) if self.graph_level else x


def twin_models(**kwargs):
    """``(ours, pyg)`` with equal weights, in eval mode."""
    pyg = Net(PyGTransformerConv, **kwargs).eval()
    ours = Net(ga.TransformerConv, **kwargs).eval()
    ours.load_state_dict(pyg.state_dict())
    return ours, pyg


def explain(model, algorithm, seed=0, **kwargs):
    config = dict(mode="multiclass_classification", task_level=kwargs.pop("task_level", "node"), return_type="raw")
    explainer = Explainer(
        model=model,
        algorithm=algorithm,
        explanation_type="model",
        edge_mask_type="object",
        model_config=config,
        **kwargs.pop("explainer", {}),
    )
    torch.manual_seed(seed)
    return explainer(X, EDGE_INDEX, **kwargs)


# -- test/explain/algorithm/test_attention_explainer.py --------------------------------------------


@pytest.mark.parametrize("index", [None, 2, torch.arange(3)], ids=["all", "int", "range"])
def test_attention_explainer_equals_pyg(index):
    ours, pyg = twin_models()
    explanation = explain(ours, AttentionExplainer(), index=index)
    reference = explain(pyg, AttentionExplainer(), index=index)
    assert explanation.edge_mask.size() == (EDGE_INDEX.size(1),)
    assert explanation.edge_mask.min() >= 0 and explanation.edge_mask.max() <= 1
    assert_close(explanation.edge_mask, reference.edge_mask, torch.float32)


def test_attention_explainer_leaves_the_fast_path_only_while_it_runs():
    ours, _ = twin_models()
    explain(ours, AttentionExplainer())
    assert not ga.routing.needs_propagate(ours.conv1)  # its hooks are removed again


# -- test/explain/algorithm/test_gnn_explainer.py ---------------------------------------------------


@pytest.mark.parametrize("task_level", ["node", "graph"])
@pytest.mark.parametrize("node_mask_type", [None, "object", "attributes"])
@pytest.mark.parametrize("index", [None, 2], ids=["all", "int"])
def test_gnn_explainer_equals_pyg(task_level, node_mask_type, index):
    ours, pyg = twin_models(graph_level=task_level == "graph")
    kwargs = dict(task_level=task_level, index=index, explainer=dict(node_mask_type=node_mask_type))
    if task_level == "graph":
        kwargs["batch"] = BATCH
        kwargs["index"] = None if index is None else 1
    explanation = explain(ours, GNNExplainer(epochs=3), **dict(kwargs, explainer=dict(kwargs["explainer"])))
    reference = explain(pyg, GNNExplainer(epochs=3), **kwargs)
    assert_close(explanation.edge_mask, reference.edge_mask, torch.float32)
    if node_mask_type is not None:
        assert_close(explanation.node_mask, reference.node_mask, torch.float32)


# -- MessagePassing machinery: explain mode, edge masks, message hooks ------------------------------


@pytest.mark.parametrize("apply_sigmoid", [True, False])
def test_explain_mode_edge_mask_equals_pyg(apply_sigmoid):
    from torch_geometric.explain.algorithm.utils import set_masks

    ref = PyGTransformerConv(3, 4, heads=2, edge_dim=2).double()
    conv = ga.TransformerConv.from_transformer_conv(ref)
    x, edge_attr = X.double(), torch.randn(EDGE_INDEX.size(1), 2, dtype=torch.float64)
    mask = torch.randn(EDGE_INDEX.size(1), dtype=torch.float64)
    plain = conv(x, EDGE_INDEX, edge_attr)
    for module in (conv, ref):
        set_masks(module, mask, EDGE_INDEX, apply_sigmoid=apply_sigmoid)
    out = conv(x, EDGE_INDEX, edge_attr)
    assert_close(out, ref(x, EDGE_INDEX, edge_attr))
    assert not torch.allclose(out, plain)  # the mask is applied, not ignored


def test_message_hooks_fire_and_see_pyg_messages():
    ref = PyGTransformerConv(3, 4, heads=2).double()
    conv = ga.TransformerConv.from_transformer_conv(ref)
    seen = {}
    for name, module in (("ours", conv), ("pyg", ref)):
        module.register_message_forward_hook(lambda m, inputs, out, name=name: seen.setdefault(name, out))
        module(X.double(), EDGE_INDEX)
    assert_close(seen["ours"], seen["pyg"])  # (E, H, D) messages alpha_ij (v_j + e_ij)


# -- the same machinery on AttentionConv (MHA semantics) --------------------------------------------


def attention_conv_pair():
    fast = ga.AttentionConv(3, 4, heads=2).double()
    slow = ga.AttentionConv(3, 4, heads=2, impl="message_passing").double()
    slow.load_state_dict(fast.state_dict())
    return fast, slow


def test_attention_conv_explain_mode_and_hooks_on_the_default_path():
    from torch_geometric.explain.algorithm.utils import clear_masks, set_masks

    fast, slow = attention_conv_pair()
    x = X.double()
    mask = torch.randn(EDGE_INDEX.size(1), dtype=torch.float64)
    plain = fast(x, EDGE_INDEX)
    for module in (fast, slow):
        set_masks(module, mask, EDGE_INDEX)
    masked = fast(x, EDGE_INDEX)
    assert_close(masked, slow(x, EDGE_INDEX))
    assert not torch.allclose(masked, plain)
    clear_masks(fast)
    seen = []
    handle = fast.register_message_forward_hook(lambda m, inputs, out: seen.append(inputs[0]["alpha"]))
    _, (_, alpha) = fast(x, EDGE_INDEX, return_attention_weights=True)
    handle.remove()
    assert len(seen) == 1 and torch.equal(seen[0], alpha)


def test_attention_conv_adjacency_forms_size_and_batch():
    from torch_geometric import EdgeIndex

    fast, _ = attention_conv_pair()
    x = X.double()
    expected = fast(x, EDGE_INDEX)
    assert_close(fast(x, to_torch_csc_tensor(EDGE_INDEX, size=(8, 8)).t()), expected)
    assert_close(fast(x, EdgeIndex(EDGE_INDEX, sparse_size=(8, 8))), expected)
    assert_close(fast(x, EDGE_INDEX, size=(8, 8)), expected)
    edges, _ = ga.graphs.batch_sequences([3, 2, 3], ga.patterns.full())
    assert_close(fast(x, ga.patterns.full(), batch=BATCH), fast(x, edges))


def test_attention_conv_compiles_without_graph_breaks():
    fast, _ = attention_conv_pair()
    x = X.double()
    compiled = torch.compile(fast, fullgraph=True, backend="eager")
    assert_close(compiled(x, EDGE_INDEX), fast(x, EDGE_INDEX))


def test_batched_pattern_under_compile():
    """Traced on the ragged kernel (graph breaks where it reads sizes), equal to eager."""
    fast, _ = attention_conv_pair()
    compiled = torch.compile(fast, backend="eager")
    x = X.double()
    assert_close(compiled(x, ga.patterns.full(), batch=BATCH), fast(x, ga.patterns.full(), batch=BATCH))
