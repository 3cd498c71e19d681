"""The analysis functions against known answers on hand-made graphs, dense torch products,
numpy linear solves and networkx."""

import networkx as nx
import numpy as np
import pytest
import torch
from conftest import assert_close

from graphattn import analysis
from graphattn.graphs import dense_to_edge_weights, mask_to_edge_index


def _causal_weights(heads, n, generator=None):
    """Random causal attention as dense (H, N, N) weights and as (edge_index (2, E), alpha (E, H))."""
    mask = torch.tril(torch.ones(n, n, dtype=torch.bool))
    scores = torch.randn(heads, n, n, dtype=torch.float64, generator=generator)
    dense = scores.masked_fill(~mask, float("-inf")).softmax(-1)  # (H, N, N)
    edge_index = mask_to_edge_index(mask)  # (2, E)
    alpha = dense_to_edge_weights(dense, edge_index)  # (E, H)
    return dense, edge_index, alpha


# ---------------------------------------------------------------------------- to_networkx


def test_to_networkx_keeps_isolated_nodes_zero_weights_and_tokens():
    """Known answers: every node kept, zero-weight edges kept, Python float weights, tokens stored."""
    edge_index = torch.tensor([[0, 1, 0], [0, 1, 1]])  # node 2 has no edges
    alpha = torch.tensor([[1.0, 1.0], [0.0, 1.0], [1.0, 0.0]])  # (E, H); edge 1 -> 1 has weight 0 in head 0
    g = analysis.to_networkx(edge_index, alpha, tokens=["a", "b", "c"], head=0)
    assert sorted(g.nodes) == [0, 1, 2] and g.degree(2) == 0
    assert g[1][1]["weight"] == 0.0  # an edge of weight exactly 0 is still an edge
    assert g[0][1]["weight"] == 1.0 and type(g[0][1]["weight"]) is float
    assert nx.get_node_attributes(g, "token") == {0: "a", 1: "b", 2: "c"}
    mean = analysis.to_networkx(edge_index, alpha, num_nodes=4)
    assert mean.number_of_nodes() == 4 and mean[1][1]["weight"] == 0.5 and mean.graph["head"] == "mean"


def test_to_networkx_direction_and_duplicates():
    """Known answers: edges point key j -> query i; duplicate edges are summed."""
    edge_index = torch.tensor([[2, 2, 0], [0, 0, 1]])  # key 2 -> query 0 twice
    g = analysis.to_networkx(edge_index, torch.tensor([0.25, 0.5, 1.0]))
    assert set(g.edges) == {(2, 0), (0, 1)}  # edges point from key j to query i
    assert g[2][0]["weight"] == 0.75


def test_to_networkx_graphml_round_trip(tmp_path):
    """Reference: networkx's GraphML reader gives back the nodes, tokens and the dense weights."""
    dense, edge_index, alpha = _causal_weights(2, 5)
    g = analysis.to_networkx(edge_index, alpha, tokens=["[CLS]", "the", "cat", "sat", "[SEP]"], head=1)
    path = tmp_path / "attention.graphml"
    nx.write_graphml(g, path)
    back = nx.read_graphml(path, node_type=int)
    assert sorted(back.nodes) == list(range(5)) and back.nodes[0]["token"] == "[CLS]"
    for j, i, w in g.edges(data="weight"):
        assert back[j][i]["weight"] == pytest.approx(w, abs=1e-12)
        assert w == pytest.approx(float(dense[1, i, j]), abs=1e-12)


def test_to_networkx_errors():
    """Refusals in validate's template: shapes, lengths, ranges, NaN, negative weights, lists."""
    edge_index = torch.tensor([[0, 1], [1, 1]])
    with pytest.raises(ValueError, match="'alpha'"):
        analysis.to_networkx(edge_index, torch.ones(3))
    with pytest.raises(ValueError, match="'tokens'"):
        analysis.to_networkx(edge_index, torch.ones(2), tokens=["a"], num_nodes=2)
    with pytest.raises(IndexError):
        analysis.to_networkx(edge_index, torch.ones(2), num_nodes=1)
    with pytest.raises(IndexError, match="'head'"):
        analysis.to_networkx(edge_index, torch.ones(2, 2), head=2)
    with pytest.raises(ValueError, match=r"'alpha' to be finite attention weights \(got 1 NaN or inf\)"):
        analysis.to_networkx(edge_index, torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match="'alpha' to be non-negative attention weights"):
        analysis.to_networkx(edge_index, torch.tensor([1.0, -0.5]))
    with pytest.raises(TypeError, match="'edge_index' to be a LongTensor of shape"):
        analysis.to_networkx([[0, 1], [1, 1]], torch.ones(2))
    with pytest.raises(TypeError, match="'alpha' to be a floating-point Tensor"):
        analysis.to_networkx(edge_index, torch.ones(2, dtype=torch.long))


