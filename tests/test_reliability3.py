"""Reliability round 3 (issue 20): the surfaces added last round refuse bad input by name, never mix or
lose results, and stay fast on odd but valid input. Each test is one row of ``docs/reliability.md``,
section "Round 3"; exactness is checked against PyG, per-graph SDPA or Hugging Face with the same weights."""

import warnings

import pytest
import torch
from torch_geometric.nn import TransformerConv as PyGTransformerConv

import graphattn as ga
from tests.conftest import assert_close


def _uncoalesced_adj_t():
    """adj_t (3, 3) with the entry (0, 1) stored twice, and the same adjacency coalesced."""
    indices = torch.tensor([[0, 0, 1, 2, 2], [1, 1, 2, 0, 2]])  # (2, nnz): rows = targets i, columns = sources j
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's note about sparse invariant checks
        adj_t = torch.sparse_coo_tensor(indices, torch.tensor([0.5, 0.25, 1.0, 2.0, 3.0]), (3, 3))
    return adj_t, adj_t.coalesce()


# -- uncoalesced COO adjacency ----------------------------------------------------------------------


def test_uncoalesced_coo_adjacency_is_read_coalesced_and_the_callers_tensor_is_left_as_it_was():
    adj_t, coalesced = _uncoalesced_adj_t()
    assert not adj_t.is_coalesced()
    edge_index, size, values = ga.graphs.to_edge_index(adj_t)
    assert not adj_t.is_coalesced()  # PyG's to_edge_index marks it coalesced in place; we never change it
    assert adj_t._nnz() == 5 and adj_t.coalesce()._nnz() == 4  # a later coalesce still merges the duplicate
    expected = coalesced.indices().flip(0)  # (2, 4): row 0 = source j, row 1 = target i
    assert torch.equal(edge_index, expected) and size == (3, 3)
    assert torch.equal(values, coalesced.values())  # the duplicate's values summed, as torch.sparse defines


@pytest.mark.parametrize("layer", ["AttentionConv", "TransformerConv"])
def test_uncoalesced_coo_adjacency_gives_the_coalesced_result_in_both_layers(layer):
    adj_t, coalesced = _uncoalesced_adj_t()
    conv = getattr(ga, layer)(4, 4, heads=2).double()
    x = torch.randn(3, 4, dtype=torch.float64)
    out, (back, alpha) = conv(x, adj_t, return_attention_weights=True)
    assert back is adj_t and alpha.shape == (4, 2)  # one weight per distinct edge
    assert_close(out, conv(x, coalesced))
    assert_close(out, conv(x, coalesced.indices().flip(0)))
    assert not adj_t.is_coalesced()


def test_uncoalesced_coo_adjacency_equals_pyg_on_the_coalesced_tensor():
    adj_t, coalesced = _uncoalesced_adj_t()
    ref = PyGTransformerConv(4, 3, heads=2).double()
    ours = ga.TransformerConv.from_transformer_conv(ref)
    x = torch.randn(3, 4, dtype=torch.float64)
    assert_close(ours(x, adj_t), ref(x, coalesced))


# -- lazy sizes on AttentionConv ------------------------------------------------------------------


@pytest.mark.parametrize(
    "in_channels,known", [((-1, -1), (3, 7)), (-1, 5), ((-1, -1, -1), (3, 2, 7))], ids=["pair", "int", "triple"]
)
def test_attention_conv_lazy_sizes_are_taken_from_the_first_call(in_channels, known):
    lazy = ga.AttentionConv(in_channels, 4, heads=2)
    assert repr(lazy) == f"AttentionConv({in_channels}, 4, heads=2)"
    widths = known if isinstance(known, tuple) else (known,)
    if len(widths) == 2:
        x = (torch.randn(5, widths[0]), torch.randn(4, widths[1]))
    elif len(widths) == 3:
        x = (torch.randn(5, widths[0]), torch.randn(5, widths[1]), torch.randn(4, widths[2]))
    else:
        x = torch.randn(5, widths[0])
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 0], [0, 1, 2, 3, 0, 2]])
    out = lazy(x, edge_index)
    sized = ga.AttentionConv(known, 4, heads=2)
    sized.load_state_dict(lazy.state_dict())
    assert_close(out, sized(x, edge_index))
    for lin in (lazy.lin_query, lazy.lin_key, lazy.lin_value):  # initialised as nn.MultiheadAttention does
        assert torch.all(lin.bias == 0)
        bound = (6 / sum(lin.weight.shape)) ** 0.5  # Xavier-uniform
        assert lin.weight.abs().max() <= bound
    wrong = x[1][:, :2] if isinstance(x, tuple) else x[:, :2]
    with pytest.raises(ValueError, match=r"Expected 'x_q' to have shape \(n, \d+\)"):
        lazy((x[0], wrong) if len(widths) == 2 else wrong if len(widths) == 1 else (*x[:2], wrong), edge_index)


