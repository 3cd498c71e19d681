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


# -- one model loader, one max-length check, one pooling (interop), used by the experiment (prune) --------


def test_the_experiment_uses_the_bridges_loader_length_check_and_pooling():
    from graphattn.interop import hf, local
    from graphattn.prune import models

    assert models.load_model is hf.load_local and ga.prune.load_model is hf.load_local
    assert models.check_max_length is hf.check_max_length
    assert models.pool is hf.pool and models.POOLINGS is hf.POOLINGS
    assert models.model_path is local.model_path and models.model_config is local.model_config
    assert models.default_pooling is local.default_pooling
    assert models.IMPLEMENTATION is hf.IMPLEMENTATION


def test_each_mechanism_is_defined_once_in_the_package():
    sources = {p: p.read_text() for p in (ROOT / "graphattn").rglob("*.py")}
    for name in ("check_max_length", "model_path", "model_config", "default_pooling", "pool", "place"):
        where = [str(p.relative_to(ROOT)) for p, text in sources.items() if f"\ndef {name}(" in text]
        assert len(where) == 1, (name, where)
    assert not any("def threshold_keep(" in text for text in sources.values())
    assert not any(".clamp(min=1e-9)" in t for p, t in sources.items() if p.name != "hf.py")  # mean pooling


def test_pool_equals_a_per_sequence_reference():
    """Mean over each row's real tokens and its first real token, left and right padding, by a Python loop."""
    from graphattn.interop.hf import pool

    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(3, 6, 4, generator=gen, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    mean, cls = [], []
    for b in range(3):
        rows = [hidden[b, t] for t in range(6) if mask[b, t]]
        mean.append(sum(rows) / len(rows))
        cls.append(rows[0])
    assert_close(pool(hidden, mask), torch.stack(mean))
    assert torch.equal(pool(hidden, mask, "cls"), torch.stack(cls))
    with pytest.raises(ValueError, match="^Expected 'pooling' to be one of 'mean', 'cls'"):
        pool(hidden, mask, "max")


class _WordIds:
    """A tokenizer of space-separated integers (each its own id), truncating and padding on the right."""

    def __call__(self, texts, max_length, padding=False, return_tensors=None, **kwargs):
        ids = [[int(w) for w in t.split()][:max_length] for t in texts]
        if return_tensors is None:
            return {"input_ids": ids}
        width = max(len(i) for i in ids)
        return _Batch(
            input_ids=torch.tensor([i + [0] * (width - len(i)) for i in ids]),
            attention_mask=torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids]),
        )


class _Batch(dict):
    def to(self, device):
        return self


def _tiny_bert(**overrides):
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    sizes = dict(vocab_size=40, hidden_size=12, num_hidden_layers=2, num_attention_heads=3, intermediate_size=16)
    config = BertConfig(**{**sizes, "max_position_embeddings": 32, **overrides})
    return BertModel(config).double().eval()


def test_the_experiments_encode_and_the_bridges_sentence_embeddings_pool_alike():
    """Both equal one text at a time, unpadded, mean-pooled by hand and normalised (float64 model)."""
    pytest.importorskip("transformers")
    from graphattn.interop.hf import sentence_embeddings
    from graphattn.prune.models import encode

    model = _tiny_bert()
    texts = ["1 2 3 4 5 6 7", "8 9", "10 11 12 13", "14 15 16 17 18 19 20 21 22"]
    want = []
    for text in texts:
        ids = torch.tensor([[int(w) for w in text.split()][:8]])
        with torch.no_grad():
            hidden = model(input_ids=ids).last_hidden_state[0]  # (n, F)
        mean = hidden.mean(0)
        want.append(mean / mean.norm())
    want = torch.stack(want)
    emb, nll = encode(model, _WordIds(), texts, max_length=8, batch_size=3)
    assert nll is None and emb.dtype == torch.float32
    assert_close(emb, want.float(), atol=1e-6, rtol=1e-6)
    assert_close(sentence_embeddings(model, _WordIds(), texts, batch_size=3, max_length=8), want)


