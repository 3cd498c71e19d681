"""``graphattn.gps.GPSAttention`` inside ``torch_geometric.nn.GPSConv`` against the stock ``nn.MultiheadAttention``."""

import copy
import importlib.util
import re
from pathlib import Path

import pytest
import torch
from torch_geometric.nn import GINConv, GPSConv

from graphattn.gps import GPSAttention, use_graphattn
from tests.conftest import assert_close

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def gps_model(channels=8, heads=2):
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(channels, channels), torch.nn.ReLU(), torch.nn.Linear(channels, channels))
    return GPSConv(channels, GINConv(mlp), heads=heads, norm=None).double().eval()


def test_gps_conv_with_graphattn_attention_equals_stock():
    lengths = torch.tensor([3, 1, 5, 5, 2])
    batch = torch.repeat_interleave(torch.arange(5), lengths)
    N = int(lengths.sum())
    edge_index = torch.stack([torch.arange(N - 1), torch.arange(1, N)])
    stock = gps_model()
    ours = use_graphattn(copy.deepcopy(stock))
    assert isinstance(ours.attn, GPSAttention)
    x = torch.randn(N, 8, dtype=torch.float64, requires_grad=True)
    out, out_r = ours(x, edge_index, batch), stock(x, edge_index, batch)
    assert_close(out, out_r)
    grad, = torch.autograd.grad(out.square().sum(), x)
    grad_r, = torch.autograd.grad(out_r.square().sum(), x)
    assert_close(grad, grad_r)
    assert list(ours.state_dict()) == list(stock.state_dict())


@pytest.mark.parametrize("batch_first", [True, False])
def test_other_calls_are_multihead_attentions_own(batch_first):
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=batch_first).double().eval()
    ours = GPSAttention.from_multihead_attention(mha)
    x = torch.randn(3, 4, 8, dtype=torch.float64)
    pad = torch.tensor([[False] * 4, [False, False, True, True], [False, True, True, True]])
    pad_x = x if batch_first else x.transpose(0, 1)  # (B, T, F) or (T, B, F)
    out, weights = ours(pad_x, pad_x, pad_x, key_padding_mask=pad)  # weights requested: MHA's path
    out_r, weights_r = mha(pad_x, pad_x, pad_x, key_padding_mask=pad)
    assert_close(out, out_r)
    assert_close(weights, weights_r)
    fast, none = ours(pad_x, pad_x, pad_x, key_padding_mask=pad, need_weights=False)
    assert none is None
    valid = ~pad if batch_first else (~pad).t()
    assert_close(fast[valid], out_r[valid])
    assert (fast[~valid] == 0).all()


def test_example_trains_and_both_models_agree(capsys):
    """examples/gps.py, run in this process (a subprocess would re-import torch and PyG)."""
    spec = importlib.util.spec_from_file_location("gps_example", EXAMPLES / "gps.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.main(["--graphs", "40", "--epochs", "2", "--channels", "16"]) == 0
    losses = re.findall(r"final train loss (\d+\.\d+)", capsys.readouterr().out)
    assert len(losses) == 2 and losses[0] == losses[1]
