"""examples/minibatch.py: NeighborLoader's sampled-subgraph layout, training on it, and seeds' outputs
on full 2-hop samples against full-graph inference (reference: ``torch_geometric.utils.k_hop_subgraph``
for the sampled nodes and edges, the full-graph forward for the outputs)."""

import importlib.util
import re
from pathlib import Path

import pytest
import torch
from torch_geometric.utils import k_hop_subgraph, sort_edge_index

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("minibatch_example", EXAMPLES / "minibatch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _graph(N=60, E=240, seed=0):
    g = torch.Generator().manual_seed(seed)
    edge_index = sort_edge_index(torch.randint(0, N, (2, E), generator=g), sort_by_row=False)  # by target
    ptr = torch.nn.functional.pad(torch.bincount(edge_index[1], minlength=N).cumsum(0), (1, 0))
    return edge_index, ptr, torch.randn(N, 3, generator=g), torch.randint(0, 2, (N,), generator=g)


def test_full_sample_is_the_two_hop_in_neighbourhood(example):
    edge_index, ptr, x, y = _graph()
    seeds = torch.tensor([5, 17, 3])
    batch = example.sample(seeds, ptr, edge_index[0], [-1, -1], x, y)
    assert batch.batch_size == 3 and torch.equal(batch.n_id[:3], seeds)
    assert batch.n_id.unique().numel() == batch.n_id.numel()
    subset, _, _, _ = k_hop_subgraph(seeds, 2, edge_index, flow="source_to_target")
    assert torch.equal(batch.n_id.sort().values, subset)
    assert torch.equal(batch.n_id[batch.edge_index], edge_index[:, batch.e_id])  # local ids of real edges
    one_hop, _, _, _ = k_hop_subgraph(seeds, 1, edge_index, flow="source_to_target")
    into = torch.isin(edge_index[1], one_hop).nonzero().flatten()  # every edge into a node within one hop
    assert torch.equal(batch.e_id.sort().values, into)
    assert torch.equal(batch.x, x[batch.n_id]) and torch.equal(batch.y, y[batch.n_id])


def test_fanout_samples_without_replacement(example):
    edge_index, ptr, x, y = _graph(E=600)
    g = torch.Generator().manual_seed(1)
    batch = example.sample(torch.tensor([0, 1, 2, 3]), ptr, edge_index[0], [2, 3], x, y, g)
    assert batch.e_id.unique().numel() == batch.e_id.numel()
    indeg = torch.bincount(batch.edge_index[1], minlength=batch.n_id.numel())
    assert bool((indeg[:4] == torch.minimum(ptr[1:5] - ptr[:4], torch.tensor(2))).all())
    assert int(indeg[4:].max()) <= 3


def test_training_on_samples_and_full_samples_equal_the_full_graph(example, capsys):
    assert example.main(["--nodes", "400", "--epochs", "2", "--batch-size", "64", "--dtype", "float64"]) == 0
    out = capsys.readouterr().out
    losses = [float(v) for v in re.findall(r"loss (\d+\.\d+)", out)]
    assert len(losses) == 2 and losses[1] < losses[0]
    assert 0.0 <= float(re.search(r"test accuracy (\d\.\d+)", out).group(1)) <= 1.0
    assert float(re.search(r"max \|diff\| (\S+)", out).group(1)) < 1e-10