def test_attention_conv_lazy_sizes_work_in_to_hetero_and_load_a_state_dict():
    from torch_geometric.nn import to_hetero

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = ga.AttentionConv((-1, -1), 8, heads=2)

        def forward(self, x, edge_index):
            return self.conv(x, edge_index)

    metadata = (["a", "b"], [("a", "to", "b"), ("b", "to", "a")])
    model = to_hetero(Net(), metadata, aggr="sum")
    x = {"a": torch.randn(4, 3), "b": torch.randn(5, 7)}
    edges = {("a", "to", "b"): torch.tensor([[0, 1, 3], [4, 0, 2]]), ("b", "to", "a"): torch.tensor([[0, 4], [1, 3]])}
    out = model(x, edges)
    assert out["a"].shape == (4, 8) and out["b"].shape == (5, 8)
    lazy = ga.AttentionConv(-1, 8, heads=2)
    lazy.load_state_dict(ga.AttentionConv(6, 8, heads=2).state_dict())  # PyG's Linear materialises on load
    assert lazy.lin_key.weight.shape == (8, 6)


def test_attention_conv_refuses_other_negative_sizes_and_a_lazy_conversion_names_in_channels():
    with pytest.raises(ValueError, match=r"Expected 'in_channels' to be positive sizes, or -1"):
        ga.AttentionConv((-2, 3), 4)
    with pytest.raises(ValueError, match=r"Expected 'in_channels' to be known sizes.*call the layer once"):
        ga.AttentionConv(-1, 4).to_multihead_attention()


# -- TransformerConv: inputs named before torch's matmul ---------------------------------------------


def test_transformer_conv_edge_attr_of_another_dtype_is_refused_naming_edge_attr():
    conv = ga.TransformerConv(6, 4, heads=2, edge_dim=3)
    x, edge_index = torch.randn(5, 6), torch.tensor([[0, 1, 2], [1, 2, 0]])
    with pytest.raises(
        TypeError,
        match=r"^Expected 'edge_attr' to be of the layer's dtype torch.float32 "
        r"\(got torch.float64\)",
    ):
        conv(x, edge_index, torch.randn(3, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"^Expected 'edge_attr' to be of shape \(n, 3\) \(got shape \(3, 2\)\)"):
        conv(x, edge_index, torch.randn(3, 2))


@pytest.mark.parametrize("impl", ["auto", "message_passing"])
def test_transformer_conv_features_of_the_wrong_width_or_swapped_pairs_name_the_argument(impl):
    conv = ga.TransformerConv(6, 4, heads=2, impl=impl)
    edge_index = torch.tensor([[0, 1, 2], [1, 2, 0]])
    with pytest.raises(ValueError, match=r"^Expected 'x' to be of shape \(n, 6\) \(got shape \(5, 5\)\)$"):
        conv(torch.randn(5, 5), edge_index)
    bipartite = ga.TransformerConv((3, 7), 4, heads=2, impl=impl)
    x_src, x_dst = torch.randn(5, 3), torch.randn(4, 7)
    assert bipartite((x_src, x_dst), edge_index).shape == (4, 8)
    with pytest.raises(
        ValueError,
        match=r"^Expected 'x_src' to be of shape \(n, 3\) \(got shape \(4, 7\)\); "
        r"a pair is \(x_src, x_dst\): sources \(keys\) first",
    ):
        bipartite((x_dst, x_src), edge_index)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), 1e38], ids=["nan", "inf", "-inf", "huge"])
def test_transformer_conv_non_finite_edge_attr_gives_pygs_result_nan_only_in_the_affected_rows(bad):
    ref = PyGTransformerConv(6, 4, heads=2, edge_dim=3)
    ours = ga.TransformerConv.from_transformer_conv(ref)  # the fast path
    x = torch.randn(5, 6)
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 1], [0, 1, 2, 3, 0, 2]])
    edge_attr = torch.randn(6, 3)
    edge_attr[1, 0] = bad  # edge 1 -> 1: only target 1 reads it
    out, (_, alpha) = ours(x, edge_index, edge_attr, return_attention_weights=True)
    out_r, (_, alpha_r) = ref(x, edge_index, edge_attr, return_attention_weights=True)
    assert torch.equal(torch.isfinite(out), torch.isfinite(out_r))
    assert torch.isfinite(out[[0, 2, 3, 4]]).all()
    torch.testing.assert_close(out, out_r, equal_nan=True)
    torch.testing.assert_close(alpha, alpha_r, equal_nan=True)


