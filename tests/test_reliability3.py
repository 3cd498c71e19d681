"""Reliability round 3 (issue 20): the surfaces added last round refuse bad input by name, never mix or
lose results, and stay fast on odd but valid input. Each test is one row of ``docs/reliability.md``,
section "Round 3"; exactness is checked against PyG, per-graph SDPA or Hugging Face with the same weights."""

import warnings

import pytest
import torch
from torch_geometric.nn import TransformerConv as PyGTransformerConv

import graphattn as ga
from tests.conftest import assert_close


def _uncoalesced_adj_t():
    """adj_t (3, 3) with the entry (0, 1) stored twice, and the same adjacency coalesced."""
    indices = torch.tensor([[0, 0, 1, 2, 2], [1, 1, 2, 0, 2]])  # (2, nnz): rows = targets i, columns = sources j
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's note about sparse invariant checks
        adj_t = torch.sparse_coo_tensor(indices, torch.tensor([0.5, 0.25, 1.0, 2.0, 3.0]), (3, 3))
    return adj_t, adj_t.coalesce()


# -- uncoalesced COO adjacency ----------------------------------------------------------------------


def test_uncoalesced_coo_adjacency_is_read_coalesced_and_the_callers_tensor_is_left_as_it_was():
    adj_t, coalesced = _uncoalesced_adj_t()
    assert not adj_t.is_coalesced()
    edge_index, size, values = ga.graphs.to_edge_index(adj_t)
    assert not adj_t.is_coalesced()  # PyG's to_edge_index marks it coalesced in place; we never change it
    assert adj_t._nnz() == 5 and adj_t.coalesce()._nnz() == 4  # a later coalesce still merges the duplicate
    expected = coalesced.indices().flip(0)  # (2, 4): row 0 = source j, row 1 = target i
    assert torch.equal(edge_index, expected) and size == (3, 3)
    assert torch.equal(values, coalesced.values())  # the duplicate's values summed, as torch.sparse defines


@pytest.mark.parametrize("layer", ["AttentionConv", "TransformerConv"])
def test_uncoalesced_coo_adjacency_gives_the_coalesced_result_in_both_layers(layer):
    adj_t, coalesced = _uncoalesced_adj_t()
    conv = getattr(ga, layer)(4, 4, heads=2).double()
    x = torch.randn(3, 4, dtype=torch.float64)
    out, (back, alpha) = conv(x, adj_t, return_attention_weights=True)
    assert back is adj_t and alpha.shape == (4, 2)  # one weight per distinct edge
    assert_close(out, conv(x, coalesced))
    assert_close(out, conv(x, coalesced.indices().flip(0)))
    assert not adj_t.is_coalesced()


def test_uncoalesced_coo_adjacency_equals_pyg_on_the_coalesced_tensor():
    adj_t, coalesced = _uncoalesced_adj_t()
    ref = PyGTransformerConv(4, 3, heads=2).double()
    ours = ga.TransformerConv.from_transformer_conv(ref)
    x = torch.randn(3, 4, dtype=torch.float64)
    assert_close(ours(x, adj_t), ref(x, coalesced))


# -- lazy sizes on AttentionConv ------------------------------------------------------------------


@pytest.mark.parametrize("in_channels,known", [((-1, -1), (3, 7)), (-1, 5), ((-1, -1, -1), (3, 2, 7))],
                         ids=["pair", "int", "triple"])
def test_attention_conv_lazy_sizes_are_taken_from_the_first_call(in_channels, known):
    lazy = ga.AttentionConv(in_channels, 4, heads=2)
    assert repr(lazy) == f"AttentionConv({in_channels}, 4, heads=2)"
    widths = known if isinstance(known, tuple) else (known,)
    if len(widths) == 2:
        x = (torch.randn(5, widths[0]), torch.randn(4, widths[1]))
    elif len(widths) == 3:
        x = (torch.randn(5, widths[0]), torch.randn(5, widths[1]), torch.randn(4, widths[2]))
    else:
        x = torch.randn(5, widths[0])
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 0], [0, 1, 2, 3, 0, 2]])
    out = lazy(x, edge_index)
    sized = ga.AttentionConv(known, 4, heads=2)
    sized.load_state_dict(lazy.state_dict())
    assert_close(out, sized(x, edge_index))
    for lin in (lazy.lin_query, lazy.lin_key, lazy.lin_value):  # initialised as nn.MultiheadAttention does
        assert torch.all(lin.bias == 0)
        bound = (6 / sum(lin.weight.shape)) ** 0.5  # Xavier-uniform
        assert lin.weight.abs().max() <= bound
    wrong = x[1][:, :2] if isinstance(x, tuple) else x[:, :2]
    with pytest.raises(ValueError, match=r"Expected 'x_q' to have shape \(n, \d+\)"):
        lazy((x[0], wrong) if len(widths) == 2 else wrong if len(widths) == 1 else (*x[:2], wrong), edge_index)


