"""``graphattn.ops.batched_attention`` against attention on the explicit per-graph edges."""

import pytest
import torch

import graphattn as ga
from graphattn.ops import batched_attention
from tests.conftest import DTYPES, assert_close

PATTERNS = [
    pytest.param(ga.patterns.full(), id="full"),
    pytest.param(ga.patterns.causal(), id="causal"),
    pytest.param(ga.patterns.window(1, 0), id="window_1_0"),
]


LENGTHS = [
    pytest.param([3, 0, 5, 1, 7, 5, 0], id="similar"),  # empty graphs, a single node, a prime
    pytest.param([1, 40, 2, 0, 3, 2, 1, 5, 2, 3], id="uneven"),
]  # padding > MAX_PADDING x work: grouped


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("need_weights", [False, True], ids=["out", "weights"])
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("lengths", LENGTHS)
def test_equals_attention_on_batch_sequences(lengths, pattern, need_weights, dtype):
    edge_index, batch = ga.graphs.batch_sequences(lengths, pattern)
    N, H, D = sum(lengths), 2, 3
    q, k, v = (torch.randn(N, H, D, dtype=dtype, requires_grad=True) for _ in range(3))
    out, alpha = batched_attention(q, k, v, pattern, batch, need_weights=need_weights)
    ref, ref_alpha = ga.attention(q, k, v, edge_index, need_weights=True)
    assert_close(out, ref)
    loss = (out * torch.linspace(-1, 1, out.numel(), dtype=dtype).view_as(out)).sum()
    loss_r = (ref * torch.linspace(-1, 1, out.numel(), dtype=dtype).view_as(out)).sum()
    if need_weights:
        assert_close(alpha, ref_alpha)
        loss, loss_r = loss + alpha[:, 0].square().sum(), loss_r + ref_alpha[:, 0].square().sum()
    else:
        assert alpha is None
    for g, g_r in zip(torch.autograd.grad(loss, (q, k, v)), torch.autograd.grad(loss_r, (q, k, v))):
        assert_close(g, g_r)


def test_no_cross_graph_leak():
    """Changing one graph's nodes leaves the other graphs' outputs bitwise unchanged."""
    batch = torch.tensor([0, 0, 0, 1, 1])
    x = torch.randn(5, 1, 4)
    out, _ = batched_attention(x, x, x, ga.patterns.full(), batch)
    y = x.clone()
    y[3:] = 100.0
    out_y, _ = batched_attention(y, y, y, ga.patterns.full(), batch)
    assert torch.equal(out[:3], out_y[:3])


def test_refusals():
    x = torch.randn(4, 1, 2)
    with pytest.raises(ValueError, match="'batch'"):
        batched_attention(x, x, x, ga.patterns.full(), torch.tensor([1, 0, 0, 0]))
    with pytest.raises(TypeError, match="'batch'"):
        batched_attention(x, x, x, ga.patterns.full(), torch.zeros(4))
    with pytest.raises(ValueError, match="'key'"):
        batched_attention(x, x[:3], x[:3], ga.patterns.full(), torch.zeros(4, dtype=torch.long))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("lengths", LENGTHS)
def test_equals_attention_on_batch_sequences_on_cuda(lengths, pattern):
    """The ragged kernel on cuda (float64) equals attention on the explicit edges on the CPU."""
    edge_index, batch = ga.graphs.batch_sequences(lengths, pattern)
    N, H, D = sum(lengths), 2, 3
    q, k, v = (torch.randn(N, H, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    ref, _ = ga.attention(q, k, v, edge_index)
    grads_r = torch.autograd.grad(ref.square().sum(), (q, k, v))
    qc, kc, vc = (t.detach().cuda().requires_grad_() for t in (q, k, v))
    out, _ = batched_attention(qc, kc, vc, pattern, batch.cuda())
    assert out.is_cuda
    assert_close(out.cpu(), ref)
    for g, g_r in zip(torch.autograd.grad(out.square().sum(), (qc, kc, vc)), grads_r):
        assert_close(g.cpu(), g_r)
