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


def test_bucket_layout_groups_each_size_head_major():
    """Graphs [2, 1, 2] with H = 2: the size-1 graph first, then the two size-2 graphs; inside a bucket
    graph, head, position; ``back`` undoes ``source``."""
    from graphattn.ops.ragged import bucket_layout

    batch = torch.tensor([0, 0, 1, 2, 2])
    source, back, buckets = bucket_layout(batch, torch.tensor([2, 1, 2]), 2)
    assert buckets == [(1, 1), (2, 2)]
    node, head = source // 2, source % 2
    assert node.tolist() == [2, 2, 0, 1, 0, 1, 3, 4, 3, 4]
    assert head.tolist() == [0, 1, 0, 0, 1, 1, 0, 0, 1, 1]
    assert torch.equal(source[back], torch.arange(10))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fast_path_equals_readable_path_with_dropout(causal):
    """The bucketed kernel (hand-written backward) against its readable path (autograd), the same dropout draws."""
    from graphattn.ops.ragged import bucket_layout, core_reference, group_sizes, ragged_forward

    lengths = [4, 1, 7, 4, 0, 2, 7, 3]
    _, batch = ga.graphs.batch_sequences(lengths, ga.patterns.full())
    N, H, D = sum(lengths), 3, 5
    q, k, v = (torch.randn(N, H, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = ragged_forward(q, k, v, batch, causal, 0.3, 0.25, seed=77)
    source, back, buckets = bucket_layout(batch, group_sizes(batch, N), H)
    rows = (t.reshape(-1, D)[source] for t in (q, k, v))  # (M, D) each
    ref = core_reference(*rows, buckets, H, causal, 0.3, 0.25, 77)[back].view(N, H, D)
    assert_close(out, ref)
    g = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        assert_close(a, b)


@pytest.mark.parametrize("pattern", PATTERNS[:2])
def test_second_derivatives_equal_attention_on_batch_sequences(pattern):
    """create_graph=True through the ragged kernel: the gradient's own gradient equals the explicit edges'."""
    lengths = [3, 0, 5, 1, 5]
    edge_index, batch = ga.graphs.batch_sequences(lengths, pattern)
    N, H, D = sum(lengths), 2, 3
    q, k, v = (torch.randn(N, H, D, dtype=torch.float64, requires_grad=True) for _ in range(3))

    def penalty(out):
        grads = torch.autograd.grad(out.square().sum(), (q, k, v), create_graph=True)
        return torch.autograd.grad(sum(g.square().sum() for g in grads), (q, k, v))

    got = penalty(batched_attention(q, k, v, pattern, batch)[0])
    want = penalty(ga.attention(q, k, v, edge_index)[0])
    for a, b in zip(got, want):
        assert_close(a, b)


def test_an_empty_batch_still_backpropagates_zero_gradients():
    """N = 0 nodes: the output (0, H, D) is connected to the inputs, so ``loss.backward()`` works (zeros)."""
    q, k, v = (torch.zeros(0, 2, 3, requires_grad=True) for _ in range(3))
    out, _ = ga.ops.batched_attention(q, k, v, ga.patterns.full(), batch=torch.zeros(0, dtype=torch.long))
    assert out.shape == (0, 2, 3)
    out.sum().backward()
    assert all(t.grad is not None and t.grad.shape == (0, 2, 3) for t in (q, k, v))
