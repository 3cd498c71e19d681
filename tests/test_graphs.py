"""Mask <-> edge-list <-> dense-weight conversions, validation and batching, against independent
constructions: Python loops over pairs, torch.block_diag, explicit slicing, known answers."""

import pytest
import torch

from graphattn import graphs


@pytest.mark.parametrize("L,S", [(1, 1), (5, 5), (7, 3), (2, 11)])
def test_mask_edge_index_round_trip(L, S):
    """Reference: the Python loop over pairs (j, i) with mask[i, j]; sorted by target, then source."""
    mask = torch.rand(L, S) < 0.5
    edge_index = graphs.mask_to_edge_index(mask)
    assert edge_index.shape == (2, int(mask.sum()))
    expected = sorted((j, i) for i in range(L) for j in range(S) if mask[i, j])
    got = sorted(zip(edge_index[0].tolist(), edge_index[1].tolist()))
    assert got == expected
    key = edge_index[1] * S + edge_index[0]
    assert torch.equal(key, key.sort().values)  # sorted by target, then source
    assert torch.equal(graphs.edge_index_to_mask(edge_index, (S, L)), mask)


def test_float_mask_is_refused_with_the_polarity():
    """Known refusal: a float mask is ambiguous, the message states the polarity."""
    with pytest.raises(TypeError, match="True means may attend"):
        graphs.mask_to_edge_index(torch.ones(3, 3))


@pytest.mark.parametrize(
    "edge_index,exc,match",
    [
        (torch.zeros(3, 4, dtype=torch.long), ValueError, r"shape \(2, E\) \(got \(3, 4\)\)"),
        (torch.zeros(2, 4), TypeError, "dtype int64 or int32"),
        (torch.tensor([[0, -1], [0, 0]]), IndexError, "non-negative"),
        (torch.tensor([[0, 5], [0, 0]]), IndexError, "S = 3"),
        (torch.tensor([[0, 0], [0, 4]]), IndexError, "L = 4"),
    ],
    ids=["shape", "dtype", "negative", "source-range", "target-range"],
)
def test_check_edge_index_errors(edge_index, exc, match):
    """Each malformed edge list gives its documented type and names the bad row."""
    with pytest.raises(exc, match=match):
        graphs.check_edge_index(edge_index, 3, 4)


def test_batch_sequences_is_block_diagonal():
    """Reference: torch.block_diag of one complete graph per sequence (an empty one included)."""
    lengths = [3, 1, 4, 0, 2]
    edge_index, batch = graphs.batch_sequences(lengths)
    n = sum(lengths)
    block = torch.block_diag(*[torch.ones(m, m, dtype=torch.bool) for m in lengths if m])
    assert torch.equal(graphs.edge_index_to_mask(edge_index, n), block)
    assert batch.tolist() == [b for b, m in enumerate(lengths) for _ in range(m)]


def test_batch_sequences_rejects_bad_lengths():
    """Known refusal: a negative length."""
    with pytest.raises(ValueError, match="lengths"):
        graphs.batch_sequences([2, -1])


def test_padded_round_trip():
    """Reference: the valid rows sliced by hand; padding comes back as zeros."""
    lengths = [3, 1, 2]
    x = torch.randn(3, 4, 5)
    nodes, batch = graphs.padded_to_nodes(x, lengths)
    assert torch.equal(nodes, torch.cat([x[0, :3], x[1, :1], x[2, :2]]))
    padded, valid = graphs.nodes_to_padded(nodes, batch, max_length=4)
    assert torch.equal(valid, torch.arange(4) < torch.tensor(lengths)[:, None])
    assert torch.equal(padded[valid], nodes) and torch.equal(padded[~valid], torch.zeros(6, 5))


def test_padded_to_nodes_checks_lengths():
    """Known refusals: one length per row, none longer than T."""
    with pytest.raises(ValueError, match="B = len"):
        graphs.padded_to_nodes(torch.randn(2, 4, 3), [1, 2, 3])
    with pytest.raises(ValueError, match="T = 4"):
        graphs.padded_to_nodes(torch.randn(2, 4, 3), [1, 5])


def test_integer_likes_are_accepted_and_other_types_refused():
    """NumPy ints are ints; floats, a bare int and a string are refused naming the argument."""
    import numpy as np

    edge_index, batch = graphs.batch_sequences(np.array([2, 1]))
    assert edge_index.shape == (2, 5) and batch.tolist() == [0, 0, 1]
    assert graphs.edge_index_to_mask(torch.tensor([[0], [1]]), (np.int64(1), 2)).shape == (2, 1)
    with pytest.raises(TypeError, match="pair of ints"):
        graphs.edge_index_to_mask(torch.tensor([[0], [0]]), (1.7, 2.2))
    with pytest.raises(TypeError, match="'lengths' to be a sequence"):
        graphs.batch_sequences(3)
    with pytest.raises(TypeError, match="'pattern' to be a graphattn.patterns.Pattern"):
        graphs.batch_sequences([2], "causal")
    with pytest.raises(TypeError, match="'x' to be a Tensor"):
        graphs.padded_to_nodes([[1.0]], [1])