def test_attention_conv_lazy_sizes_work_in_to_hetero_and_load_a_state_dict():
    from torch_geometric.nn import to_hetero

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = ga.AttentionConv((-1, -1), 8, heads=2)

        def forward(self, x, edge_index):
            return self.conv(x, edge_index)

    metadata = (["a", "b"], [("a", "to", "b"), ("b", "to", "a")])
    model = to_hetero(Net(), metadata, aggr="sum")
    x = {"a": torch.randn(4, 3), "b": torch.randn(5, 7)}
    edges = {("a", "to", "b"): torch.tensor([[0, 1, 3], [4, 0, 2]]), ("b", "to", "a"): torch.tensor([[0, 4], [1, 3]])}
    out = model(x, edges)
    assert out["a"].shape == (4, 8) and out["b"].shape == (5, 8)
    lazy = ga.AttentionConv(-1, 8, heads=2)
    lazy.load_state_dict(ga.AttentionConv(6, 8, heads=2).state_dict())  # PyG's Linear materialises on load
    assert lazy.lin_key.weight.shape == (8, 6)


def test_attention_conv_refuses_other_negative_sizes_and_a_lazy_conversion_names_in_channels():
    with pytest.raises(ValueError, match=r"Expected 'in_channels' to be positive sizes, or -1"):
        ga.AttentionConv((-2, 3), 4)
    with pytest.raises(ValueError, match=r"Expected 'in_channels' to be known sizes.*call the layer once"):
        ga.AttentionConv(-1, 4).to_multihead_attention()


# -- TransformerConv: inputs named before torch's matmul ---------------------------------------------


def test_transformer_conv_edge_attr_of_another_dtype_is_refused_naming_edge_attr():
    conv = ga.TransformerConv(6, 4, heads=2, edge_dim=3)
    x, edge_index = torch.randn(5, 6), torch.tensor([[0, 1, 2], [1, 2, 0]])
    with pytest.raises(TypeError, match=r"^Expected 'edge_attr' to be of the layer's dtype torch.float32 "
                                        r"\(got torch.float64\)"):
        conv(x, edge_index, torch.randn(3, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"^Expected 'edge_attr' to be of shape \(n, 3\) \(got shape \(3, 2\)\)"):
        conv(x, edge_index, torch.randn(3, 2))


@pytest.mark.parametrize("impl", ["auto", "message_passing"])
def test_transformer_conv_features_of_the_wrong_width_or_swapped_pairs_name_the_argument(impl):
    conv = ga.TransformerConv(6, 4, heads=2, impl=impl)
    edge_index = torch.tensor([[0, 1, 2], [1, 2, 0]])
    with pytest.raises(ValueError, match=r"^Expected 'x' to be of shape \(n, 6\) \(got shape \(5, 5\)\)$"):
        conv(torch.randn(5, 5), edge_index)
    bipartite = ga.TransformerConv((3, 7), 4, heads=2, impl=impl)
    x_src, x_dst = torch.randn(5, 3), torch.randn(4, 7)
    assert bipartite((x_src, x_dst), edge_index).shape == (4, 8)
    with pytest.raises(ValueError, match=r"^Expected 'x_src' to be of shape \(n, 3\) \(got shape \(4, 7\)\); "
                                         r"a pair is \(x_src, x_dst\): sources \(keys\) first"):
        bipartite((x_dst, x_src), edge_index)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), 1e38], ids=["nan", "inf", "-inf", "huge"])
def test_transformer_conv_non_finite_edge_attr_gives_pygs_result_nan_only_in_the_affected_rows(bad):
    ref = PyGTransformerConv(6, 4, heads=2, edge_dim=3)
    ours = ga.TransformerConv.from_transformer_conv(ref)  # the fast path
    x = torch.randn(5, 6)
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 1], [0, 1, 2, 3, 0, 2]])
    edge_attr = torch.randn(6, 3)
    edge_attr[1, 0] = bad  # edge 1 -> 1: only target 1 reads it
    out, (_, alpha) = ours(x, edge_index, edge_attr, return_attention_weights=True)
    out_r, (_, alpha_r) = ref(x, edge_index, edge_attr, return_attention_weights=True)
    assert torch.equal(torch.isfinite(out), torch.isfinite(out_r))
    assert torch.isfinite(out[[0, 2, 3, 4]]).all()
    torch.testing.assert_close(out, out_r, equal_nan=True)
    torch.testing.assert_close(alpha, alpha_r, equal_nan=True)