def test_one_max_length_check_names_the_argument_the_limit_and_the_value():
    pytest.importorskip("transformers")
    from transformers import GPT2Config

    from graphattn.interop.hf import check_max_length

    model = _tiny_bert()
    for owner in (model, model.config):  # a model or its config
        assert check_max_length(owner, 32) == 32
        assert check_max_length(owner, None, default=256) == 32  # the default, capped at the positions
        with pytest.raises(ValueError) as err:
            check_max_length(owner, 33)
        assert str(err.value) == (
            "Expected 'max_length' to be at most the model's 32 positions (config.max_position_embeddings) (got 33)"
        )
    assert check_max_length(GPT2Config(n_positions=16), 16) == 16
    with pytest.raises(ValueError, match="at most the model's 16 positions"):
        check_max_length(GPT2Config(n_positions=16), 17)
    with pytest.raises(ValueError, match=r"^Expected 'max_length' to be an int >= 8"):
        check_max_length(model, 4, low=8)


def test_model_path_refuses_what_is_not_a_local_model(tmp_path):
    from graphattn.interop.local import model_path

    assert model_path(tmp_path) == str(tmp_path)
    with pytest.raises(ValueError, match=r"^Expected 'source' to be a local model folder .*nothing is downloaded"):
        model_path("no-such-model-package")


# -- one placement of a pattern on each sequence's own tokens ----------------------------------------------


def _valid_tokens():
    """Right padding, left padding, no padding, a gap: (4, 7) bool, True = a real token."""
    return torch.tensor(
        [
            [1, 1, 1, 1, 0, 0, 0],
            [0, 0, 1, 1, 1, 1, 1],
            [1, 1, 1, 1, 1, 1, 1],
            [1, 0, 1, 1, 0, 1, 0],
        ],
        dtype=torch.bool,
    )


def _placed_by_hand(tokens, mask_of):
    """Sequence b's mask over its n tokens, entry by entry at (position of token a, position of token c)."""
    num_b, num_k = tokens.shape
    out = []
    for b in range(num_b):
        where = [t for t in range(num_k) if tokens[b, t]]
        mask = mask_of(len(where))  # (..., n, n)
        grid = torch.zeros(*mask.shape[:-2], num_k, num_k, dtype=torch.bool)
        for a, qa in enumerate(where):
            for c, kc in enumerate(where):
                grid[..., qa, kc] = mask[..., a, c]
        out.append(grid)
    return torch.stack(out)


def test_place_equals_placing_by_hand():
    from graphattn.interop.masks import place

    tokens = _valid_tokens()
    pattern = ga.patterns.window(1, 2) | ga.patterns.global_tokens([0])
    assert torch.equal(place(tokens, pattern.mask), _placed_by_hand(tokens, pattern.mask))
    heads = lambda n: torch.stack([ga.patterns.causal().mask(n), ga.patterns.window(0, 1).mask(n)])  # noqa: E731
    assert torch.equal(place(tokens, heads, (2,)), _placed_by_hand(tokens, heads))
    assert place(tokens[:0], pattern.mask).shape == (0, 7, 7)


def test_the_bridge_and_the_experiment_place_a_pattern_alike():
    """prune's Spec and interop's pattern_mask both call masks.place, and agree edge for edge."""
    from graphattn.interop import masks
    from graphattn.prune import keep
    from graphattn.prune.specs import parse_spec

    assert keep.place is masks.place
    tokens = _valid_tokens()
    num_b, num_k = tokens.shape
    graph = masks.graph_from_mask(torch.ones(num_b, 1, num_k, num_k, dtype=torch.bool), None, tokens)
    valid = tokens[:, None, :, None] & tokens[:, None, None, :]  # (B, 1, S, S): the model's graph
    for text in ("window:1", "longformer:window=2,global=cls", "bigbird:block=2,random=1"):
        spec = parse_spec(text)
        bridge = masks.pattern_mask(spec.pattern, graph)  # (B, 1, S, S)
        experiment = spec.keep(torch.rand(num_b, 3, num_k, num_k), valid)  # (B, 1, S, S)
        assert torch.equal(bridge, experiment), text
        assert torch.equal(experiment, _placed_by_hand(tokens, spec.pattern.mask).unsqueeze(1)), text


def test_per_head_draws_are_placed_by_the_same_function():
    from graphattn.prune.specs import parse_spec

    spec = parse_spec("random:2,per=head")
    tokens = _valid_tokens()
    valid = tokens[:, None, :, None] & tokens[:, None, None, :]  # (B, 1, S, S)
    got = spec.keep(torch.rand(4, 3, 7, 7), valid, layer=1)  # (B, H, S, S)
    want = _placed_by_hand(tokens, lambda n: torch.stack([spec.rule.at(n, 1, h) for h in range(3)]))
    assert torch.equal(got, want)