# ---------------------------------------------------------------------------- hubs


def test_attention_received_is_column_sum():
    """Reference: the column sums of the dense head-averaged weights; N queries give N in all."""
    dense, edge_index, alpha = _causal_weights(3, 6)
    got = analysis.attention_received(analysis.to_networkx(edge_index, alpha))
    expected = dense.mean(0).sum(0)  # sum over queries i of the head-averaged weights, per key j
    assert got == pytest.approx({j: float(expected[j]) for j in range(6)}, abs=1e-12)
    assert sum(got.values()) == pytest.approx(6.0)


@pytest.mark.parametrize("n", [2, 5, 11], ids=lambda n: f"N{n}")
def test_pagerank_of_a_star(n):
    """Known answer (closed form) for a star where every query reads token 0."""
    # every query attends only to token 0: the walker always steps to 0, so
    # p_0 = (1 - d) / N + d and every leaf gets only the teleport share (1 - d) / N
    star = analysis.to_networkx(torch.stack([torch.zeros(n, dtype=torch.long), torch.arange(n)]), torch.ones(n))
    ranks = analysis.attention_pagerank(star)
    d = 0.85
    assert ranks[0] == pytest.approx((1 - d) / n + d, abs=1e-9)
    for leaf in range(1, n):
        assert ranks[leaf] == pytest.approx((1 - d) / n, abs=1e-9)


def test_pagerank_matches_linear_solve():
    """Reference: numpy's solve of (I - d P^T) x = (1 - d) / N for the row-stochastic P."""
    dense, edge_index, alpha = _causal_weights(1, 7)
    P = dense[0].numpy()  # (N, N) row-stochastic: query i -> key j with probability alpha_ij
    d, n = 0.6, 7
    expected = np.linalg.solve(np.eye(n) - d * P.T, np.full(n, (1 - d) / n))
    got = analysis.attention_pagerank(analysis.to_networkx(edge_index, alpha), alpha=d)
    np.testing.assert_allclose([got[k] for k in range(n)], expected, atol=1e-9)


# ---------------------------------------------------------------------------- rollout and flow


def _rownorm_residual(a):
    a = 0.5 * (a + torch.eye(a.size(-1), dtype=a.dtype))
    return a / a.sum(-1, keepdim=True)


def test_rollout_single_layer_is_residual_average():
    """Reference: 0.5 A + 0.5 I on the dense head average (rows of A already sum to 1)."""
    dense, edge_index, alpha = _causal_weights(4, 6)
    got = analysis.attention_rollout(edge_index, [alpha])
    assert got.is_sparse
    assert_close(got.to_dense(), 0.5 * dense.mean(0) + 0.5 * torch.eye(6, dtype=torch.float64))


def test_rollout_product_over_layers_and_per_layer_graphs():
    """Reference: Abnar and Zuidema's product of row-normalised (A + I) / 2, in dense torch."""
    g = torch.Generator().manual_seed(1)
    layers = [_causal_weights(3, 5, g) for _ in range(3)]
    expected = torch.eye(5, dtype=torch.float64)
    for dense, _, _ in layers:
        expected = _rownorm_residual(dense.mean(0)) @ expected
    got = analysis.attention_rollout([ei for _, ei, _ in layers], [a for _, _, a in layers])
    assert_close(got.to_dense(), expected)
    assert_close(got.to_dense().sum(1), torch.ones(5, dtype=torch.float64))
    stacked = analysis.attention_rollout(layers[0][1], torch.stack([a for _, _, a in layers]))
    assert_close(stacked.to_dense(), expected)  # same edges every layer: one edge_index shared
    plain = analysis.attention_rollout(layers[0][1], [a for _, _, a in layers], residual=False)
    assert_close(plain.to_dense(), layers[2][0].mean(0) @ layers[1][0].mean(0) @ layers[0][0].mean(0))


def test_rollout_query_without_edges_keeps_itself():
    """Known answer: a query with no edge keeps only its residual (row = e_i)."""
    edge_index = torch.tensor([[0, 0], [0, 1]])  # node 2 reads nothing
    got = analysis.attention_rollout(edge_index, [torch.ones(2)], num_nodes=3).to_dense()
    assert_close(got, torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [0, 0, 1.0]]), dtype=torch.float32)


