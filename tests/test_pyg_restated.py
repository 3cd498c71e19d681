"""PyG's own layer tests restated with the import swapped: ``test/nn/conv/test_transformer_conv.py``,
``test_gat_conv.py`` and ``test_gatv2_conv.py`` (pyg-team/pytorch_geometric) against ``ga.TransformerConv``,
``ga.GATConv`` and ``ga.GATv2Conv``.

Every assertion of PyG's test is kept, in PyG's order and with PyG's tolerances (``str(conv)``, shapes,
``conv._alpha is None``, the sparse adjacency forms, bipartite inputs, ``(x, None)`` with ``size``,
``edge_dim`` with ``fill_value``, the empty graph). Each case also compares the numbers with PyG's layer
holding the same weights (PyG's tests only check shapes there).

Excepted, as documented:

- the TorchScript blocks (``conv.jittable(...)`` + ``torch.jit.script``, run by PyG only under
  ``is_full_test()``): graphattn's layers refuse TorchScript with a clear error (use ``torch.compile`` or
  ``torch.export``; ``tests/test_compile.py``);
- the ``torch_sparse.SparseTensor`` blocks run only where ``torch_sparse`` is installed, as in PyG
  (``torch_geometric.typing.WITH_TORCH_SPARSE``);
- ``@withCUDA`` runs on the CPU here.
"""

import pytest
import torch
import torch_geometric.typing
from torch_geometric.nn import GATConv as PyGGATConv
from torch_geometric.nn import GATv2Conv as PyGGATv2Conv
from torch_geometric.nn import TransformerConv as PyGTransformerConv
from torch_geometric.typing import SparseTensor
from torch_geometric.utils import to_torch_csc_tensor

import graphattn as ga

WITH_TORCH_SPARSE = torch_geometric.typing.WITH_TORCH_SPARSE


def twin(ours, ref_cls, *args, **kwargs):
    """PyG's layer with ``ours``'s weights."""
    ref = ref_cls(*args, **kwargs)
    ref.load_state_dict(ours.state_dict())
    return ref


# -- test/nn/conv/test_transformer_conv.py ---------------------------------------------------------


def test_transformer_conv():
    x1 = torch.randn(4, 8)
    x2 = torch.randn(2, 16)
    edge_index = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1]])
    adj1 = to_torch_csc_tensor(edge_index, size=(4, 4))

    conv = ga.TransformerConv(8, 32, heads=2, beta=True)
    assert str(conv) == "TransformerConv(8, 32, heads=2)"

    out = conv(x1, edge_index)
    assert out.size() == (4, 64)
    assert torch.allclose(conv(x1, adj1.t()), out, atol=1e-6)
    assert torch.allclose(twin(conv, PyGTransformerConv, 8, 32, heads=2, beta=True)(x1, edge_index), out, atol=1e-6)

    if WITH_TORCH_SPARSE:
        adj2 = SparseTensor.from_edge_index(edge_index, sparse_sizes=(4, 4))
        assert torch.allclose(conv(x1, adj2.t()), out, atol=1e-6)

    # Test `return_attention_weights`.
    result = conv(x1, edge_index, return_attention_weights=True)
    assert torch.allclose(result[0], out)
    assert result[1][0].size() == (2, 4)
    assert result[1][1].size() == (4, 2)
    assert result[1][1].min() >= 0 and result[1][1].max() <= 1
    assert conv._alpha is None

    if WITH_TORCH_SPARSE:
        result = conv(x1, adj2.t(), return_attention_weights=True)
        assert torch.allclose(result[0], out, atol=1e-6)
        assert result[1].sizes() == [4, 4, 2] and result[1].nnz() == 4
        assert conv._alpha is None

    # Test bipartite message passing:
    adj1 = to_torch_csc_tensor(edge_index, size=(4, 2))

    conv = ga.TransformerConv((8, 16), 32, heads=2, beta=True)
    assert str(conv) == "TransformerConv((8, 16), 32, heads=2)"

    out = conv((x1, x2), edge_index)
    assert out.size() == (2, 64)
    assert torch.allclose(conv((x1, x2), adj1.t()), out, atol=1e-6)
    ref = twin(conv, PyGTransformerConv, (8, 16), 32, heads=2, beta=True)
    assert torch.allclose(ref((x1, x2), edge_index), out, atol=1e-6)

    if WITH_TORCH_SPARSE:
        adj2 = SparseTensor.from_edge_index(edge_index, sparse_sizes=(4, 2))
        assert torch.allclose(conv((x1, x2), adj2.t()), out, atol=1e-6)


