"""``graphattn.gps``: the never-padding ``GPSConv`` and ``GPSAttention`` against PyG's stock ``GPSConv`` / MHA."""

import copy
import importlib.util
import re
from pathlib import Path

import pytest
import torch
from torch_geometric.nn import GINConv
from torch_geometric.nn import GPSConv as PyGGPSConv

from graphattn.gps import GPSAttention, GPSConv, use_graphattn
from tests.conftest import assert_close

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def gps_model(channels=8, heads=2, **kwargs):
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(channels, channels), torch.nn.ReLU(), torch.nn.Linear(channels, channels))
    return PyGGPSConv(channels, GINConv(mlp), heads=heads, **kwargs).double()


def ragged_graph(lengths):
    lengths = torch.tensor(lengths)
    batch = torch.repeat_interleave(torch.arange(len(lengths)), lengths)  # (N,)
    N = int(lengths.sum())
    edge_index = torch.stack([torch.arange(N - 1), torch.arange(1, N)])  # a path (crosses graphs: GIN doesn't care)
    return N, edge_index, batch


def grads(model, x, out):
    params = [p for p in model.parameters()]
    return torch.autograd.grad(
        (out * torch.randn_like(out, generator=torch.Generator().manual_seed(1))).sum(), [x, *params]
    )


@pytest.mark.parametrize("norm", ["batch_norm", "layer_norm", None], ids=lambda n: f"norm={n}")
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_gps_conv_equals_stock_outputs_and_every_gradient(norm, train):
    N, edge_index, batch = ragged_graph([3, 1, 5, 5, 2, 7])
    stock = gps_model(norm=norm).train(train)  # dropout 0: train mode = batch statistics, deterministic
    ours = use_graphattn(copy.deepcopy(stock))
    assert type(ours) is GPSConv and ours.training == train
    x = torch.randn(N, 8, dtype=torch.float64, requires_grad=True)
    out, out_r = ours(x, edge_index, batch), stock(x, edge_index, batch)
    assert_close(out, out_r)
    for g, g_r in zip(grads(ours, x, out), grads(stock, x, out_r)):
        assert_close(g, g_r)
    assert list(ours.state_dict()) == list(stock.state_dict())
    assert repr(ours) == repr(stock)


def test_gps_conv_one_graph_without_batch_and_an_empty_graph():
    stock = gps_model().eval()
    ours = use_graphattn(copy.deepcopy(stock))
    x = torch.randn(6, 8, dtype=torch.float64)
    edge_index = torch.tensor([[0, 1, 2], [1, 2, 3]])
    assert_close(ours(x, edge_index), stock(x, edge_index))  # batch=None: one graph
    batch = torch.tensor([0, 0, 2, 2, 2, 3])  # graph 1 has no node
    assert_close(ours(x, edge_index, batch), stock(x, edge_index, batch))


def test_use_graphattn_keeps_the_parameter_objects_and_replaces_nested_layers():
    model = torch.nn.Sequential(gps_model(), torch.nn.ModuleList([gps_model()]))
    before = [id(p) for p in model.parameters()]
    assert use_graphattn(model) is model
    assert type(model[0]) is GPSConv and type(model[1][0]) is GPSConv
    assert [id(p) for p in model.parameters()] == before
    assert use_graphattn(model) is model and type(model[0]) is GPSConv  # idempotent


def test_gps_conv_other_attention_runs_pygs_forward():
    stock = gps_model(attn_kwargs={"add_bias_kv": True}).eval()
    ours = GPSConv.from_gps_conv(copy.deepcopy(stock))
    N, edge_index, batch = ragged_graph([2, 4])
    x = torch.randn(N, 8, dtype=torch.float64)
    assert_close(ours(x, edge_index, batch), stock(x, edge_index, batch))
    with pytest.raises(TypeError, match="'conv'"):
        GPSConv.from_gps_conv(torch.nn.Linear(2, 2))


def test_gps_conv_attention_dropout_keeps_the_expectation():
    """Attention dropout draws inside the operator (MHA's distribution, not its bits): outputs differ, the mean holds."""
    stock = gps_model(norm=None, attn_kwargs={"dropout": 0.5}).train()
    ours = use_graphattn(copy.deepcopy(stock))
    N, edge_index, batch = ragged_graph([4, 6])
    x = torch.randn(N, 8, dtype=torch.float64)
    mean = torch.stack([ours(x, edge_index, batch) for _ in range(400)]).mean(0)
    mean_r = torch.stack([stock(x, edge_index, batch) for _ in range(400)]).mean(0)
    assert (mean - mean_r).abs().max() < 0.25 * mean_r.abs().max()


@pytest.mark.parametrize("batch_first", [True, False])
def test_gps_attention_padded_path_equals_multihead_attention(batch_first):
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=batch_first).double().eval()
    ours = GPSAttention.from_multihead_attention(mha)
    x = torch.randn(3, 4, 8, dtype=torch.float64, requires_grad=True)
    pad = torch.tensor([[False] * 4, [False, False, True, True], [False, True, True, True]])
    pad_x = x if batch_first else x.transpose(0, 1)  # (B, T, F) or (T, B, F)
    out, weights = ours(pad_x, pad_x, pad_x, key_padding_mask=pad)  # weights requested: MHA's path
    out_r, weights_r = mha(pad_x, pad_x, pad_x, key_padding_mask=pad)
    assert_close(out, out_r)
    assert_close(weights, weights_r)
    fast, none = ours(pad_x, pad_x, pad_x, key_padding_mask=pad, need_weights=False)
    assert none is None
    assert_close(fast, out_r)  # every position, padding queries included
    (g,) = torch.autograd.grad(fast.square().sum(), x)
    (g_r,) = torch.autograd.grad(out_r.square().sum(), x)
    assert_close(g, g_r)


@pytest.mark.parametrize("shape", [(3, 5), (4, 4), (3,)])
def test_gps_attention_checks_the_key_padding_mask_shape(shape):
    ours = GPSAttention(8, 2, batch_first=True)
    x = torch.randn(3, 4, 8)
    with pytest.raises(ValueError, match=r"'key_padding_mask'.*\(3, 4\)"):
        ours(x, x, x, key_padding_mask=torch.zeros(shape, dtype=torch.bool), need_weights=False)


def test_example_trains_and_both_models_agree(capsys):
    """examples/gps.py, run in this process (a subprocess would re-import torch and PyG)."""
    spec = importlib.util.spec_from_file_location("gps_example", EXAMPLES / "gps.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.main(["--graphs", "40", "--epochs", "2", "--channels", "16"]) == 0
    losses = re.findall(r"final train loss (\d+\.\d+)", capsys.readouterr().out)
    assert len(losses) == 2 and losses[0] == losses[1]


def test_gps_conv_compiles_and_equals_stock():
    stock = gps_model().train()
    compiled = torch.compile(use_graphattn(copy.deepcopy(stock)), backend="aot_eager")
    for lengths in ([3, 5, 2], [4, 4, 6, 1]):  # a second batch of other sizes
        N, edge_index, batch = ragged_graph(lengths)
        x = torch.randn(N, 8, dtype=torch.float64)
        assert_close(compiled(x, edge_index, batch), stock(x, edge_index, batch))
