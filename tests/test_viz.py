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


def test_pareto_marks_families_that_need_dense_scores(ax):
    rows = [
        dict(family="window", density=0.2, fidelity=0.8),
        dict(family="topk", density=0.2, fidelity=0.9),
        dict(family="oracle top-k", density=0.3, fidelity=0.95),
        dict(family="full", density=1.0, fidelity=1.0),
    ]
    lines = viz.pareto(rows, ax=ax)
    assert [ln.get_label() for ln in lines] == [
        "window",
        "topk (needs dense scores)",
        "oracle top-k (needs dense scores)",
        "full",
        "Pareto front",
    ]
    assert [ln.get_linestyle() for ln in lines[:4]] == ["-", ":", ":", "-"]
    assert lines[1].get_markerfacecolor() == "none" and lines[0].get_markerfacecolor() != "none"
    lines = viz.pareto(rows, ax=ax, needs_dense=["window"])  # explicit: only those named
    assert [ln.get_label() for ln in lines[:2]] == ["window (needs dense scores)", "topk"]


def test_pareto_accepts_dataframe(ax):
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame(dict(family=["a", "a"], density=[0.5, 0.1], fidelity=[0.9, 0.2]))
    lines = viz.pareto(df, ax=ax)
    np.testing.assert_allclose(lines[0].get_xdata(), [0.1, 0.5])


def test_heatmap_colorbar_shared_scale_and_numbers(ax):
    w = torch.tensor([[0.2, 0.8], [0.6, 0.4]])
    im = viz.attention_heatmap(w, ax=ax, vmin=0.0, vmax=1.0)
    assert im.get_clim() == (0.0, 1.0) and im.colorbar is not None
    assert im.colorbar.ax.get_ylabel() == "attention weight"
    # annotate=None writes the numbers of a small map, at the cell (x = j, y = i)
    assert sorted((t.get_position(), t.get_text()) for t in ax.texts) == sorted(
        ((j, i), f"{w[i, j]:.2f}") for i in range(2) for j in range(2)
    )
    fig2, ax2 = plt.subplots()
    im2 = viz.attention_heatmap(torch.rand(12, 12), ax=ax2, colorbar=False)
    assert im2.colorbar is None and not ax2.texts  # 12 x 12: too large for numbers by default
    viz.attention_heatmap(torch.rand(12, 12), ax=ax2, annotate=True, colorbar=False)
    assert len(ax2.texts) == 144
    # a difference map: the scale reaches below 0; a bad explicit scale is refused
    im3 = viz.attention_heatmap(torch.tensor([[-0.5, 0.25]]), ax=ax2, colorbar=False)
    assert im3.get_clim() == (-0.5, 0.25)
    with pytest.raises(ValueError, match="'vmax'"):
        viz.attention_heatmap(w, ax=ax2, vmin=1.0, vmax=0.5)
    plt.close(fig2)


def test_heatmap_integer_ticks_and_thinned_labels(ax):
    viz.attention_heatmap(torch.rand(6, 6), ax=ax, colorbar=False)
    ax.figure.canvas.draw()
    assert all(float(t).is_integer() for t in ax.get_xticks()) and all(float(t).is_integer() for t in ax.get_yticks())
    fig2, ax2 = plt.subplots()
    labels = [f"t{n}" for n in range(100)]
    viz.attention_heatmap(torch.rand(100, 100), labels, labels, ax=ax2, colorbar=False, max_labels=25)
    assert [t.get_text() for t in ax2.get_xticklabels()] == labels[::4]  # every 4th: they do not overlap
    plt.close(fig2)


def test_pattern_mask_integer_ticks_and_legend(ax):
    viz.pattern_mask(torch.tril(torch.ones(6, 6, dtype=torch.bool)), ax=ax)
    ax.figure.canvas.draw()
    for ticks in (ax.get_xticks(), ax.get_yticks()):
        assert all(float(t).is_integer() for t in ticks)  # never a tick at 2.5
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["edge j -> i (may attend)", "no edge"]


@pytest.mark.parametrize("origin", ["upper", "lower"])
def test_head_grid_query_zero_on_top_whatever_rcparams(origin):
    w = torch.zeros(1, 1, 3, 3)
    w[0, 0, 0] = 1.0  # only query 0 has weight
    with plt.rc_context({"image.origin": origin}):
        fig = plt.figure()
        (im,) = viz.head_grid(w, fig=fig).flat
        fig.canvas.draw()
        assert im.origin == "upper"
        top, bottom = im.axes.get_ylim()[::-1]
        assert top < bottom  # y grows downwards: row 0 (query 0) is drawn at the top
        rgba = im.make_image(fig.canvas.get_renderer(), unsampled=True)[0]  # (rows, cols, 4), top row first
        assert rgba[0, 0, :3].tolist() != rgba[-1, 0, :3].tolist()
        np.testing.assert_array_equal(rgba[0, 0], rgba[0, -1])  # the bright row is the first one
        plt.close(fig)