# -- test/nn/conv/test_gat_conv.py -----------------------------------------------------------------


def test_gat_conv():
    x1 = torch.randn(4, 8)
    x2 = torch.randn(2, 16)
    edge_index = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1]])
    adj1 = to_torch_csc_tensor(edge_index, size=(4, 4))

    conv = ga.GATConv(8, 32, heads=2)
    assert str(conv) == "GATConv(8, 32, heads=2)"
    out = conv(x1, edge_index)
    assert out.size() == (4, 64)
    assert torch.allclose(conv(x1, edge_index, size=(4, 4)), out)
    assert torch.allclose(conv(x1, adj1.t()), out, atol=1e-6)
    assert torch.allclose(twin(conv, PyGGATConv, 8, 32, heads=2)(x1, edge_index), out, atol=1e-6)

    if WITH_TORCH_SPARSE:
        adj2 = SparseTensor.from_edge_index(edge_index, sparse_sizes=(4, 4))
        assert torch.allclose(conv(x1, adj2.t()), out, atol=1e-6)

    # Test `return_attention_weights`.
    result = conv(x1, edge_index, return_attention_weights=True)
    assert torch.allclose(result[0], out)
    assert result[1][0].size() == (2, 7)
    assert result[1][1].size() == (7, 2)
    assert result[1][1].min() >= 0 and result[1][1].max() <= 1

    result = conv(x1, adj1.t(), return_attention_weights=True)
    assert torch.allclose(result[0], out, atol=1e-6)
    assert result[1][0].size() == torch.Size([4, 4, 2])
    assert result[1][0]._nnz() == 7

    if WITH_TORCH_SPARSE:
        result = conv(x1, adj2.t(), return_attention_weights=True)
        assert torch.allclose(result[0], out, atol=1e-6)
        assert result[1].sizes() == [4, 4, 2] and result[1].nnz() == 7

    # Test bipartite message passing:
    adj1 = to_torch_csc_tensor(edge_index, size=(4, 2))

    conv = ga.GATConv((8, 16), 32, heads=2)
    assert str(conv) == "GATConv((8, 16), 32, heads=2)"

    out1 = conv((x1, x2), edge_index)
    assert out1.size() == (2, 64)
    assert torch.allclose(conv((x1, x2), edge_index, size=(4, 2)), out1)
    assert torch.allclose(conv((x1, x2), adj1.t()), out1, atol=1e-6)

    out2 = conv((x1, None), edge_index, size=(4, 2))
    assert out2.size() == (2, 64)
    assert torch.allclose(conv((x1, None), adj1.t()), out2, atol=1e-6)
    ref = twin(conv, PyGGATConv, (8, 16), 32, heads=2)
    assert torch.allclose(ref((x1, x2), edge_index), out1, atol=1e-6)
    assert torch.allclose(ref((x1, None), edge_index, size=(4, 2)), out2, atol=1e-6)

    if WITH_TORCH_SPARSE:
        adj2 = SparseTensor.from_edge_index(edge_index, sparse_sizes=(4, 2))
        assert torch.allclose(conv((x1, x2), adj2.t()), out1, atol=1e-6)
        assert torch.allclose(conv((x1, None), adj2.t()), out2, atol=1e-6)