def test_flow_on_a_tiny_graph():
    """Known answer: max-flows of a two-layer, two-token graph worked out by hand (below)."""
    # two layers, N = 2, rows = queries:  A1 = [[1, 0], [.5, .5]],  A2 = [[.5, .5], [0, 1]]
    edge_index = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 0]])  # edges (j, i): 0->0, 0->1, 1->1, 1->0
    a1 = torch.tensor([1.0, 0.5, 0.5, 0.0])
    a2 = torch.tensor([0.5, 0.0, 1.0, 0.5])
    raw = analysis.attention_flow(edge_index, [a1, a2], residual=False, normalize=False)
    # to output 0: from input 0 via (1,0) min(1, .5) + via (1,1) min(.5, .5) = 1; from input 1 via (1,1): .5
    # to output 1: only through (1,1) (A2[1,0] = 0), capacity 1 then; from input 0: .5, from input 1: .5
    assert_close(raw, torch.tensor([[1.0, 0.5], [0.5, 0.5]], dtype=torch.float64))
    norm = analysis.attention_flow(edge_index, [a1, a2], residual=False)
    assert_close(norm, torch.tensor([[2 / 3, 1 / 3], [0.5, 0.5]], dtype=torch.float64))
    # rollout multiplies along paths instead: row 0 is A2 A1 [0] = [.75, .25]
    roll = analysis.attention_rollout(edge_index, [a1, a2], residual=False).to_dense()
    assert_close(roll, torch.tensor([[0.75, 0.25], [0.5, 0.5]]), dtype=torch.float32)


def test_flow_single_layer_equals_rollout():
    """Known identity: with one layer each path is one edge, so max-flow = capacity = rollout."""
    dense, edge_index, alpha = _causal_weights(2, 5)
    flow = analysis.attention_flow(edge_index, [alpha])
    assert_close(flow, analysis.attention_rollout(edge_index, [alpha]).to_dense())


def test_flow_refuses_long_inputs():
    """Known refusal above max_nodes, naming it."""
    edge_index = mask_to_edge_index(torch.ones(40, 40, dtype=torch.bool))
    with pytest.raises(ValueError, match="'max_nodes' = 32"):
        analysis.attention_flow(edge_index, [torch.full((1600,), 1 / 40)])


# ---------------------------------------------------------------------------- per-head summaries


def test_self_share_and_distance_against_dense():
    """Reference: the dense diagonal mean and the dense sum of alpha_ij |i - j|."""
    g = torch.Generator().manual_seed(2)
    layers = [_causal_weights(3, 6, g) for _ in range(2)]
    edge_index = layers[0][1]
    alpha = torch.stack([a for _, _, a in layers])  # (layers, E, H)
    dense = torch.stack([d for d, _, _ in layers])  # (layers, H, N, N)
    share = analysis.self_share(edge_index, alpha)
    assert share.shape == (2, 3)
    assert_close(share, dense.diagonal(dim1=-2, dim2=-1).mean(-1))
    pos = torch.arange(6, dtype=torch.float64)
    dist = (pos[:, None] - pos[None, :]).abs()  # (N, N) |i - j|
    assert_close(analysis.mean_attention_distance(edge_index, alpha), (dense * dist).sum(-1).mean(-1))


def test_self_share_and_distance_known_answers():
    """Known answers: self-loops only share 1 and distance 0; everyone reading token 0."""
    n = 4
    identity = torch.arange(n).repeat(2, 1)  # only self-loops
    assert analysis.self_share(identity, torch.ones(n, 1)).item() == 1.0
    assert analysis.mean_attention_distance(identity, torch.ones(n, 1)).item() == 0.0
    first = torch.stack([torch.zeros(n, dtype=torch.long), torch.arange(n)])  # everyone reads token 0
    assert analysis.self_share(first, torch.ones(n, 1)).item() == pytest.approx(1 / n)
    assert analysis.mean_attention_distance(first, torch.ones(n, 1)).item() == pytest.approx((0 + 1 + 2 + 3) / n)
    with pytest.raises(ValueError, match="'alpha'"):
        analysis.self_share(first, torch.ones(n + 1, 1))