# -- one threshold ------------------------------------------------------------------------------------------


def test_threshold_mask_is_the_one_threshold():
    from graphattn.prune.specs import parse_spec

    gen = torch.Generator().manual_seed(2)
    weights = torch.rand(2, 3, 5, 5, generator=gen).softmax(-1)  # (B, H, L, S)
    tau = 0.2
    by_hand = torch.tensor([[[[w >= tau for w in row] for row in head] for head in seq] for seq in weights.tolist()])
    assert torch.equal(ga.patterns.threshold_mask(weights, tau), by_hand)
    assert torch.equal(ga.patterns.threshold(weights[1, 2], tau).mask(), by_hand[1, 2])
    spec = parse_spec(f"threshold:{tau}")
    valid = torch.ones(5, 5, dtype=torch.bool).tril()
    assert torch.equal(spec.keep(weights, valid), by_hand & valid)
    with pytest.raises(ValueError, match="^Expected 'scores' to be a Tensor without NaN"):
        ga.patterns.threshold_mask(torch.full((2, 2), float("nan")), tau)
    with pytest.raises(ValueError, match="^Expected 'tau' to be a finite float"):
        ga.patterns.threshold_mask(weights, float("inf"))


def test_the_experiments_threshold_calls_the_patterns_one(monkeypatch):
    from graphattn.prune.specs import parse_spec

    calls = []
    real = ga.patterns.threshold_mask
    monkeypatch.setattr(ga.patterns, "threshold_mask", lambda w, tau: calls.append(tau) or real(w, tau))
    parse_spec("threshold:0.3").keep(torch.rand(1, 2, 4, 4).softmax(-1))
    assert calls == [0.3]


def test_the_length_check_names_the_config_field_that_set_the_limit():
    """GPT-2's limit is ``n_positions``; the message cited ``max_position_embeddings`` for it."""
    from types import SimpleNamespace

    from graphattn.interop.hf import check_max_length

    for config, field in (
        (SimpleNamespace(n_positions=4), "n_positions"),
        (SimpleNamespace(max_position_embeddings=4), "max_position_embeddings"),
    ):
        with pytest.raises(
            ValueError,
            match=rf"^Expected 'max_length' to be at most the model's 4 positions \(config\.{field}\) \(got 5\)$",
        ):
            check_max_length(config, 5)
        assert check_max_length(config, None, default=16) == 4  # the default capped at the limit
    with pytest.raises(ValueError, match="^Expected 'max_length' to be a positive int"):
        check_max_length(SimpleNamespace(), None, default=0)  # a default is checked as a given length


@pytest.mark.parametrize(
    "hidden, mask, pooling, error, fragment",
    [
        (torch.randn(2, 4, 3), torch.ones(1, 4), "mean", ValueError, "'attention_mask' to have shape (B, T) = (2, 4)"),
        (torch.randn(4, 3), torch.ones(2, 4), "mean", ValueError, "'hidden' to be a Tensor of shape (B, T, F)"),
        (torch.randn(2, 4, 3), [[1, 1, 1, 1]] * 2, "mean", TypeError, "'attention_mask' to be a Tensor"),
        (torch.randn(2, 4, 3), torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0]]), "cls", ValueError, "to hold at least one"),
    ],
    ids=["broadcast_mask", "2d_hidden", "list_mask", "cls_of_padding"],
)
def test_pooling_refuses_what_it_would_silently_broadcast(hidden, mask, pooling, error, fragment):
    """A (1, T) mask was broadcast over B, a (T, F) hidden gave (B, F), 'cls' of a padding row gave token 0."""
    from graphattn.interop.hf import pool

    with pytest.raises(error) as err:
        pool(hidden, mask, pooling)
    assert fragment in str(err.value)


@pytest.mark.parametrize("pattern", ["full", torch.ones(2, 2), None], ids=["name", "mask", "none"])
def test_batched_attention_names_a_pattern_that_is_not_one(pattern):
    """It raised NotImplementedError with two 'Expected' sentences and the tensor's repr inside."""
    q = torch.randn(5, 2, 4)
    with pytest.raises(TypeError, match=r"^Expected 'pattern' to be a graphattn\.patterns\.Pattern.*\(got \w+\)$"):
        ga.ops.batched_attention(q, q, q, pattern, batch=torch.tensor([0, 0, 1, 1, 1]))
