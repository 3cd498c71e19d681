"""One of each: the dense oracle is the layer's twin, the batched entry validates as the plain one, the
Hugging Face bridge loads no PyG."""

import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import assert_close

import graphattn as ga
from graphattn.dense import DenseAttention

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("in_channels", [6, (5, 4), (3, 5, 4)], ids=["F", "F_kv-F_q", "F_k-F_v-F_q"])
def test_dense_attention_initialises_as_the_layer(in_channels):
    """Same seed, same constructor call: the same state_dict (names, shapes and values)."""
    torch.manual_seed(3)
    conv = ga.AttentionConv(in_channels, 8, heads=2)
    torch.manual_seed(3)
    oracle = DenseAttention(in_channels, 8, heads=2)
    want, got = conv.state_dict(), oracle.state_dict()
    assert list(got) == list(want)
    for name in want:
        assert torch.equal(got[name], want[name]), name
    before = {k: v.clone() for k, v in oracle.state_dict().items()}
    oracle.reset_parameters()
    assert not torch.equal(oracle.lin_query.weight, before["lin_query.weight"])
    assert torch.count_nonzero(oracle.lin_query.bias) == 0


def test_dense_attention_takes_the_layers_input_forms():
    """Tensor, (x_kv, x_q) and (x_k, x_v, x_q): equal to the layer on the same graph (float64, 1e-10)."""
    L, S = 5, 7
    mask = torch.rand(L, S, generator=torch.Generator().manual_seed(0)) < 0.6
    edge_index = ga.graphs.mask_to_edge_index(mask)
    cases = [
        (6, torch.randn(L, 6)),
        ((5, 4), (torch.randn(S, 5), torch.randn(L, 4))),
        ((3, 5, 4), (torch.randn(S, 3), torch.randn(S, 5), torch.randn(L, 4))),
    ]
    for in_channels, x in cases:
        conv = ga.AttentionConv(in_channels, 6, heads=3).double()
        oracle = DenseAttention(in_channels, 6, heads=3).double()
        oracle.load_state_dict(conv.state_dict())
        x = x.double() if isinstance(x, torch.Tensor) else tuple(t.double() for t in x)
        graph_mask = mask if not isinstance(x, torch.Tensor) else (torch.rand(L, L) < 0.6)
        graph = edge_index if not isinstance(x, torch.Tensor) else ga.graphs.mask_to_edge_index(graph_mask)
        out, weights = oracle(x, graph_mask)
        assert_close(out, conv(x, graph))
        assert weights.shape[-3:] == (3, L, graph_mask.size(1))


def test_dense_attention_signature_mirrors_the_layer():
    """Arguments after ``heads`` are keyword only (the layer's fourth is ``dropout``); one name per meaning."""
    with pytest.raises(TypeError):
        DenseAttention(4, 8, 2, True)
    layer = inspect.signature(ga.AttentionConv.__init__).parameters
    oracle = inspect.signature(DenseAttention.__init__).parameters
    assert list(oracle)[:4] == list(layer)[:4] == ["self", "in_channels", "out_channels", "heads"]
    assert set(oracle) - {"self"} <= set(layer)
    assert "bias" not in inspect.signature(DenseAttention.forward).parameters
    assert repr(DenseAttention(4, 8, heads=2, bias=False)) == "DenseAttention(4, 8, heads=2, bias=False)"


@pytest.mark.parametrize(
    "kwargs, error, name",
    [
        (dict(scale=float("nan")), ValueError, "scale"),
        (dict(scale="a"), TypeError, "scale"),
        (dict(dropout=2.0), ValueError, "dropout"),
        (dict(dropout=-0.1), ValueError, "dropout"),
        (dict(training="yes"), TypeError, "training"),
    ],
    ids=["scale-nan", "scale-str", "dropout-2", "dropout-neg", "training-str"],
)
def test_batched_attention_refuses_scalars_as_attention_does(kwargs, error, name):
    q = torch.randn(5, 2, 4)
    batch = torch.tensor([0, 0, 1, 1, 1])
    with pytest.raises(error, match=f"'{name}'") as batched:
        ga.ops.batched_attention(q, q, q, ga.patterns.full(), batch, **kwargs)
    with pytest.raises(error, match=f"'{name}'") as plain:
        ga.attention(q, q, q, ga.patterns.full().edge_index(5), **kwargs)
    assert str(batched.value) == str(plain.value)


@pytest.mark.slow  # a fresh interpreter importing transformers
def test_the_hugging_face_bridge_loads_no_pyg():
    code = (
        "import sys, graphattn.interop.hf as hf; hf.register(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch_geometric'))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
