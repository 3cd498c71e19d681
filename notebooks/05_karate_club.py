# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 5. The attention layer as a GNN layer: Zachary's karate club
#
# `AttentionConv` computes attention over the edges you give it. On a token
# sequence with the complete graph it is a Transformer layer; on a real graph
# it is a graph-attention layer that reads only the neighbours. Here we train
# it for node classification on Zachary's karate club (34 members, 78
# friendships; PyTorch Geometric's `KarateClub` ships the data, no download),
# next to two PyG layers:
#
# - `GATConv` (Velickovic et al. 2018): additive attention, and it **adds
#   self-loops by default**;
# - `TransformerConv` (Shi et al. 2021): dot-product attention like ours, plus
#   a **root term** `W x_i` by default.
#
# `AttentionConv` adds nothing: the graph you pass is the attention you get, so
# we add the self-loops ourselves. Then we ask what positional information does
# for a graph whose nodes carry no features: Laplacian eigenvectors
# (Dwivedi et al. 2020) play the role of position encodings.

# %%
import time
import warnings

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm.auto without ipywidgets

import matplotlib.pyplot as plt
import networkx as nx
import pandas as pd
import torch
import torch.nn.functional as F
import torch_geometric.transforms as T
from torch import nn
from torch_geometric.datasets import KarateClub
from torch_geometric.nn import GATConv, TransformerConv
from torch_geometric.utils import add_self_loops, get_laplacian, to_dense_adj

import graphattn as ga

torch.set_num_threads(1)  # 34 nodes: one thread is fastest, and fair to the other work on the machine
pd.set_option("display.float_format", "{:.3f}".format)
data = KarateClub()[0]
data

# %% [markdown]
# The dataset is the graph networkx ships as `karate_club_graph()`: the 78
# undirected friendships are 156 directed edges, one in each direction. The
# node features are one-hot identities (34 dimensions), the labels are four
# communities, and one node per community is labelled for training; the other
# 30 are the test set.

# %%
G = nx.karate_club_graph()
pyg_edges = set(map(tuple, data.edge_index.T.tolist()))
assert data.num_nodes == G.number_of_nodes() == 34 and data.edge_index.size(1) == 2 * G.number_of_edges() == 156
assert pyg_edges == {(u, v) for u, v in G.edges()} | {(v, u) for u, v in G.edges()}
assert torch.equal(data.x, torch.eye(34)) and int(data.train_mask.sum()) == 4
assert sorted(data.y[data.train_mask].tolist()) == [0, 1, 2, 3]

# %% [markdown]
# ## Same computation as TransformerConv without its root term
#
# `AttentionConv` and `TransformerConv` share the parameter names `lin_query`,
# `lin_key`, `lin_value`. With `root_weight=False` (no skip term) and without our
# output projection, copying the weights gives identical outputs. `GATConv`,
# asked for its attention, returns 190 edges for the 156 we passed: the 34
# self-loops it added.

# %%
torch.manual_seed(0)
tconv = TransformerConv(34, 4, heads=2, root_weight=False)
aconv = ga.AttentionConv(34, 8, heads=2, output_projection=False)
aconv.load_state_dict({k: v for k, v in tconv.state_dict().items() if k.startswith(("lin_query", "lin_key", "lin_value"))})
difference = (aconv(data.x, data.edge_index) - tconv(data.x, data.edge_index)).abs().max().item()
_, (gat_edges, gat_alpha) = GATConv(34, 4, heads=2)(data.x, data.edge_index, return_attention_weights=True)
_, (our_edges, our_alpha) = aconv(data.x, data.edge_index, return_attention_weights=True)
print("max |AttentionConv - TransformerConv(root_weight=False)|:", difference)
print("edges in the attention: GATConv", gat_edges.size(1), " AttentionConv", our_edges.size(1))

# %%
assert difference < 1e-6
assert gat_edges.size(1) == 156 + 34 and our_edges.size(1) == 156

