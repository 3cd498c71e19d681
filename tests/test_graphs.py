"""Mask <-> edge-list conversions, validation and batching, against independent constructions."""

import pytest
import torch

from graphattn import graphs


@pytest.mark.parametrize("L,S", [(1, 1), (5, 5), (7, 3), (2, 11)])
def test_mask_edge_index_round_trip(L, S):
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
    with pytest.raises(TypeError, match="True means may attend"):
        graphs.mask_to_edge_index(torch.ones(3, 3))


@pytest.mark.parametrize(
    "edge_index,exc,match",
    [
        (torch.zeros(3, 4, dtype=torch.long), ValueError, r"shape \(2, E\) \(got \(3, 4\)\)"),
        (torch.zeros(2, 4), TypeError, "integer dtype"),
        (torch.tensor([[0, -1], [0, 0]]), IndexError, "non-negative"),
        (torch.tensor([[0, 5], [0, 0]]), IndexError, "S = 3"),
        (torch.tensor([[0, 0], [0, 4]]), IndexError, "L = 4"),
    ],
    ids=["shape", "dtype", "negative", "source-range", "target-range"],
)
def test_check_edge_index_errors(edge_index, exc, match):
    with pytest.raises(exc, match=match):
        graphs.check_edge_index(edge_index, 3, 4)


def test_batch_sequences_is_block_diagonal():
    lengths = [3, 1, 4, 0, 2]
    edge_index, batch = graphs.batch_sequences(lengths)
    n = sum(lengths)
    block = torch.block_diag(*[torch.ones(m, m, dtype=torch.bool) for m in lengths if m])
    assert torch.equal(graphs.edge_index_to_mask(edge_index, n), block)
    assert batch.tolist() == [b for b, m in enumerate(lengths) for _ in range(m)]


def test_batch_sequences_rejects_bad_lengths():
    with pytest.raises(ValueError, match="lengths"):
        graphs.batch_sequences([2, -1])


def test_padded_round_trip():
    lengths = [3, 1, 2]
    x = torch.randn(3, 4, 5)
    nodes, batch = graphs.padded_to_nodes(x, lengths)
    assert torch.equal(nodes, torch.cat([x[0, :3], x[1, :1], x[2, :2]]))
    padded, valid = graphs.nodes_to_padded(nodes, batch, max_length=4)
    assert torch.equal(valid, torch.arange(4) < torch.tensor(lengths)[:, None])
    assert torch.equal(padded[valid], nodes) and torch.equal(padded[~valid], torch.zeros(6, 5))


def test_padded_to_nodes_checks_lengths():
    with pytest.raises(ValueError, match="B = len"):
        graphs.padded_to_nodes(torch.randn(2, 4, 3), [1, 2, 3])
    with pytest.raises(ValueError, match="T = 4"):
        graphs.padded_to_nodes(torch.randn(2, 4, 3), [1, 5])


def test_integer_likes_are_accepted_and_other_types_refused():
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