def test_mean_cosine_similarity_known_answers():
    """Known answers (parallel, orthogonal, opposite) and a loop over F.cosine_similarity pairs."""
    assert analysis.mean_cosine_similarity(torch.ones(4, 3)) == pytest.approx(1.0)
    assert analysis.mean_cosine_similarity(torch.eye(5)) == pytest.approx(0.0)
    assert analysis.mean_cosine_similarity(torch.tensor([[1.0, 2.0], [-1.0, -2.0]])) == pytest.approx(-1.0)
    x = torch.randn(7, 5, dtype=torch.float64)
    pairs = [
        torch.nn.functional.cosine_similarity(x[i], x[j], dim=0).item() for i in range(7) for j in range(7) if i != j
    ]
    assert analysis.mean_cosine_similarity(x) == pytest.approx(float(np.mean(pairs)), abs=1e-12)
    with pytest.raises(ValueError, match="zero rows"):
        analysis.mean_cosine_similarity(torch.tensor([[1.0, 0.0], [0.0, 0.0]]))
    with pytest.raises(ValueError, match="N >= 2"):
        analysis.mean_cosine_similarity(torch.ones(1, 3))
    with pytest.raises(ValueError, match="'x' to be finite"):
        analysis.mean_cosine_similarity(torch.tensor([[1.0, float("inf")], [1.0, 0.0]]))
    # rows near the ends of the float64 range: the same directions, the same answer (no overflow to 0)
    huge = torch.tensor([[1e300, 1e300], [3e300, 0.0]], dtype=torch.float64)
    tiny = torch.tensor([[1e-300, 1e-300], [3e-300, 0.0]], dtype=torch.float64)
    assert analysis.mean_cosine_similarity(huge) == analysis.mean_cosine_similarity(tiny) == pytest.approx(0.5**0.5)


def test_smoothing_per_layer():
    """Known answers per layer: orthogonal 0, 45 degrees 1/sqrt(2), identical 1."""
    states = [torch.eye(4), torch.tensor([[1.0, 0.0], [1.0, 1.0]]), torch.ones(3, 5)]
    assert analysis.smoothing_per_layer(states) == pytest.approx([0.0, 1 / 2**0.5, 1.0])


def test_rollout_and_flow_refuse_bad_layers_naming_them():
    """Refusals name the layer: nested lists, out-of-range edges, inf weights, flags that are not bools."""
    edge_index = torch.tensor([[0, 0, 1], [0, 1, 1]])
    alpha = torch.tensor([1.0, 0.5, 0.5])
    with pytest.raises(TypeError, match="'edge_index' to be a LongTensor \\(2, E\\) or a sequence of them"):
        analysis.attention_rollout([[0, 0, 1], [0, 1, 1]], [alpha])
    with pytest.raises(IndexError, match=r"'edge_index\[1\]\[0\]' to be sources < S = 2 key nodes \(got 2\)"):
        analysis.attention_rollout([edge_index, torch.tensor([[0, 0, 2], [0, 1, 1]])], [alpha, alpha])
    with pytest.raises(ValueError, match=r"'alphas\[1\]' to be finite attention weights"):
        analysis.attention_flow(edge_index, [alpha, torch.tensor([1.0, float("inf"), 0.5])])
    with pytest.raises(TypeError, match="'residual' to be a bool"):
        analysis.attention_rollout(edge_index, [alpha], residual=1)
    with pytest.raises(ValueError, match="'alphas' to be at least one layer"):
        analysis.attention_rollout(edge_index, [])


@pytest.mark.parametrize("damping", [0.0, 1.0, -0.5, 1.5, float("nan")])
def test_pagerank_refuses_a_damping_outside_zero_one(damping):
    """Known refusal: networkx would return ranks that are not a damped walk (or loop) outside (0, 1)."""
    graph = analysis.to_networkx(torch.tensor([[0, 0], [0, 1]]), torch.ones(2))
    with pytest.raises(ValueError, match=r"'alpha' to be a finite float in \(0.0, 1.0\)"):
        analysis.attention_pagerank(graph, alpha=damping)


def test_hub_functions_refuse_graphs_they_cannot_read():
    """Refusals: an undirected graph (direction is the meaning), negative or NaN edge weights."""
    with pytest.raises(TypeError, match="'graph' to be a networkx.DiGraph"):
        analysis.attention_received(nx.Graph([(0, 1)]))
    with pytest.raises(ValueError, match=r"'graph' to be edges whose 'weight' is a finite non-negative number"):
        analysis.attention_pagerank(nx.DiGraph([(0, 1, {"weight": float("nan")})]))
