"""AttentionConv against nn.MultiheadAttention, SDPA and the dense oracle; edge cases and bad input."""

import pytest
import torch
import torch.nn.functional as F
from conftest import DTYPES, TOL, assert_close
from hypothesis import given, settings
from hypothesis import strategies as st

from graphattn import AttentionConv, graphs, patterns
from graphattn.dense import DenseAttention

IMPLS = ["auto", "message_passing"]


def _complete(L, S=None):
    return graphs.mask_to_edge_index(torch.ones(L, L if S is None else S, dtype=torch.bool))


def _scatter_weights(edge_index, alpha, L, S):
    """alpha (E, H) -> dense (H, L, S), zero off the edge set."""
    dense = alpha.new_zeros(alpha.size(1), L, S)
    dense[:, edge_index[1], edge_index[0]] = alpha.T
    return dense


def _mha(embed, heads, dtype, **kwargs):
    return torch.nn.MultiheadAttention(embed, heads, dtype=dtype, **kwargs)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("batch_first", [False, True], ids=["seq_first", "batch_first"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("L", [1, 7, 12])
def test_complete_graph_equals_multihead_attention(L, dtype, batch_first, impl):
    embed, heads = 12, 3
    mha = _mha(embed, heads, dtype, batch_first=batch_first)
    conv = AttentionConv.from_multihead_attention(mha)
    conv.impl = impl
    x = torch.randn(L, embed, dtype=dtype)
    x_ref = x.clone().requires_grad_()
    x_mha = x_ref.unsqueeze(0 if batch_first else 1)
    ref, ref_w = mha(x_mha, x_mha, x_mha, average_attn_weights=False)  # (1, L, F), (1, H, L, S)
    x_conv = x.clone().requires_grad_()
    edge_index = _complete(L)
    out, (_, alpha) = conv(x_conv, edge_index, return_attention_weights=True)
    assert_close(out, ref.squeeze(0 if batch_first else 1))
    assert_close(_scatter_weights(edge_index, alpha, L, L), ref_w[0])
    grad = torch.randn_like(out)
    ref.squeeze(0 if batch_first else 1).backward(grad)
    out.backward(grad)
    assert_close(x_conv.grad, x_ref.grad)
    w_q, w_k, w_v = mha.in_proj_weight.grad.chunk(3)
    b_q, b_k, b_v = mha.in_proj_bias.grad.chunk(3)
    for got, want in [
        (conv.lin_query.weight, w_q),
        (conv.lin_key.weight, w_k),
        (conv.lin_value.weight, w_v),
        (conv.lin_query.bias, b_q),
        (conv.lin_key.bias, b_k),
        (conv.lin_value.bias, b_v),
        (conv.lin_out.weight, mha.out_proj.weight.grad),
        (conv.lin_out.bias, mha.out_proj.bias.grad),
    ]:
        assert_close(got.grad, want)


@pytest.mark.parametrize("batch_first", [False, True], ids=["seq_first", "batch_first"])
@pytest.mark.parametrize("kdim,vdim", [(12, 12), (5, 5), (5, 7)], ids=["same", "kdim=vdim", "kdim!=vdim"])
def test_to_multihead_attention_round_trip(kdim, vdim, batch_first):
    dtype = torch.float64
    in_channels = 12 if kdim == vdim == 12 else ((kdim, 12) if kdim == vdim else (kdim, vdim, 12))
    conv = AttentionConv(in_channels, 12, heads=4).to(dtype)
    mha = conv.to_multihead_attention(batch_first=batch_first)
    assert (mha.kdim, mha.vdim, mha.batch_first) == (kdim, vdim, batch_first)
    L, S = 6, 9
    q, k, v = torch.randn(L, 12, dtype=dtype), torch.randn(S, kdim, dtype=dtype), torch.randn(S, vdim, dtype=dtype)
    add_batch = (lambda t: t.unsqueeze(0)) if batch_first else (lambda t: t.unsqueeze(1))
    ref = mha(add_batch(q), add_batch(k), add_batch(v), need_weights=False)[0]
    out = conv((k, v, q), _complete(L, S))
    assert_close(out, ref.squeeze(0 if batch_first else 1))
    back = AttentionConv.from_multihead_attention(mha)
    assert_close(back((k, v, q), _complete(L, S)), out)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_causal_graph_equals_the_three_causal_forms(dtype, impl):
    L, embed, heads = 11, 16, 4
    mha = _mha(embed, heads, dtype, batch_first=True)
    conv = AttentionConv.from_multihead_attention(mha)
    conv.impl = impl
    conv.lin_out = None  # compare the attention itself with SDPA; MHA below uses the projection
    x = torch.randn(L, embed, dtype=dtype)
    out = conv(x, patterns.causal().edge_index(L))  # (L, H*D)
    q, k, v = conv._project(x)  # (L, H, D) each
    q, k, v = (t.transpose(0, 1) for t in (q, k, v))  # (H, L, D)
    lower = torch.ones(L, L, dtype=torch.bool).tril()  # True = may attend
    for ref in (
        F.scaled_dot_product_attention(q, k, v, is_causal=True),
        F.scaled_dot_product_attention(q, k, v, attn_mask=lower),
    ):
        assert_close(out, ref.transpose(0, 1).reshape(L, embed))
    full = AttentionConv.from_multihead_attention(mha)
    full.impl = impl
    blocked = ~lower  # nn.MultiheadAttention polarity: True = blocked
    ref = mha(x[None], x[None], x[None], attn_mask=blocked, need_weights=False)[0][0]
    assert_close(full(x, patterns.causal().edge_index(L)), ref)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_variable_length_batch_equals_key_padding_mask(dtype, impl):
    lengths, embed, heads = [5, 2, 7, 1], 8, 2
    mha = _mha(embed, heads, dtype, batch_first=True)
    conv = AttentionConv.from_multihead_attention(mha)
    conv.impl = impl
    x = torch.randn(len(lengths), max(lengths), embed, dtype=dtype)
    valid = torch.arange(max(lengths)) < torch.tensor(lengths)[:, None]  # (B, T)
    ref = mha(x, x, x, key_padding_mask=~valid, need_weights=False)[0]  # (B, T, F)
    nodes, batch = graphs.padded_to_nodes(x, lengths)
    edge_index, batch2 = graphs.batch_sequences(lengths)
    assert torch.equal(batch, batch2)
    assert_close(conv(nodes, edge_index), ref[valid])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("L,S", [(7, 3), (3, 10)], ids=["S<L", "S>L"])
@pytest.mark.parametrize("kdim,vdim", [(5, 5), (5, 9)], ids=["kdim=vdim", "kdim!=vdim"])
def test_cross_attention_equals_multihead_attention(L, S, kdim, vdim, dtype):
    embed, heads = 12, 3
    mha = _mha(embed, heads, dtype, kdim=kdim, vdim=vdim)
    conv = AttentionConv.from_multihead_attention(mha)
    q, k, v = torch.randn(L, embed, dtype=dtype), torch.randn(S, kdim, dtype=dtype), torch.randn(S, vdim, dtype=dtype)
    if kdim == vdim:  # one key/value feature tensor: the pair form (x_kv, x_q)
        v, x = k, (k, q)
    else:  # separate key and value features: the triple form (x_k, x_v, x_q)
        x = (k, v, q)
    ref, ref_w = mha(q[:, None], k[:, None], v[:, None], average_attn_weights=False)
    edge_index = _complete(L, S)
    out, (_, alpha) = conv(x, edge_index, return_attention_weights=True)
    assert out.shape == (L, embed)
    assert_close(out, ref[:, 0])
    assert_close(_scatter_weights(edge_index, alpha, L, S), ref_w[0])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("per_head", [False, True], ids=["bias_E", "bias_EH"])
def test_edge_bias_equals_sdpa_float_mask(dtype, per_head, impl):
    L, embed, heads = 9, 12, 3
    conv = AttentionConv(embed, embed, heads=heads, output_projection=False, impl=impl).to(dtype)
    x = torch.randn(L, embed, dtype=dtype)
    mask = torch.rand(L, L) < 0.5
    mask.fill_diagonal_(True)
    edge_index = graphs.mask_to_edge_index(mask)
    bias = torch.randn(edge_index.size(1), heads if per_head else 1, dtype=dtype)
    dense_bias = torch.full((heads, L, L), float("-inf"), dtype=dtype)
    dense_bias[:, edge_index[1], edge_index[0]] = bias.T.expand(heads, -1)
    out = conv(x, edge_index, edge_bias=bias if per_head else bias[:, 0])
    q, k, v = (t.transpose(0, 1) for t in conv._project(x))
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=dense_bias)  # (H, L, D)
    assert_close(out, ref.transpose(0, 1).reshape(L, embed))


def _oracle_pair(in_channels, out_channels, heads, dtype):
    conv = AttentionConv(in_channels, out_channels, heads=heads).to(dtype)
    oracle = DenseAttention(in_channels, out_channels, heads=heads).to(dtype)
    oracle.load_state_dict(conv.state_dict())  # same parameter names: weights move one-to-one
    return conv, oracle


@settings(max_examples=40, deadline=None)
@given(
    L=st.integers(1, 12),
    S=st.integers(1, 12),
    heads=st.sampled_from([1, 2, 3]),
    density=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**16),
    impl=st.sampled_from(IMPLS),
)
def test_random_graphs_equal_the_oracle(L, S, heads, density, seed, impl):
    gen = torch.Generator().manual_seed(seed)
    dtype = torch.float64
    conv, oracle = _oracle_pair((5, 4), 6 * heads, heads, dtype)
    conv.impl = impl
    x_kv, x_q = torch.randn(S, 5, generator=gen, dtype=dtype), torch.randn(L, 4, generator=gen, dtype=dtype)
    mask = torch.rand(L, S, generator=gen) < density  # empty rows included
    edge_index = graphs.mask_to_edge_index(mask)
    out, (_, alpha) = conv((x_kv, x_q), edge_index, return_attention_weights=True)
    ref, ref_w = oracle((x_kv, x_q), mask)
    assert_close(out, ref)
    assert_close(_scatter_weights(edge_index, alpha, L, S), ref_w)