def test_edge_weights_to_dense_and_back_against_a_python_loop():
    """Reference: weights[h, i, j] = sum of alpha[e, h] over the edges e = (j, i), by a loop."""
    edge_index = torch.tensor([[0, 2, 2, 1], [1, 0, 0, 1]])  # (2, E) the edge 2 -> 0 twice
    alpha = torch.tensor([[0.5, 1.0], [0.25, 2.0], [0.5, 3.0], [1.0, 4.0]], dtype=torch.float64)  # (E, H)
    expected = torch.zeros(2, 2, 3, dtype=torch.float64)  # (H, L, S) L = 2 queries, S = 3 keys
    for e, (j, i) in enumerate(edge_index.T.tolist()):
        expected[:, i, j] += alpha[e]
    dense = graphs.edge_weights_to_dense(edge_index, alpha, (3, 2))
    assert torch.equal(dense, expected)
    assert torch.equal(graphs.edge_weights_to_dense(edge_index, alpha[:, 1], (3, 2)), expected[1])
    unique = graphs.mask_to_edge_index(expected[0] > 0)  # (2, 3) one edge per pair
    assert graphs.dense_to_edge_weights(dense, unique).tolist() == [[0.75, 5.0], [0.5, 1.0], [1.0, 4.0]]
    with pytest.raises(ValueError, match=r"'alpha' to be a Tensor of shape \(E,\) or \(E, H\) with E = 4"):
        graphs.edge_weights_to_dense(edge_index, alpha[:3], (3, 2))
    with pytest.raises(ValueError, match=r"'size' to be a dense \(H, L, S\) of at most"):
        graphs.edge_weights_to_dense(edge_index, alpha, (2**20, 2**20))


def test_sort_edge_index_keys_do_not_wrap_for_int32_edges():
    """Known answer where i * S + j exceeds 2**31 (int32 wraps) and 2**63 (int64 wraps):
    Python's sorted by (target, source, position) is the reference."""
    edges = [(5, 2**31 - 1), (3, 2**31 - 1), (7, 0), (3, 2**31 - 1)]
    expected = sorted(range(4), key=lambda e: (edges[e][1], edges[e][0], e))
    for dtype, num_sources in [(torch.int32, 2**31), (torch.int64, 2**62)]:
        edge_index = torch.tensor(edges, dtype=dtype).T
        got, perm = graphs.sort_edge_index(edge_index, num_sources)
        assert perm.tolist() == expected and got.dtype == dtype
        assert got.T.tolist() == [list(edges[e]) for e in expected]
    with pytest.raises(IndexError, match=r"'edge_index\[0\]' to be sources < S = 6 key nodes \(got 7\)"):
        graphs.sort_edge_index(torch.tensor(edges).T, 6)


def test_nodes_to_padded_unsorted_batch_and_trailing_empty_sequences():
    """Reference: node n at row batch[n], in its order among that row's nodes (a Python loop);
    lengths [1, 1, 0] keep their third, empty row with batch_size = 3."""
    batch = torch.tensor([2, 0, 2, 1, 0])
    x = torch.arange(1.0, 6.0).unsqueeze(1)  # (5, 1) node n holds n + 1
    padded, valid = graphs.nodes_to_padded(x, batch, batch_size=4)
    rows = [[float(n + 1) for n, b in enumerate(batch.tolist()) if b == r] for r in range(4)]
    assert padded[..., 0].tolist() == [r + [0.0] * (2 - len(r)) for r in rows]
    assert valid.tolist() == [[True, True], [True, False], [True, True], [False, False]]
    nodes, batch = graphs.padded_to_nodes(torch.randn(3, 2, 4), [1, 1, 0])
    assert graphs.nodes_to_padded(nodes, batch, batch_size=3)[0].shape == (3, 1, 4)
    with pytest.raises(ValueError, match=r"'max_length' to be >= the longest sequence, 2 nodes \(got 1\)"):
        graphs.nodes_to_padded(x, torch.tensor([0, 0, 1, 1, 2]), max_length=1)
    with pytest.raises(IndexError, match=r"'batch' to be sequence indices in \[0, 2\)"):
        graphs.nodes_to_padded(x, torch.tensor([0, 0, 1, 1, 2]), batch_size=2)
    with pytest.raises(TypeError, match="'batch' to be an integer Tensor"):
        graphs.nodes_to_padded(x, torch.zeros(5))