# %% [markdown]
# ## Positions for a graph: Laplacian eigenvectors
#
# A sequence has positions 0, 1, 2, ...; a graph has none. The eigenvectors of
# the normalised Laplacian `L = I - D^{-1/2} A D^{-1/2}` with the smallest
# non-zero eigenvalues vary slowly over the graph and give each node
# coordinates. `AddLaplacianEigenvectorPE(k=4)` stores four of them (with random
# signs, since an eigenvector's sign is arbitrary).

# %%
torch.manual_seed(0)
data = T.AddLaplacianEigenvectorPE(k=4, attr_name="pe", is_undirected=True)(data)
lap_index, lap_weight = get_laplacian(data.edge_index, normalization="sym", num_nodes=34)
lap = to_dense_adj(lap_index, edge_attr=lap_weight, max_num_nodes=34)[0].double()  # (N, N)
eigenvalues = torch.linalg.eigvalsh(lap)
pe = data.pe.double()  # (N, 4)
rayleigh = (pe * (lap @ pe)).sum(0) / (pe * pe).sum(0)  # the eigenvalue of each column
print("eigenvalues of the columns:", rayleigh.tolist())
print("smallest eigenvalues of L :", eigenvalues[:5].tolist())

# %%
assert torch.allclose(lap @ pe, pe * rayleigh, atol=1e-5)  # each column is an eigenvector
assert torch.allclose(rayleigh, eigenvalues[1:5], atol=1e-5)  # the four after the trivial 0
assert abs(eigenvalues[0].item()) < 1e-6

# %% [markdown]
# ## Training: three layers, three kinds of input
#
# Two layers (16 hidden channels, 2 heads, then 4 classes), Adam, 150 epochs on
# the 4 labelled nodes, three seeds each. Inputs:
#
# - **one-hot**: the identity features;
# - **constant**: every node gets the feature 1;
# - **constant + Laplacian PE**: the constant and the four eigenvectors.

# %%
EDGES_WITH_SELF, _ = add_self_loops(data.edge_index, num_nodes=data.num_nodes)