@pytest.mark.parametrize(
    "cls, ref_cls", [(ga.GATConv, PyGGATConv), (ga.GATv2Conv, PyGGATv2Conv)], ids=["GATConv", "GATv2Conv"]
)
def test_gat_conv_with_edge_attr(cls, ref_cls):
    """PyG's test_gat_conv_with_edge_attr and test_gatv2_conv_with_edge_attr (same four layers)."""
    x = torch.randn(4, 8)
    edge_index = torch.tensor([[0, 1, 2, 3], [1, 0, 1, 1]])
    edge_weight = torch.randn(edge_index.size(1))
    edge_attr = torch.randn(edge_index.size(1), 4)

    for edge_dim, fill_value, attr in [
        (1, 0.5, edge_weight),
        (1, "mean", edge_weight),
        (4, 0.5, edge_attr),
        (4, "mean", edge_attr),
    ]:
        conv = cls(8, 32, heads=2, edge_dim=edge_dim, fill_value=fill_value)
        out = conv(x, edge_index, attr)
        assert out.size() == (4, 64)
        ref = twin(conv, ref_cls, 8, 32, heads=2, edge_dim=edge_dim, fill_value=fill_value)
        assert torch.allclose(ref(x, edge_index, attr), out, atol=1e-6)
        if WITH_TORCH_SPARSE and cls is ga.GATConv:
            adj = SparseTensor.from_edge_index(edge_index, attr, (4, 4))
            with pytest.raises(NotImplementedError):
                conv(x, adj.t())


@pytest.mark.parametrize("cls", [ga.GATConv, ga.GATv2Conv], ids=["GATConv", "GATv2Conv"])
def test_gat_conv_empty_edge_index(cls):
    x = torch.randn(0, 8)
    edge_index = torch.empty(2, 0, dtype=torch.long)

    conv = cls(8, 32, heads=2)
    out = conv(x, edge_index)
    assert out.size() == (0, 64)
    assert conv(x, edge_index, return_attention_weights=True)[1][1].shape == (0, 2)


# -- test/nn/conv/test_gatv2_conv.py ---------------------------------------------------------------


def test_gatv2_conv():
    x1 = torch.randn(4, 8)
    x2 = torch.randn(2, 8)
    edge_index = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1]])
    adj1 = to_torch_csc_tensor(edge_index, size=(4, 4))

    conv = ga.GATv2Conv(8, 32, heads=2)
    assert str(conv) == "GATv2Conv(8, 32, heads=2)"
    out = conv(x1, edge_index)
    assert out.size() == (4, 64)
    assert torch.allclose(conv(x1, edge_index), out)
    assert torch.allclose(conv(x1, adj1.t()), out, atol=1e-6)
    ref = twin(conv, PyGGATv2Conv, 8, 32, heads=2)
    assert torch.allclose(ref(x1, edge_index), out, atol=1e-6)

    if WITH_TORCH_SPARSE:
        adj2 = SparseTensor.from_edge_index(edge_index, sparse_sizes=(4, 4))
        assert torch.allclose(conv(x1, adj2.t()), out, atol=1e-6)

    # Test `return_attention_weights`.
    result = conv(x1, edge_index, return_attention_weights=True)
    assert torch.allclose(result[0], out)
    assert result[1][0].size() == (2, 7)
    assert result[1][1].size() == (7, 2)
    assert result[1][1].min() >= 0 and result[1][1].max() <= 1
    assert getattr(conv, "_alpha", None) is None  # PyG 2.8's GATv2Conv has no _alpha at all (older PyG: None)

    result = conv(x1, adj1.t(), return_attention_weights=True)
    assert torch.allclose(result[0], out, atol=1e-6)
    assert result[1][0].size() == torch.Size([4, 4, 2])
    assert result[1][0]._nnz() == 7

    if WITH_TORCH_SPARSE:
        result = conv(x1, adj2.t(), return_attention_weights=True)
        assert torch.allclose(result[0], out, atol=1e-6)
        assert result[1].sizes() == [4, 4, 2] and result[1].nnz() == 7
        assert getattr(conv, "_alpha", None) is None

    # Test bipartite message passing:
    adj1 = to_torch_csc_tensor(edge_index, size=(4, 2))

    out = conv((x1, x2), edge_index)
    assert out.size() == (2, 64)
    assert torch.allclose(conv((x1, x2), edge_index), out)
    assert torch.allclose(conv((x1, x2), adj1.t()), out, atol=1e-6)
    assert torch.allclose(ref((x1, x2), edge_index), out, atol=1e-6)

    if WITH_TORCH_SPARSE:
        adj2 = SparseTensor.from_edge_index(edge_index, sparse_sizes=(4, 2))
        assert torch.allclose(conv((x1, x2), adj2.t()), out, atol=1e-6)