# -- sparsity(model, Pattern) with the KV cache -----------------------------------------------------


def _gpt2_lm():
    """A local GPT-2 with random weights (no download), running graph attention."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=2, n_head=4, n_embd=32, vocab_size=97, n_positions=64, bos_token_id=0, eos_token_id=0, pad_token_id=0
    )
    torch.manual_seed(1234)
    model = GPT2LMHeadModel(config).eval()
    ga.interop.register()
    model.set_attn_implementation("graphattn")
    return model


def _left_padded():
    ids = torch.randint(1, 97, (3, 10), generator=torch.Generator().manual_seed(5))
    attention_mask = torch.ones_like(ids)
    attention_mask[1, :3] = 0  # left padding, as generate() wants for a decoder
    attention_mask[2, :6] = 0
    return ids, attention_mask


PATTERNS = [
    pytest.param(ga.patterns.window(3, 0), id="window_3_0"),
    pytest.param(ga.patterns.window(2, 0) | ga.patterns.global_tokens([0]), id="window_2_0|global_0"),
    pytest.param(ga.patterns.strided(3), id="strided_3"),
]


@pytest.mark.filterwarnings("ignore:The graphattn.interop mask-graph cache")  # generate() makes a mask per step
@pytest.mark.parametrize("pattern", PATTERNS)
def test_sparsity_with_the_kv_cache_in_generate_gives_the_uncached_tokens(pattern):
    model = _gpt2_lm()
    ids, attention_mask = _left_padded()
    kwargs = dict(
        attention_mask=attention_mask,
        max_new_tokens=10,
        do_sample=False,
        output_scores=True,
        return_dict_in_generate=True,
    )
    with ga.interop.sparsity(model, pattern):
        uncached = model.generate(ids, use_cache=False, **kwargs)
        cached = model.generate(ids, use_cache=True, **kwargs)
    assert torch.equal(cached.sequences, uncached.sequences)
    for a, b in zip(cached.scores, uncached.scores):
        assert_close(a, b, torch.float32, atol=1e-4)  # the same logits at every step
    plain = model.generate(ids, use_cache=True, **kwargs)
    assert not all(torch.allclose(a, b) for a, b in zip(plain.scores, cached.scores))  # the pattern matters


@pytest.mark.parametrize("pattern", PATTERNS[:2])
def test_sparsity_on_a_continuation_of_past_key_values_equals_the_whole_sequence(pattern):
    model = _gpt2_lm()
    ids, attention_mask = _left_padded()
    with torch.no_grad(), ga.interop.sparsity(model, pattern):
        whole = model(ids, attention_mask=attention_mask).logits  # (B, 10, V)
        cache = model(ids[:, :6], attention_mask=attention_mask[:, :6], use_cache=True).cache  # transformers 5's name
        rest = model(ids[:, 6:], attention_mask=attention_mask, cache=cache).logits  # (B, 4, V) for the keys 0..9
    valid = attention_mask[:, 6:].bool()  # padding rows are absent nodes in both
    assert_close(rest[valid], whole[:, 6:][valid], torch.float32, atol=1e-4)


@pytest.mark.parametrize(
    "pattern",
    [
        ga.patterns.full(),
        ga.patterns.causal(),
        ga.patterns.window(2, 1),
        ga.patterns.dilated(2, 1, 2),
        ga.patterns.longformer_window(2),
        ga.patterns.flash_window(1, 0),
        ga.patterns.global_tokens([0, 3]),
        ga.patterns.strided(3),
        ga.patterns.fixed(3, 1),
        ga.patterns.longformer(2),
        ga.patterns.window(1, 0) & ga.patterns.strided(2),
    ],
    ids=lambda p: p.name,
)
@pytest.mark.parametrize("num_q", [1, 3, 9])
def test_cached_pattern_rows_are_the_last_rows_of_the_whole_sequence(pattern, num_q):
    """The rule view the cache uses (rows S - L .. S - 1) equals the edge view of the whole sequence, with padding."""
    from graphattn.interop.masks import graph_from_mask, pattern_mask

    S = 9
    valid = torch.ones(3, S, dtype=torch.bool)
    valid[1, :2] = False  # left padding
    valid[2, :8] = False  # one token
    whole = pattern_mask(pattern, graph_from_mask(torch.ones(3, 1, S, S, dtype=torch.bool), None, valid))
    cached = pattern_mask(pattern, graph_from_mask(torch.ones(3, 1, num_q, S, dtype=torch.bool), None, valid))
    assert torch.equal(cached, whole[:, :, S - num_q :])


@pytest.mark.parametrize(
    "pattern",
    [ga.patterns.random(2, seed=3), ga.patterns.window(1, 0) | ga.patterns.random(1)],
    ids=["random_2", "window_1_0|random_1"],
)
def test_sparsity_with_a_length_dependent_pattern_and_the_kv_cache_names_use_cache(pattern):
    """Random draws depend on (L, S): cached keys saw other edges than the uncached run gives the same tokens."""
    model = _gpt2_lm()
    ids, attention_mask = _left_padded()
    with ga.interop.sparsity(model, pattern):
        model.generate(ids, attention_mask=attention_mask, max_new_tokens=2, do_sample=False, use_cache=False)
        with pytest.raises(
            NotImplementedError,
            match=r"Expected 'spec' to be a pattern whose rows do not depend "
            r"on the sequence length.*use_cache=False",
        ):
            model.generate(ids, attention_mask=attention_mask, max_new_tokens=2, do_sample=False, use_cache=True)


# -- analysis arguments -----------------------------------------------------------------------------


def test_to_networkx_with_too_few_tokens_names_tokens_and_more_tokens_are_isolated_nodes():
    from graphattn.analysis import to_networkx

    edge_index, alpha = torch.tensor([[0, 0, 1, 2], [0, 1, 1, 2]]), torch.tensor([1.0, 0.5, 0.5, 1.0])
    with pytest.raises(
        ValueError,
        match=r"^Expected 'tokens' to be a sequence of at least 3 entries, one per node "
        r"\(edge_index reaches node 2\) \(got 2\)$",
    ):
        to_networkx(edge_index, alpha, tokens=["a", "b"])
    graph = to_networkx(edge_index, alpha, tokens=["a", "b", "c", "d"])
    assert graph.number_of_nodes() == 4 and graph.degree(3) == 0 and graph.nodes[3] == {"token": "d"}
    with pytest.raises(ValueError, match=r"^Expected 'tokens' to be a sequence of 5 entries"):
        to_networkx(edge_index, alpha, tokens=["a", "b", "c", "d"], num_nodes=5)


def test_attention_rollout_and_flow_promote_mixed_float32_and_float64_layers():
    from graphattn.analysis import attention_flow, attention_rollout

    edge_index = torch.tensor([[0, 0, 1, 1, 2], [0, 1, 1, 2, 2]])
    first = torch.tensor([1.0, 0.25, 0.75, 0.5, 0.5])
    second = torch.tensor([1.0, 0.5, 0.5, 0.1, 0.9], dtype=torch.float64)
    mixed = attention_rollout(edge_index, [first, second])
    assert mixed.dtype == torch.float64
    assert_close(mixed.to_dense(), attention_rollout(edge_index, [first.double(), second]).to_dense())
    flow = attention_flow(edge_index, [first, second])
    assert_close(flow, attention_flow(edge_index, [first.double(), second]))


# -- global attention with gaps in the graph ids ----------------------------------------------------


def test_batch_sequences_loops_over_distinct_sizes_never_over_empty_sequences(monkeypatch):
    pattern = ga.patterns.window(1, 0)
    calls = []
    original = type(pattern).edge_index
    monkeypatch.setattr(type(pattern), "edge_index", lambda self, L, S=None: calls.append(L) or original(self, L, S))
    lengths = torch.zeros(10**6 + 1, dtype=torch.long)
    lengths[[0, 7, 10**6]] = torch.tensor([2, 3, 2])
    edge_index, batch = ga.graphs.batch_sequences(lengths, pattern)
    assert sorted(calls) == [2, 3]  # one build per distinct size
    expected, _ = ga.graphs.batch_sequences([2, 3, 2], pattern)  # the same nodes without the empty sequences
    assert torch.equal(edge_index, expected)
    assert batch.tolist() == [0, 0, 7, 7, 7, 10**6, 10**6]


@pytest.mark.parametrize("layer", ["AttentionConv", "TransformerConv"])
@pytest.mark.parametrize("weights", [False, True], ids=["out", "weights"])
@pytest.mark.parametrize(
    "pattern",
    [ga.patterns.full(), ga.patterns.causal(), ga.patterns.window(1, 1)],
    ids=["full", "causal", "window_1_1"],
)
def test_global_attention_cost_follows_the_nodes_not_the_largest_graph_id(layer, weights, pattern):
    """``batch = [0, 0, 10**12]``: anything sized by the largest id (a bincount, a loop over graphs) would need
    terabytes and fail at once; the result equals the same nodes numbered 0, 0, 1."""
    conv = getattr(ga, layer)(4, 4, heads=2).double()
    x = torch.randn(3, 4, dtype=torch.float64)
    flag = weights if layer == "AttentionConv" else (weights or None)  # TransformerConv: PyG 2.8, any bool -> tuple
    far = conv(x, pattern, batch=torch.tensor([0, 0, 10**12]), return_attention_weights=flag)
    near = conv(x, pattern, batch=torch.tensor([0, 0, 1]), return_attention_weights=flag)
    if weights:
        assert torch.equal(far[1][0], near[1][0])
        assert_close(far[1][1], near[1][1])
        far, near = far[0], near[0]
    assert_close(far, near)


def test_an_unsorted_batch_with_gaps_is_still_refused_naming_batch():
    conv = ga.AttentionConv(4, 4, heads=2)
    with pytest.raises(ValueError, match=r"Expected 'batch' to be sorted"):
        conv(torch.randn(3, 4), ga.patterns.full(), batch=torch.tensor([5, 0, 0]))


# -- outputs and the command line ------------------------------------------------------------------


def _imported_modules(*argv):
    """Top-level module names ``python -X importtime -m graphattn.cli ARGV`` imports."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "graphattn.cli", *argv], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")]
    return {name.split(".")[0] for name in rows[1:]}  # the first row is the header