@pytest.mark.parametrize("impl", IMPLS)
def test_query_without_keys_gets_a_zero_attention_row(impl):
    L, embed = 5, 8
    conv = AttentionConv(embed, embed, heads=2, impl=impl).double()
    x = torch.randn(L, embed, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(L, L, dtype=torch.bool)
    mask[3] = False
    edge_index = graphs.mask_to_edge_index(mask)
    out = conv(x, edge_index)
    out_w, (_, alpha) = conv(x, edge_index, return_attention_weights=True)
    assert torch.equal(out, out_w)
    assert torch.equal(out[3], conv.lin_out.bias)  # attention row exactly 0, then W_O 0 + b_O
    out.sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in conv.parameters())


@pytest.mark.parametrize("impl", IMPLS)
def test_degenerate_sizes(impl):
    conv = AttentionConv(4, 4, heads=2, impl=impl)
    empty = torch.empty(2, 0, dtype=torch.long)
    assert conv(torch.randn(0, 4), empty).shape == (0, 4)
    out = conv(torch.randn(3, 4), empty)  # no edges: every query gets the zero row
    assert torch.equal(out, conv.lin_out.bias.expand(3, 4))
    x = torch.randn(1, 4)
    v = conv.lin_value(x)  # L = S = 1: the single key gets weight 1, the output is its projected value
    assert_close(conv(x, _complete(1)), conv.lin_out(v), dtype=torch.float32)