def test_head_grid_shared_scale_and_labels_only_when_readable():
    w = torch.rand(2, 2, 16, 16).softmax(-1)
    fig = plt.figure()
    images = viz.head_grid(w, tokens=[f"t{n}" for n in range(16)], fig=fig, vmin=0.0, vmax=0.5)
    assert all(im.get_clim() == (0.0, 0.5) for im in images.flat)
    assert not images[1, 0].axes.get_xticklabels()  # 16 labels do not fit a grid panel
    plt.close(fig)


def test_attention_graph_labels_every_node_by_default(ax):
    ei = mask_to_edge_index(torch.tril(torch.ones(3, 3, dtype=torch.bool)))
    viz.attention_graph(ei, torch.ones(ei.size(1)), ax=ax)
    assert sorted(t.get_text() for t in ax.texts) == ["0", "0", "1", "1", "2", "2"]  # keys left, queries right
    shared = viz.attention_graph(ei, torch.full((ei.size(1),), 0.5), ax=ax, vmax=1.0, max_width=4.0)
    np.testing.assert_allclose(shared.get_linewidths(), 2.0)  # 0.5 on a scale whose top is 1.0


def test_encoder_decoder_draws_the_three_graphs(ax):
    out = viz.encoder_decoder(4, 3, ax=ax)
    assert len(out["encoder"]) == 16 and len(out["decoder"]) == 6 and len(out["cross"]) == 12
    enc, dec, cross = (out["edge_index"][k] for k in ("encoder", "decoder", "cross"))
    assert edge_index_to_mask(dec, 3).equal(torch.tril(torch.ones(3, 3, dtype=torch.bool)))
    assert edge_index_to_mask(cross, (4, 3)).all() and cross[0].max() == 3 and cross[1].max() == 2
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "16 edges" in texts[0] and "6 edges" in texts[1] and "12 edges" in texts[2]


def test_multihead_one_graph_per_head_with_shapes():
    ei = mask_to_edge_index(torch.ones(4, 4, dtype=torch.bool))
    alpha = torch.rand(16, 3)
    fig = plt.figure()
    out = viz.multihead(ei, alpha, in_channels=8, out_channels=6, fig=fig)
    assert len(out["graphs"]) == 3
    np.testing.assert_allclose(out["graphs"][2].get_linewidths(), 6.0 * alpha[:, 2].numpy(), rtol=1e-6)  # one scale
    assert "(4, 3, 2)" in out["boxes"][0].get_text() and "(4, 6)" in out["boxes"][1].get_text()
    with pytest.raises(ValueError, match="'out_channels'"):
        viz.multihead(ei, alpha, in_channels=8, out_channels=7, fig=plt.figure())
    plt.close("all")


def _record():
    from graphattn.interop.records import AttentionRecord

    causal = mask_to_edge_index(torch.tril(torch.ones(3, 3, dtype=torch.bool)))  # (2, 6)
    full = mask_to_edge_index(torch.ones(3, 3, dtype=torch.bool))  # (2, 9)
    alpha_causal = torch.tensor([[1.0, 1.0], [0.5, 0.2], [0.5, 0.8], [0.1, 0.3], [0.2, 0.3], [0.7, 0.4]])
    return AttentionRecord("a b c", ["a", "b", "c"], [causal, full], [alpha_causal, torch.full((9, 2), 1 / 3)])


def test_bertviz_attention_format_and_missing_edges():
    data = viz.bertviz_attention(_record())
    assert [tuple(a.shape) for a in data["attention"]] == [(1, 2, 3, 3), (1, 2, 3, 3)]
    assert data["tokens"] == ["a", "b", "c"]
    # queries on rows: row 1 of head 1 is what query 1 reads (keys 0, 1)
    np.testing.assert_allclose(data["attention"][0][0, 1, 1].numpy(), [0.2, 0.8, 0.0])
    assert data["missing"][0].tolist() == [[False, True, True], [False, False, True], [False, False, False]]
    assert not data["missing"][1].any()
    with pytest.raises(ValueError, match="'view'"):
        viz.bertviz_view(_record(), view="neuron")


def test_bertviz_view_without_and_with_bertviz(monkeypatch):
    import sys

    with monkeypatch.context() as m:
        m.setitem(sys.modules, "bertviz", None)  # as if not installed
        with pytest.raises(ImportError, match="pip install bertviz"):
            viz.bertviz_view(_record())
    pytest.importorskip("bertviz")
    html = viz.bertviz_view(_record(), view="model")
    assert "a" in html.data and "0.8" in html.data  # the weights travel into the page's JSON
