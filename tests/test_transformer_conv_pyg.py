"""``ga.TransformerConv`` keeps PyG 2.8's conventions that PyG code relies on: ``return_attention_weights=None``,
``_alpha`` (before dropout, while ``propagate`` runs), ``repr``, every ``aggr``, and PyG's dropout draw
(``pyg_dropout=True``: same seed, same weights, dropout on -> PyG's outputs)."""

import pytest
import torch
from torch_geometric.nn import TransformerConv as PyGTransformerConv
from torch_geometric.nn.aggr import MeanAggregation

import graphattn as ga
from tests.conftest import DTYPES, assert_close


def graph(N=9, E=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    edge_index = torch.stack([torch.randint(0, N, (E,), generator=g), torch.randint(0, N - 1, (E,), generator=g)])
    return (
        torch.randn(N, 6, dtype=torch.float64, generator=g),
        edge_index,
        torch.randn(E, 3, dtype=torch.float64, generator=g),
    )


def twins(pyg_dropout=False, **kwargs):
    torch.manual_seed(1)
    ref = PyGTransformerConv(6, 4, heads=2, **kwargs).double()
    return ga.TransformerConv.from_transformer_conv(ref, pyg_dropout=pyg_dropout), ref


@pytest.mark.parametrize("flag", [None, True, False], ids=["None", "True", "False"])
def test_return_attention_weights_as_pyg(flag):
    ours, ref = twins()
    x, edge_index, _ = graph()
    out, out_r = ours(x, edge_index, return_attention_weights=flag), ref(x, edge_index, return_attention_weights=flag)
    assert type(out) is type(out_r)  # None -> Tensor; any bool (also False, PyG 2.8) -> the tuple
    if flag is None:
        assert_close(out, out_r)
    else:
        assert_close(out[0], out_r[0])
        assert torch.equal(out[1][0], out_r[1][0])
        assert_close(out[1][1], out_r[1][1])
    assert ours._alpha is None and ref._alpha is None
    assert ours(x, edge_index) is not None and ours.forward.__defaults__[1] is None  # the default is None


def test_alpha_is_pygs_while_propagate_runs():
    """A message hook (what PyG's AttentionExplainer registers) reads ``_alpha``: PyG's, before dropout."""
    ours, ref = twins(dropout=0.5, edge_dim=3)
    x, edge_index, edge_attr = graph()
    seen = {}
    for name, conv in (("ours", ours), ("ref", ref)):

        def hook(module, inputs, out, name=name):
            seen[name] = module._alpha.clone()  # returns None: the message is left as it is

        conv.register_message_forward_hook(hook)
        conv.train()
        torch.manual_seed(5)
        conv(x, edge_index, edge_attr)
        assert conv._alpha is None  # reset after propagate, as PyG
    assert_close(seen["ours"], seen["ref"])
    assert_close(
        seen["ours"].view(-1, 2).new_zeros(9, 2).index_add_(0, edge_index[1], seen["ours"])[:8],
        torch.ones(8, 2, dtype=torch.float64),
    )  # before dropout: sums to 1 into each target with edges


@pytest.mark.parametrize("aggr", ["mean", "max", "sum", MeanAggregation()], ids=["mean", "max", "sum", "module"])
def test_every_aggr_pyg_accepts_equals_pyg(aggr):
    """(A list of aggregations fails inside PyG's TransformerConv itself: its output is not (L, H, D).)"""
    torch.manual_seed(1)
    ref = PyGTransformerConv(6, 4, heads=2, edge_dim=3, aggr=aggr).double()
    ours = ga.TransformerConv.from_transformer_conv(ref)
    x, edge_index, edge_attr = graph()
    xs = [x.clone().requires_grad_() for _ in range(2)]
    out, out_r = ours(xs[0], edge_index, edge_attr), ref(xs[1], edge_index, edge_attr)
    assert_close(out, out_r)
    out.square().sum().backward()
    out_r.square().sum().backward()
    assert_close(xs[0].grad, xs[1].grad)
    back = ours.to_transformer_conv()
    assert str(back.aggr_module) == str(ref.aggr_module)
    assert_close(back(x, edge_index, edge_attr), out_r)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "config",
    [dict(), dict(edge_dim=3, beta=True), dict(concat=False, root_weight=False)],
    ids=["plain", "edge_dim-beta", "mean-no_root"],
)
def test_pyg_dropout_gives_pygs_outputs_with_the_same_seed(config, dtype):
    """Dropout on, training, the same seed: the same mask as PyG, so the same outputs, alpha and gradients."""
    ours, ref = twins(pyg_dropout=True, dropout=0.4, **config)
    ours, ref = ours.to(dtype).train(), ref.to(dtype).train()
    x, edge_index, edge_attr = graph()
    edge_attr = edge_attr.to(dtype) if "edge_dim" in config else None
    results = []
    for conv in (ours, ref):
        xg = x.to(dtype).requires_grad_()
        torch.manual_seed(7)
        out, (_, alpha) = conv(xg, edge_index, edge_attr, return_attention_weights=True)
        out.square().sum().backward()
        results.append((out, alpha, xg.grad))
    for a, b in zip(*results):
        assert_close(a, b, dtype)
    assert_close(
        results[0][1].new_zeros(9, 2).index_add_(0, edge_index[1], results[0][1])[:8],
        torch.ones(8, 2, dtype=dtype),
        dtype,
    )  # alpha before dropout, as PyG returns it


def test_pyg_dropout_off_draws_another_mask_and_eval_is_exact():
    ours, ref = twins(dropout=0.4)
    x, edge_index, _ = graph(N=40, E=400)
    ours.train(), ref.train()
    torch.manual_seed(7)
    out = ours(x, edge_index)
    torch.manual_seed(7)
    assert (out - ref(x, edge_index)).abs().max() > 1e-3  # the kernels draw their own mask
    ours.eval(), ref.eval()
    assert_close(ours(x, edge_index), ref(x, edge_index))
    with pytest.raises(TypeError, match="'pyg_dropout'"):
        ga.TransformerConv(6, 4, pyg_dropout="yes")