@pytest.mark.parametrize("impl", IMPLS)
def test_duplicate_edges_count_as_separate_keys(impl):
    # Decision (documented in ops.attention): a repeated edge (j, i) is a separate edge with its own weight,
    # exactly as if key j appeared twice among i's keys.
    dtype = torch.float64
    conv, oracle = _oracle_pair(6, 6, 2, dtype)
    conv.impl = impl
    x = torch.randn(4, 6, dtype=dtype)
    edge_index = torch.tensor([[0, 1, 1, 2, 3, 3, 3], [0, 0, 0, 1, 2, 2, 3]])
    out, (_, alpha) = conv(x, edge_index, return_attention_weights=True)
    x_kv = x[edge_index[0]]  # one key node per edge: duplicates become distinct columns
    mask = edge_index[1][None, :] == torch.arange(4)[:, None]  # (L, E)
    ref, ref_w = oracle((x_kv, x), mask)
    assert_close(out, ref)
    assert_close(alpha.T, ref_w[:, edge_index[1], torch.arange(7)])


@pytest.mark.parametrize("impl", IMPLS)
def test_invariant_to_edge_order_and_unrelated_graphs(impl):
    conv = AttentionConv(6, 6, heads=3, impl=impl).double()
    x = torch.randn(8, 6, dtype=torch.float64)
    edge_index = graphs.mask_to_edge_index(torch.rand(8, 8) < 0.5)
    out, (_, alpha) = conv(x, edge_index, return_attention_weights=True)
    perm = torch.randperm(edge_index.size(1))
    out_p, (_, alpha_p) = conv(x, edge_index[:, perm], return_attention_weights=True)
    assert_close(out_p, out)
    assert_close(alpha_p, alpha[perm])
    other = graphs.mask_to_edge_index(torch.rand(5, 5) < 0.7) + 8
    out_b = conv(torch.cat([x, torch.randn(5, 6, dtype=torch.float64)]), torch.cat([edge_index, other], 1))
    assert_close(out_b[:8], out)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("graph", ["window", "causal"])
