"""Plots, checked through the artists they return: data, labels, orientation."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from graphattn import viz  # noqa: E402
from graphattn.graphs import edge_index_to_mask, mask_to_edge_index  # noqa: E402


@pytest.fixture
def ax():
    fig, ax = plt.subplots()
    yield ax
    plt.close(fig)


def test_heatmap_orientation_data_labels(ax):
    # L = 2 queries, S = 3 keys: a non-square map pins rows = queries, columns = keys
    w = torch.tensor([[0.5, 0.5, 0.0], [0.1, 0.2, 0.7]])
    im = viz.attention_heatmap(w, row_labels=["q0", "q1"], col_labels=["a", "b", "c"], ax=ax)
    np.testing.assert_array_equal(np.asarray(im.get_array()), w.numpy())
    assert im.get_array().shape == (2, 3)
    assert ax.get_xlabel() == "key j (source)" and ax.get_ylabel() == "query i (target)"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["q0", "q1"]
    assert im.origin == "upper"  # query 0 is the top row
    assert im.get_clim() == (0.0, pytest.approx(0.7))
    assert not np.ma.getmaskarray(im.get_array()).any()


def test_heatmap_mask_distinguishes_missing_edge_from_zero_weight(ax):
    mask = torch.tensor([[True, False], [True, True]])
    w = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # (1, 0) is an edge of weight exactly 0
    im = viz.attention_heatmap(w, mask=mask, ax=ax)
    arr = im.get_array()
    assert arr.mask.tolist() == [[False, True], [False, False]]
    assert arr[1, 0] == 0.0 and arr.mask[1, 0] == np.False_
    # the missing edge is drawn transparent over a hatched grey patch, the zero edge in the colormap
    assert im.cmap.get_bad()[3] == 0.0
    hatched = [p for p in ax.patches if p.get_hatch()]
    assert len(hatched) == 1
    assert im.cmap(im.norm(0.0))[3] == 1.0


def test_heatmap_errors(ax):
    with pytest.raises(ValueError, match="'weights'"):
        viz.attention_heatmap(torch.ones(2, 2, 2), ax=ax)
    with pytest.raises(ValueError, match="'mask'"):
        viz.attention_heatmap(torch.ones(2, 2), mask=torch.ones(2, 3, dtype=torch.bool), ax=ax)
    with pytest.raises(TypeError, match="True means may attend"):
        viz.attention_heatmap(torch.ones(2, 2), mask=torch.ones(2, 2), ax=ax)
    with pytest.raises(ValueError, match="'col_labels'"):
        viz.attention_heatmap(torch.ones(2, 2), col_labels=["a"], ax=ax)


def test_head_grid_full_maps():
    w = torch.rand(2, 3, 4, 4).softmax(-1)  # (layers, H, L, S)
    fig = plt.figure()
    images = viz.head_grid(w, tokens=list("abcd"), fig=fig)
    assert images.shape == (2, 3)
    for layer in range(2):
        for h in range(3):
            np.testing.assert_allclose(np.asarray(images[layer, h].get_array()), w[layer, h].double().numpy())
    assert images[0, 2].axes.get_title() == "head 2"
    assert [t.get_text() for t in images[1, 0].axes.get_xticklabels()] == list("abcd")
    for im in images.flat:
        assert im.get_clim() == (0.0, pytest.approx(float(w.max())))
    plt.close(fig)


def test_head_grid_one_query():
    w = torch.rand(2, 3, 4, 5).softmax(-1)  # (layers, H, L, S), L != S
    fig = plt.figure()
    images = viz.head_grid(w, tokens=list("abcde"), query=1, fig=fig)
    assert images.shape == (2,)
    for layer in range(2):
        np.testing.assert_allclose(np.asarray(images[layer].get_array()), w[layer, :, 1, :].double().numpy())
        assert images[layer].get_array().shape == (3, 5)  # heads on rows, keys on columns
    with pytest.raises(IndexError, match="'query'"):
        viz.head_grid(w, query=4, fig=plt.figure())
    plt.close("all")


def test_pattern_mask_from_mask_and_pattern(ax):
    mask = torch.tril(torch.ones(4, 4, dtype=torch.bool))
    im = viz.pattern_mask(mask, ax=ax)
    np.testing.assert_array_equal(np.asarray(im.get_array()), mask.double().numpy())
    assert "10 edges" in ax.get_title()

    class Causal:  # the duck type of graphattn.patterns objects
        name = "causal"

        def mask(self, L, S=None):
            return torch.tril(torch.ones(L, L if S is None else S, dtype=torch.bool))

    im2 = viz.pattern_mask(Causal(), 5, ax=ax)
    assert ax.get_title().startswith("causal: 15 edges")
    with pytest.raises(ValueError, match="'L'"):
        viz.pattern_mask(Causal(), ax=ax)
    assert im2.get_array().shape == (5, 5)


def test_attention_graph_widths_follow_alpha(ax):
    mask = torch.tensor([[True, False, False], [True, True, False], [False, True, True]])
    edge_index = mask_to_edge_index(mask)  # (2, 5)
    alpha = torch.tensor([[1.0, 1.0], [0.2, 0.4], [0.8, 0.6], [0.5, 0.5], [0.5, 0.5]])  # (E, H)
    coll = viz.attention_graph(edge_index, alpha, tokens=["x", "y", "z"], ax=ax)
    expected = 6.0 * alpha.mean(1).numpy() / alpha.mean(1).max().item()
    np.testing.assert_allclose(coll.get_linewidths(), expected)
    # segment k goes from key j (x = 0, y = -j) to query i (x = 1, y = -i)
    for seg, (j, i) in zip(coll.get_segments(), edge_index.T.tolist()):
        np.testing.assert_allclose(seg, [[0.0, -j], [1.0, -i]])
    coll1 = viz.attention_graph(edge_index, alpha, ax=ax, head=1, min_weight=0.45)
    assert len(coll1.get_segments()) == 4  # 0.4 is dropped
    assert [t.get_text() for t in ax.get_xticklabels()] == ["key j (source)", "query i (target)"]
    texts = {t.get_text() for t in ax.texts}
    assert {"x", "y", "z"} <= texts
    # round trip sanity: the drawn edges are the mask's edges
    assert edge_index_to_mask(edge_index, 3).equal(mask)


def test_pareto_front_and_series(ax):
    rows = [
        dict(family="window", density=0.2, fidelity=0.8),
        dict(family="window", density=0.5, fidelity=0.95),
        dict(family="random", density=0.3, fidelity=0.7),  # dominated by window 0.2
        dict(family="random", density=0.1, fidelity=0.5),
        dict(family="full", density=1.0, fidelity=1.0),
    ]
    lines = viz.pareto(rows, ax=ax)
    assert [ln.get_label() for ln in lines] == ["window", "random", "full", "Pareto front"]
    np.testing.assert_allclose(lines[1].get_xdata(), [0.1, 0.3])  # sorted by density
    np.testing.assert_allclose(lines[-1].get_xdata(), [0.1, 0.2, 0.5, 1.0])
    np.testing.assert_allclose(lines[-1].get_ydata(), [0.5, 0.8, 0.95, 1.0])
    lines = viz.pareto(rows, ax=ax, higher_is_better=False)  # now lower y wins: only the two cheapest
    np.testing.assert_allclose(lines[-1].get_xdata(), [0.1])
    with pytest.raises(ValueError, match="'fidelity'"):
        viz.pareto([dict(family="a", density=0.1)], ax=ax)


def test_pareto_accepts_dataframe(ax):
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame(dict(family=["a", "a"], density=[0.5, 0.1], fidelity=[0.9, 0.2]))
    lines = viz.pareto(df, ax=ax)
    np.testing.assert_allclose(lines[0].get_xdata(), [0.1, 0.5])