@pytest.mark.parametrize("argv", [["--help"], ["bench", "--help"]], ids=["graphattn", "bench"])
def test_help_starts_without_importing_torch(argv):
    modules = _imported_modules(*argv)
    assert "graphattn" in modules and "torch" not in modules and "transformers" not in modules


def test_only_the_command_asked_for_is_imported():
    import subprocess
    import sys

    code = (
        "import sys; from graphattn import cli; cli.main(['bench', '--sizes', '0']); "
        "print(sorted(m for m in sys.modules if m.startswith('graphattn.cli.')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "['graphattn.cli.args', 'graphattn.cli.bench']", result.stderr[-2000:]
    assert "Expected '--sizes' to be an int in [1, 16777216] (got '0')" in result.stderr


def test_bench_writes_to_its_own_folder_in_the_current_folder_and_help_shows_every_default():
    from pathlib import Path

    from graphattn import cli

    parser = cli.build_parser(commands=("bench",))
    args = parser.parse_args(["bench"])
    assert args.out == Path("bench-out") and not args.out.is_absolute()  # never benchmarks/results in the checkout
    root = Path(__file__).resolve().parents[1]
    ignored = (root / ".gitignore").read_text().splitlines()
    assert {"bench-out/", "graphml-out/", "prune-my-text-out/"} <= set(ignored)
    import argparse

    from graphattn.cli import bench

    options = argparse.ArgumentParser()
    bench.add_arguments(options)
    for action in options._actions:
        if action.dest != "help":
            assert "(default: " in action.help, action.dest


def test_prune_example_has_its_own_default_folder():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "prune_my_text.py"
    spec = importlib.util.spec_from_file_location("prune_my_text", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.DEFAULT_OUT == "prune-my-text-out"  # graphattn prune writes prune-out/: never the same
    assert "default=DEFAULT_OUT" in path.read_text()


@pytest.mark.parametrize("pattern", [ga.patterns.full(), ga.patterns.causal()], ids=["full", "causal"])
def test_batched_attention_called_directly_skips_the_empty_graphs_of_gapped_ids(pattern):
    """``ops.batched_attention`` (what ``GPSAttention`` calls) with ids 0, 0, 10**6 and graphs of mixed sizes
    (so it groups by size): the million empty graphs join no padded call, and the result equals the same
    nodes numbered without gaps, where every graph is the per-graph SDPA reference."""
    torch.manual_seed(0)
    sizes = [2, 1, 9, 3]
    near = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))  # (N,)
    far = torch.tensor([0, 10**5, 10**6, 10**6 + 7]).repeat_interleave(torch.tensor(sizes))  # (N,) gapped
    q, k, v = (torch.randn(len(near), 2, 4, dtype=torch.float64) for _ in range(3))
    out_far, _ = ga.ops.batched_attention(q, k, v, pattern, far)
    out_near, _ = ga.ops.batched_attention(q, k, v, pattern, near)
    assert_close(out_far, out_near)
    start = 0
    for n in sizes:  # per-graph SDPA, the independent reference
        sl = slice(start, start + n)
        ref = torch.nn.functional.scaled_dot_product_attention(
            q[sl].transpose(0, 1), k[sl].transpose(0, 1), v[sl].transpose(0, 1), is_causal=pattern.name == "causal"
        ).transpose(0, 1)
        assert_close(out_far[sl], ref)
        start += n