def test_bad_features_off_the_neighbourhood_do_not_leak(graph, bad, impl):
    L, poisoned = 10, 7
    conv = AttentionConv(6, 6, heads=2, impl=impl).double()
    pattern = patterns.window(1, 1) if graph == "window" else patterns.causal()
    edge_index = pattern.edge_index(L)
    x = torch.randn(L, 6, dtype=torch.float64)
    clean = conv(x, edge_index)
    x[poisoned] = bad
    out = conv(x, edge_index)
    reads_poisoned = edge_index[1][edge_index[0] == poisoned]
    untouched = torch.ones(L, dtype=torch.bool)
    untouched[reads_poisoned] = False
    assert untouched.sum() >= 5
    assert torch.equal(out[untouched], clean[untouched])


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (lambda c, x: c(x, torch.zeros(3, 2, dtype=torch.long)), ValueError, r"'edge_index' to have shape \(2, E\)"),
        (lambda c, x: c(x, torch.zeros(2, 2)), TypeError, "'edge_index' to have dtype int64 or int32"),
        (lambda c, x: c(x, torch.tensor([[0, -2], [0, 0]])), IndexError, "non-negative"),
        (lambda c, x: c(x, torch.tensor([[0, 9], [0, 0]])), IndexError, "S = 4"),
        (lambda c, x: c(torch.randn(4, 5), _complete(4)), ValueError, r"'x_q' to have shape \(n, 8\) \(got \(4, 5\)\)"),
        (lambda c, x: c(x, _complete(4), edge_bias=torch.zeros(3)), ValueError, "'edge_bias' to have shape"),
        (lambda c, x: c(x, _complete(4), edge_bias=torch.full((16,), float("nan"))), ValueError, "NaN"),
        (lambda c, x: c(x.long(), _complete(4)), TypeError, "'x_q' to be floating point"),
    ],
    ids=["edge_shape", "edge_dtype", "negative", "out_of_range", "features", "bias_shape", "bias_nan", "int_x"],
)
@pytest.mark.parametrize("impl", IMPLS)
def test_bad_input_raises_a_clear_error(call, exc, match, impl):
    conv = AttentionConv(8, 8, heads=2, impl=impl)
    with pytest.raises(exc, match=match):
        call(conv, torch.randn(4, 8))


def test_constructor_errors():
    with pytest.raises(ValueError, match=r"'heads' to be a positive int dividing out_channels = 10 \(got 3\)"):
        AttentionConv(4, 10, heads=3)
    with pytest.raises(ValueError, match="dropout"):
        AttentionConv(4, 4, dropout=1.5)
    with pytest.raises(TypeError, match="in_channels"):
        AttentionConv("4", 4)
    with pytest.raises(NotImplementedError, match="add_bias_kv"):
        AttentionConv.from_multihead_attention(torch.nn.MultiheadAttention(4, 2, add_bias_kv=True))


def test_repr_prints_the_constructor_call():
    assert repr(AttentionConv(16, 32, heads=4)) == "AttentionConv(16, 32, heads=4)"
    assert repr(AttentionConv((8, 16), 32, heads=2, dropout=0.1, bias=False)) == (
        "AttentionConv((8, 16), 32, heads=2, dropout=0.1, bias=False)"
    )


