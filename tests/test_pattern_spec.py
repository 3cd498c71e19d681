"""patterns.from_spec: the text grammar of fixed patterns against the builders it names."""

from collections.abc import Sequence

import pytest
import torch

from graphattn import patterns


@pytest.mark.parametrize(
    "text, expected",
    [
        ("full", patterns.full()),
        ("causal", patterns.causal()),
        ("window:8", patterns.window(8, 8)),
        ("window:4,2", patterns.window(4, 2)),
        ("window:left=4,right=0", patterns.window(4, 0)),
        ("window:1,1,dilation=3", patterns.window(1, 1, 3)),
        ("longformer:16", patterns.longformer(16)),
        ("longformer:window=4,global=0+7", patterns.longformer(4, [0, 7])),
        ("strided:4", patterns.strided(4)),
        ("fixed:block=4,summary=2", patterns.fixed(4, 2)),
        ("bigbird:4,1,0,0", patterns.bigbird(4, 1, 0, 0)),
        ("bigbird:block=4,random=1,seed=3", patterns.bigbird(4, random_blocks=1, seed=3)),
        ("random:3,seed=5", patterns.random(3, seed=5)),
        ("global:0+5", patterns.global_tokens([0, 5])),
        (" Window:2 | GLOBAL:0 ", patterns.window(2, 2) | patterns.global_tokens([0])),
        ("global:0|window:1&causal", patterns.global_tokens([0]) | (patterns.window(1, 1) & patterns.causal())),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_from_spec_builds_the_named_pattern(text, expected):
    pattern = patterns.from_spec(text)
    assert pattern.name == expected.name
    for n in (1, 7, 19):
        assert torch.equal(pattern.mask(n), expected.mask(n))
        assert torch.equal(pattern.edge_index(n), expected.edge_index(n))


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "empty"),
        ("window:2|", "empty"),
        ("nope:3", "unknown family 'nope'"),
        ("topk:4", "unknown family 'topk'"),
        ("window", "needs a size"),
        ("window:left=4", "give both 'left' and 'right'"),
        ("window:right=4", "give both 'left' and 'right'"),
        ("window:8,8,1,4", "at most 3 values (got 4)"),
        ("window:8,,2", "empty value"),
        ("window:x", "expected 'left' of 'window' to be an int"),
        ("window:8,size=2", "takes left, right, dilation (got 'size')"),
        ("window:-1", "non-negative"),
        ("window:3_0", "expected 'left' of 'window' to be an int"),  # Python's int() reads 30
        ("window:\u0663", "expected 'left' of 'window' to be an int"),  # an Arabic-Indic 3, int() reads 3
        ("global:1_0", "non-negative ints joined by '+'"),
        ("fixed:block=4", "missing parameter 'summary'"),
        ("random:4,seed=1,seed=2", "'seed' given twice"),
        ("longformer:window=5", "even"),
        ("global:cls", "non-negative ints joined by '+'"),
        ("global:-1", "non-negative ints"),
        ("window:8@layers=1", "graphattn.prune"),
    ],
)
def test_from_spec_refuses_in_one_line_naming_the_spec(text, fragment):
    with pytest.raises(ValueError) as err:
        patterns.from_spec(text)
    message = str(err.value)
    assert fragment in message and "\n" not in message
    assert message.startswith(f"Expected pattern spec {text!r}")


def test_from_spec_refuses_a_non_string():
    with pytest.raises(TypeError, match="'text'"):
        patterns.from_spec(8)


def test_the_grammar_is_read_off_the_builders_signatures():
    import inspect

    from graphattn.patterns import spec

    builders = {
        "window": patterns.window,
        "longformer": patterns.longformer,
        "bigbird": patterns.bigbird,
        "global": patterns.global_tokens,
        "topk": patterns.topk,
    }
    for family, builder in builders.items():
        params = [p for p in inspect.signature(builder).parameters.values() if p.name != "scores"]
        assert [key for key, _ in spec.FAMILIES[family].params] == [p.name.split("_")[0] for p in params]
        assert spec.FAMILIES[family].required == tuple(
            p.name.split("_")[0] for p in params if p.default is inspect.Parameter.empty
        )
    assert spec.FAMILIES["bigbird"].arguments["random"] == "random_blocks"
    assert spec.FAMILIES["global"].params[0][1] is spec.INDICES and spec.FAMILIES["topk"].scored


def test_a_new_decorated_builder_is_a_family_of_both_grammars(monkeypatch):
    from graphattn import prune
    from graphattn.patterns import spec

    monkeypatch.setattr(spec, "FAMILIES", dict(spec.FAMILIES))  # registration undone after the test

    @spec.spec_family("band")
    def band(width: int, first_rows: Sequence[int] = (0,), scale: float = 1.0) -> patterns.Pattern:
        return patterns.window(width, width) | patterns.global_tokens(first_rows)

    assert [key for key, _ in spec.FAMILIES["band"].params] == ["width", "first", "scale"]
    got = patterns.from_spec("band:2,first=1+3")
    assert got.name == (patterns.window(2, 2) | patterns.global_tokens([1, 3])).name
    assert torch.equal(got.mask(9), patterns.window(2, 2).mask(9) | patterns.global_tokens([1, 3]).mask(9))
    with pytest.raises(ValueError, match="missing parameter 'width'"):
        patterns.from_spec("band:first=1")
    with pytest.raises(ValueError, match="expected 'scale' of 'band' to be a number"):
        patterns.from_spec("band:2,scale=x")
    pruned = prune.parse_spec("band:1,first=cls")  # the experiment reads index lists as roles
    assert torch.equal(pruned.pattern_mask(5), patterns.window(1, 1).mask(5) | patterns.global_tokens([0]).mask(5))


def test_a_builder_with_an_unreadable_parameter_is_refused_at_registration(monkeypatch):
    from graphattn.patterns import spec

    monkeypatch.setattr(spec, "FAMILIES", dict(spec.FAMILIES))
    with pytest.raises(TypeError, match="Expected 'odd\\(shape\\)' to be annotated int, float or Sequence\\[int\\]"):

        @spec.spec_family("odd")
        def odd(shape: str) -> patterns.Pattern:
            return patterns.full()

    assert "odd" not in spec.FAMILIES
    with pytest.raises(ValueError, match="distinct spec keys .* \\(got 'first' twice\\)"):

        @spec.spec_family("twice")
        def twice(first_rows: int, first_cols: int) -> patterns.Pattern:
            return patterns.full()