class Net(nn.Module):
    def __init__(self, layer, in_channels, hidden=16, heads=2, classes=4):
        super().__init__()
        self.layer = layer
        if layer == "AttentionConv":  # self-loops added explicitly, to the graph
            self.conv1 = ga.AttentionConv(in_channels, hidden, heads=heads)
            self.conv2 = ga.AttentionConv(hidden, classes, heads=1)
        elif layer == "GATConv":  # adds its own self-loops
            self.conv1 = GATConv(in_channels, hidden // heads, heads=heads)
            self.conv2 = GATConv(hidden, classes, heads=1)
        else:  # TransformerConv: root term W x_i instead of a self-loop
            self.conv1 = TransformerConv(in_channels, hidden // heads, heads=heads)
            self.conv2 = TransformerConv(hidden, classes, heads=1)

    def forward(self, x, edge_index):
        edge_index = EDGES_WITH_SELF if self.layer == "AttentionConv" else edge_index
        return self.conv2(F.elu(self.conv1(x, edge_index)), edge_index)


INPUTS = {
    "one-hot": data.x,
    "constant": torch.ones(34, 1),
    "constant + Laplacian PE": torch.cat([torch.ones(34, 1), data.pe], dim=1),
}
test = ~data.train_mask


def train(layer, inputs, seed, epochs=150):
    torch.manual_seed(seed)
    x = INPUTS[inputs]
    model = Net(layer, x.size(1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    for _ in range(epochs):
        opt.zero_grad()
        loss = F.cross_entropy(model(x, data.edge_index)[data.train_mask], data.y[data.train_mask])
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        out = model(x, data.edge_index)
    return dict(layer=layer, inputs=inputs, seed=seed,
                accuracy=(out.argmax(1)[test] == data.y[test]).float().mean().item(),
                spread=(out - out[0]).abs().max().item())  # 0 = every node got the same output


start = time.perf_counter()
runs = pd.DataFrame([train(layer, inputs, seed) for layer in ("AttentionConv", "GATConv", "TransformerConv")
                     for inputs in INPUTS for seed in range(3)])
print(f"{len(runs)} trainings in {time.perf_counter() - start:.1f} s")
summary = runs.pivot_table(index="layer", columns="inputs", values="accuracy", aggfunc=["mean", "std"])
summary

# %%
fig, ax = plt.subplots(figsize=(7, 3))
means = runs.groupby(["inputs", "layer"]).accuracy.mean().unstack()
means.plot.bar(ax=ax, rot=0, yerr=runs.groupby(["inputs", "layer"]).accuracy.std().unstack(), capsize=3)
majority = data.y[test].bincount().max().item() / test.sum().item()
ax.axhline(majority, color="black", linestyle="--", linewidth=1, label="majority class")
ax.set_ylabel("test accuracy (30 nodes)")
ax.set_xlabel("")
ax.set_ylim(0, 1.15)
ax.legend(fontsize=8, loc="upper left", ncol=4)
fig.tight_layout()

# %% [markdown]
# Measured:
#
# - With **constant** inputs no layer can tell the nodes apart. Every node
#   starts equal, so every query, key and value is equal, every weighted
#   average of equal values is that value, and each layer outputs the same row
#   for all 34 nodes (spread at float32 rounding). The accuracy is at most the
#   majority-class share of the test set (12 of 30 = 0.4). Attention on a
#   graph, like any message passing, needs something that distinguishes nodes.
# - **Laplacian eigenvectors** supply it: with the same constant input plus
#   four eigenvectors, every layer averages above 0.6 test accuracy from one
#   labelled node per class.
# - With **one-hot** identities every layer also beats the majority baseline.
#
# We do not rank the three layers: three seeds on 30 test nodes do not
# support it (see the standard deviations).

# %%
const = runs[runs.inputs == "constant"]
assert (const.spread < 1e-5).all()
assert (const.accuracy <= majority + 1e-6).all() and abs(majority - 0.4) < 1e-9
mean_acc = runs.groupby(["layer", "inputs"]).accuracy.mean()
for layer in ("AttentionConv", "GATConv", "TransformerConv"):
    assert mean_acc[layer, "constant + Laplacian PE"] > 0.6
    assert mean_acc[layer, "constant + Laplacian PE"] > mean_acc[layer, "constant"] + 0.2
    assert mean_acc[layer, "one-hot"] > majority
assert (runs[runs.inputs != "constant"].spread > 1.0).all()

# %% [markdown]
# ## Worked example: constant inputs
#
# With constant inputs every node's output is the same: equal inputs give
# equal queries, keys and values, and any weighted average of equal values is
# that value. Measured above as the spread of the outputs:

# %%
assert (runs[runs.inputs == "constant"].spread < 1e-5).all()

# %% [markdown]
# ## Exercises
#
# Fill in each `...` and run the cell: the checker under it says whether your
# answer is right and, if not, what is likely wrong. Solutions are in
# `notebooks/solutions/05_karate_club.py` (try first).
#
# 1. How many edges does `AttentionConv` attend along in `Net`?

# %%
from graphattn.exercises import check_karate_edges, check_relabelled_edges

answer_1 = ...  # your code: an int
check_karate_edges(answer_1)

# %% [markdown]
# 2. Relabel the 34 members with the permutation `perm` below: the new node
#    `n` holds the old node `perm[n]` (features `data.x[perm]`). Renumber
#    `EDGES_WITH_SELF` to match. Then check that an untrained `AttentionConv`
#    gives the relabelled outputs (attention along a graph is
#    permutation-equivariant).

# %%
perm = torch.randperm(34, generator=torch.Generator().manual_seed(0))
answer_2 = ...  # your code: the renumbered (2, E) edge_index
check_relabelled_edges(answer_2, EDGES_WITH_SELF, perm)