def test_message_passing_path_equals_the_fast_path_in_gradients():
    conv = AttentionConv(6, 6, heads=3).double()
    x = torch.randn(9, 6, dtype=torch.float64)
    edge_index = graphs.mask_to_edge_index(torch.rand(9, 9) < 0.4)
    grads = []
    for impl in IMPLS:
        conv.zero_grad()
        conv.impl = impl
        conv(x, edge_index).square().sum().backward()
        grads.append([p.grad.clone() for p in conv.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, **TOL[torch.float64])


def test_dropout_only_in_training():
    conv = AttentionConv(4, 4, heads=2, dropout=0.5)
    x, edge_index = torch.randn(6, 4), _complete(6)
    conv.eval()
    assert torch.equal(conv(x, edge_index), conv(x, edge_index))
    conv.train()
    _, (_, alpha) = conv(x, edge_index, return_attention_weights=True)
    assert (alpha == 0).any()


def test_aggr_and_flow_other_than_attention_are_refused():
    with pytest.raises(ValueError, match=r"'aggr' to be 'add' for attention \(got 'mean'\)"):
        AttentionConv(4, 4, aggr="mean")
    with pytest.raises(ValueError, match="'flow' to be 'source_to_target'"):
        AttentionConv(4, 4, flow="target_to_source")


@pytest.mark.parametrize("bad", [0, -3, 2.5], ids=["zero", "negative", "float"])
def test_bad_sizes_are_refused(bad):
    with pytest.raises(TypeError if isinstance(bad, float) else ValueError, match="out_channels"):
        AttentionConv(4, bad)
    with pytest.raises((TypeError, ValueError), match="in_channels"):
        AttentionConv(bad, 4)  # -1 alone is a lazy size (test_lazy_sizes_are_taken_from_the_first_call)


def test_feature_dtype_must_match_the_layer():
    with pytest.raises(TypeError, match=r"'x_q' to have the layer's dtype torch.float32 \(got torch.float64\)"):
        AttentionConv(4, 4)(torch.randn(3, 4, dtype=torch.float64), _complete(3))


def test_mode_is_copied_between_conv_and_mha():
    mha = torch.nn.MultiheadAttention(8, 2, dropout=0.5).eval()
    conv = AttentionConv.from_multihead_attention(mha)
    assert not conv.training
    x = torch.randn(5, 8)
    assert_close(conv(x, _complete(5)), mha(x[:, None], x[:, None], x[:, None])[0][:, 0], dtype=torch.float32)
    assert not conv.to_multihead_attention().training
    with pytest.raises(TypeError, match="nn.MultiheadAttention"):
        AttentionConv.from_multihead_attention(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("impl", IMPLS)
def test_pattern_in_place_of_edge_index(impl):
    conv = AttentionConv(6, 6, heads=2, impl=impl).double()
    x = torch.randn(7, 6, dtype=torch.float64)
    for pattern in (patterns.full(), patterns.causal(), patterns.window(1, 2)):
        edges = pattern.edge_index(7)
        out, (got_edges, alpha) = conv(x, pattern, return_attention_weights=True)
        ref, (_, ref_alpha) = conv(x, edges, return_attention_weights=True)
        assert torch.equal(got_edges, edges)
        assert_close(out, ref)
        assert_close(alpha, ref_alpha)
        assert_close(conv(x, pattern), ref)


@pytest.mark.parametrize(
    "kwargs, exc, name",
    [
        (dict(dropout="0.1"), TypeError, "dropout"),
        (dict(dropout=float("nan")), ValueError, "dropout"),
        (dict(heads="2"), TypeError, "heads"),
        (dict(heads=2.0), TypeError, "heads"),
        (dict(heads=True), TypeError, "heads"),
        (dict(out_channels="8"), TypeError, "out_channels"),
        (dict(out_channels=8.0), TypeError, "out_channels"),
        (dict(bias="no"), TypeError, "bias"),
        (dict(bias=None), TypeError, "bias"),
        (dict(output_projection=1), TypeError, "output_projection"),
        (dict(impl=["auto"]), ValueError, "impl"),
        (dict(in_channels=(4, "4")), TypeError, "in_channels"),
        (dict(in_channels=2**40), ValueError, "in_channels"),
        (dict(out_channels=2**40), ValueError, "out_channels"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_constructor_arguments_of_the_wrong_type_or_size_name_the_argument(kwargs, exc, name):
    """Refused before torch sees them (no ``'<=' not supported``, no allocator failure for 2**40 channels)."""
    args = dict(in_channels=4, out_channels=8, heads=2) | kwargs
    with pytest.raises(exc, match=rf"^Expected '{name}'"):
        AttentionConv(**args)


def test_numpy_ints_and_a_tensor_dropout_are_accepted_as_plain_numbers():
    import numpy as np

    conv = AttentionConv(np.int64(4), np.int64(8), heads=np.int64(2), dropout=torch.tensor(0.25))
    assert repr(conv) == "AttentionConv(4, 8, heads=2, dropout=0.25)" and isinstance(conv.dropout, float)


@pytest.mark.parametrize("impl", IMPLS)
def test_edge_bias_of_another_dtype_is_refused_on_both_paths(impl):
    """The message-passing path refuses a float64 bias on float32 features as the fast path does."""
    conv = AttentionConv(4, 4, heads=2, impl=impl)
    edge_index = _complete(5)
    bias = torch.randn(edge_index.size(1), dtype=torch.float64)
    with pytest.raises(TypeError, match=r"^Expected 'edge_bias' to be of the features' dtype torch.float32"):
        conv(torch.randn(5, 4), edge_index, edge_bias=bias)
    same = conv(torch.randn(5, 4), edge_index, edge_bias=bias.float())  # the same bias in float32 works
    assert same.shape == (5, 4) and torch.isfinite(same).all()


@pytest.mark.parametrize("impl", IMPLS)
def test_return_attention_weights_must_be_a_bool_on_both_paths(impl):
    with pytest.raises(TypeError, match=r"^Expected 'return_attention_weights' to be a bool \(got 1\)"):
        AttentionConv(4, 4, impl=impl)(torch.randn(3, 4), _complete(3), return_attention_weights=1)


@pytest.mark.parametrize("impl", IMPLS)
def test_torchscript_is_refused_and_torch_export_equals_eager(impl):
    """``torch.jit.trace``/``script`` would freeze one graph's kernel choice: a clear refusal naming the way
    that works; ``torch.export`` (the suggested one) traces ``propagate`` and equals the eager layer."""
    conv = AttentionConv(4, 6, heads=3, impl=impl).eval()
    x, edge_index = torch.randn(5, 4), patterns.causal().edge_index(5)
    with pytest.raises(NotImplementedError, match=r"torch.jit.trace.*torch.compile.*torch.export"):
        torch.jit.trace(conv, (x, edge_index))
    with pytest.raises(NotImplementedError, match=r"torch.jit.script.*torch.compile.*torch.export"):
        torch.jit.script(conv)
    exported = torch.export.export(conv, (x, edge_index))
    assert_close(exported.module()(x, edge_index), conv(x, edge_index))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("impl", IMPLS)
def test_random_graph_equals_the_oracle_on_cuda(impl):
    """AttentionConv on cuda (float64, bipartite, empty rows) equals the dense oracle on the CPU."""
    dtype = torch.float64
    conv, oracle = _oracle_pair((5, 4), 12, 2, dtype)
    conv = conv.cuda()
    conv.impl = impl
    x_kv, x_q = torch.randn(30, 5, dtype=dtype), torch.randn(20, 4, dtype=dtype)
    mask = torch.rand(20, 30) < 0.2
    mask[3] = False
    edge_index = graphs.mask_to_edge_index(mask)
    out, (_, alpha) = conv((x_kv.cuda(), x_q.cuda()), edge_index.cuda(), return_attention_weights=True)
    ref, ref_w = oracle((x_kv, x_q), mask)
    assert out.is_cuda
    assert_close(out.cpu(), ref)
    assert_close(_scatter_weights(edge_index, alpha.cpu(), 20, 30), ref_w)
    grad = torch.randn(out.shape, dtype=dtype)
    out.backward(grad.cuda())
    ref.backward(grad)
    for name, p in conv.named_parameters():
        assert_close(p.grad.cpu(), dict(oracle.named_parameters())[name].grad)


def test_mis_sized_sparse_adjacency_names_edge_index_not_size():
    """A sparse adjacency whose shape contradicts the features is blamed as 'edge_index' (no size was given)."""
    conv = AttentionConv(8, 8, heads=2)
    x = torch.randn(5, 8)
    adj = torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 2]]), torch.ones(2), (6, 6))
    with pytest.raises(ValueError, match=r"'edge_index'.*\(5, 5\).*\(6, 6\)"):
        conv(x, adj)
    with pytest.raises(ValueError, match=r"'size'"):
        conv(x, torch.tensor([[0, 1], [1, 2]]), size=(6, 6))
