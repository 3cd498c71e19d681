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
# # 6. Graph transformers: attention as a GNN layer
#
# A graph engineer's first questions about attention: how is it different from
# GAT? Where does word order come from, if a layer only sees a set of nodes and
# their edges? What are Graphormer and GraphGPS in these terms? Each answer is
# measured, and the cell after each claim checks it.

# %%
import math
import time
import warnings

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm.auto without ipywidgets

import matplotlib.pyplot as plt
import networkx as nx
import pandas as pd
import torch
from torch import nn
from torch_geometric.nn import GATConv, GATv2Conv, GINConv

import graphattn as ga
from graphattn import viz

torch.manual_seed(0)  # layers draw their initial weights from torch's global generator
gen = torch.Generator().manual_seed(0)  # the data
pd.set_option("display.float_format", "{:.3f}".format)

# %% [markdown]
# ## GAT against dot-product attention: static and dynamic ranking
#
# Both are a softmax over the incoming edges of node i, followed by a weighted
# sum of messages. They differ in the score of an edge `(j, i)`:
#
# | | score `e_ij` | weights and output |
# |---|---|---|
# | GAT (Veličković et al. 2018) | `LeakyReLU(a_dst · W x_i + a_src · W x_j)` | `alpha_ij = softmax_j e_ij`, `y_i = sum_j alpha_ij W x_j` |
# | GATv2 (Brody et al. 2022) | `a · LeakyReLU(W [x_i ‖ x_j])` | same |
# | dot-product (Vaswani et al. 2017) | `(W_Q x_i) · (W_K x_j) / sqrt(D)` | `alpha_ij = softmax_j e_ij`, `y_i = sum_j alpha_ij W_V x_j` |
#
# In GAT the query enters only through the additive term `a_dst · W x_i`, and
# LeakyReLU is increasing, so for **every** query the keys are ranked by the same
# number `a_src · W x_j`: GAT's attention is *static* (Brody et al.). The dot
# product couples `x_i` and `x_j`, so each query can rank the keys differently
# (*dynamic*). Measured on the complete graph of 12 nodes with random features:
# how many different key rankings do the 12 queries produce?

# %%
N, F = 12, 16
x = torch.randn(N, F, generator=gen)
complete = ga.patterns.full().edge_index(N)  # (2, N^2), self-loops included
layers = {"GATConv": GATConv(F, F, heads=1, add_self_loops=False),
          "GATv2Conv": GATv2Conv(F, F, heads=1, add_self_loops=False),
          "AttentionConv": ga.AttentionConv(F, F, heads=1)}
weights = {}
for name, layer in layers.items():
    with torch.no_grad():
        _, (ei, alpha) = layer(x, complete, return_attention_weights=True)
    weights[name] = ga.graphs.edge_weights_to_dense(ei, alpha, (N, N))[0]  # (N, N), query i on rows
rankings = {name: len({tuple(row.argsort(descending=True).tolist()) for row in w}) for name, w in weights.items()}
top_keys = {name: len(set(w.argmax(1).tolist())) for name, w in weights.items()}
pd.DataFrame({"different key rankings (of 12 queries)": rankings, "different top keys": top_keys})

# %%
assert rankings["GATConv"] == 1 and top_keys["GATConv"] == 1  # static: one ranking for all queries
assert rankings["AttentionConv"] == N and rankings["GATv2Conv"] > 1  # dynamic
assert top_keys["AttentionConv"] > 1

# %%
fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), layout="constrained")
top = max(float(w.max()) for w in weights.values())
for ax, (name, w) in zip(axes, weights.items()):
    viz.attention_heatmap(w, ax=ax, vmin=0.0, vmax=top, title=f"{name}: alpha on the complete graph",
                          annotate=False, colorbar=ax is axes[-1])

# %% [markdown]
# In GAT's map every row has the same shape (the same columns are bright for
# every query); in the dot-product map each row picks its own keys.

# %%
order_gat = weights["GATConv"].argsort(1, descending=True)  # (N, N): keys from most to least read, per query
order_dot = weights["AttentionConv"].argsort(1, descending=True)
assert (order_gat == order_gat[0]).all() and not (order_dot == order_dot[0]).all()

# %% [markdown]
# ## Permutation equivariance: the layer sees a set
#
# Renumber the nodes with a permutation `P` (and the edges with them): the
# output is the old output renumbered, `f(P x) = P f(x)`. On the complete
# graph a sentence is then a bag of words: "dog bites man" and "man bites dog"
# give each word the same vector.

# %%
conv = ga.AttentionConv(F, F, heads=2)
perm = torch.randperm(N, generator=gen)
inverse = torch.empty_like(perm)
inverse[perm] = torch.arange(N)
ring = torch.stack([torch.arange(N), (torch.arange(N) + 1) % N])  # (2, N) a directed cycle j -> j + 1
ring_permuted = inverse[ring]  # the same edges between the renumbered nodes
with torch.no_grad():
    y, y_perm = conv(x, ring), conv(x[perm], ring_permuted)
    error = (y_perm - y[perm]).abs().max().item()
vocab = {w: torch.randn(F, generator=gen) for w in ("dog", "bites", "man")}


def encode(words, positions=None):
    tokens = torch.stack([vocab[w] for w in words])  # (L, F)
    tokens = tokens if positions is None else tokens + positions[: len(words)]
    with torch.no_grad():
        return conv(tokens, ga.patterns.full().edge_index(len(words)))


a, b = encode(["dog", "bites", "man"]), encode(["man", "bites", "dog"])
bag_error = (a[0] - b[2]).abs().max().item()  # "dog" in both sentences
print(f"max |f(Px) - P f(x)| = {error:.2e}; 'dog' in the two sentences differs by {bag_error:.2e}")

# %%
assert error < 1e-5 and bag_error < 1e-5

# %% [markdown]
# ## Where order comes from, 1: positions as node features
#
# Add a vector that depends on the position to each token before the layer:
# the sinusoidal encoding of Vaswani et al., `PE(p, 2k) = sin(p / 10000^(2k/F))`,
# `PE(p, 2k+1) = cos(...)`. The same word at two positions is then two
# different nodes, and the two sentences differ.

# %%
def sinusoidal(length, dim):
    position = torch.arange(length, dtype=torch.float32)[:, None]  # (L, 1)
    frequency = torch.exp(-math.log(10000.0) * torch.arange(0, dim, 2, dtype=torch.float32) / dim)  # (F/2,)
    pe = torch.zeros(length, dim)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(position * frequency), torch.cos(position * frequency)  # (L, F)
    return pe


pe = sinusoidal(N, F)
a, b = encode(["dog", "bites", "man"], pe), encode(["man", "bites", "dog"], pe)
ordered_error = (a[0] - b[2]).abs().max().item()
print(f"with positions, 'dog' in the two sentences differs by {ordered_error:.3f}")

# %%
assert ordered_error > 1e-2

# %% [markdown]
# ## Where order comes from, 2: positions as an edge bias (ALiBi-like)
#
# Or leave the nodes alone and put the order on the **edges**: add
# `b_ij = -m_h |i - j|` to the score of edge `(j, i)` (Press et al. 2022 use
# `-m_h (i - j)` on a causal graph; one slope `m_h` per head). This is the
# `edge_bias` argument, `(E, H)`. It equals dense attention with the bias
# added to the scaled scores, it makes a head local (weight falls with
# distance: the mean distance a query reads, `sum_j alpha_ij |i - j|`,
# shrinks), and it depends only on **relative** positions: the weights of a
# window of tokens do not change when the window moves.

# %%
H, L = 2, 10
slopes = torch.tensor([0.25, 1.0])  # (H,)
tokens = torch.randn(L + 3, F, generator=gen, dtype=torch.float64)
conv2 = ga.AttentionConv(F, F, heads=H).double()
full_L = ga.patterns.full().edge_index(L)  # (2, E)
distance = (full_L[1] - full_L[0]).abs().double()  # (E,) |i - j|
alibi = -distance[:, None] * slopes.double()  # (E, H)
with torch.no_grad():
    y_bias, (_, alpha_bias) = conv2(tokens[:L], full_L, edge_bias=alibi, return_attention_weights=True)
    q, k, v = (lin(tokens[:L]) for lin in (conv2.lin_query, conv2.lin_key, conv2.lin_value))
    bias_dense = ga.graphs.edge_weights_to_dense(full_L, alibi, (L, L))  # (H, L, S)
    reference = ga.dense.six_steps(tokens[:L], conv2.lin_query.weight.T, conv2.lin_key.weight.T,
                                   conv2.lin_value.weight.T, heads=H, b_q=conv2.lin_query.bias,
                                   b_k=conv2.lin_key.bias, b_v=conv2.lin_value.bias, bias=bias_dense)
dense_alpha = ga.graphs.edge_weights_to_dense(full_L, alpha_bias, (L, L))  # (H, L, S)
with torch.no_grad():
    _, (_, alpha_free) = conv2(tokens[:L], full_L, return_attention_weights=True)
locality = pd.DataFrame({"mean |i - j| read, no bias": (alpha_free * distance[:, None]).sum(0) / L,
                         "with -m |i - j|": (alpha_bias * distance[:, None]).sum(0) / L,
                         "slope m": slopes}, index=[f"head {h}" for h in range(H)])
locality

# %%
assert torch.allclose(dense_alpha, reference.weights, atol=1e-12)
assert torch.allclose(y_bias, conv2.lin_out(reference.output), atol=1e-12)
assert (locality["with -m |i - j|"] < locality["mean |i - j| read, no bias"]).all()  # the bias makes heads local
assert locality.loc["head 1", "with -m |i - j|"] < locality.loc["head 0", "with -m |i - j|"]  # steeper: more local


# %% [markdown]
# Relative, measured: take tokens that are *the same* at every position (so only
# positions can matter) and compare query 5's weights on the keys 1 to 8 with
# query 6's on the keys 2 to 9 (each renormalised over those 8 keys, since the
# rows end at different borders). With the ALiBi bias they are equal; with
# sinusoidal features they are not.

# %%
same = tokens[:1].repeat(L, 1)  # (L, F): every node identical
with torch.no_grad():
    _, (_, a_rel) = conv2(same, full_L, edge_bias=alibi, return_attention_weights=True)
    _, (_, a_abs) = conv2(same + sinusoidal(L, F).double(), full_L, return_attention_weights=True)


def window(w, i):  # query i's weights on keys i-4 .. i+3, renormalised over that window
    part = w[i, i - 4:i + 4]
    return part / part.sum()


rel = ga.graphs.edge_weights_to_dense(full_L, a_rel, (L, L))[0]  # (L, S) head 0
ab = ga.graphs.edge_weights_to_dense(full_L, a_abs, (L, L))[0]
shift_rel, shift_abs = (window(rel, 5) - window(rel, 6)).abs().max(), (window(ab, 5) - window(ab, 6)).abs().max()
print(f"query 5 against query 6, same relative window: ALiBi {shift_rel:.1e}, sinusoidal {shift_abs:.1e}")

# %%
assert shift_rel < 1e-12 and shift_abs > 1e-3

# %% [markdown]
# ## Graphormer's spatial encoding is an edge bias
#
# Graphormer (Ying et al. 2021) lets every node attend to every node of the
# graph (the complete graph on its nodes) and adds to the score of `(j, i)` a
# learned scalar `b_phi(i, j)` indexed by the shortest-path distance
# `phi(i, j)` between them: the graph's structure enters *only* through
# `edge_bias`. On Zachary's karate club (34 members, 78 friendships), with a
# bias table that falls by one per hop (as a trained table might), attention
# moves towards the graph neighbourhood although every pair is an edge: the
# share a node puts on itself and its friends about triples, and the mean
# distance it reads falls by more than half a hop.

# %%
karate = nx.karate_club_graph()
n_k = karate.number_of_nodes()
spd = dict(nx.all_pairs_shortest_path_length(karate))
hops = torch.tensor([[spd[i][j] for j in range(n_k)] for i in range(n_k)])  # (N, N) query i, key j
all_pairs = ga.patterns.full().edge_index(n_k)  # (2, N^2)
edge_hops = hops[all_pairs[1], all_pairs[0]]  # (E,) phi(i, j) per edge
bias_table = -torch.arange(int(hops.max()) + 1, dtype=torch.float32)  # b_phi: one scalar per distance
features = torch.randn(n_k, F, generator=gen)
graphormer = ga.AttentionConv(F, F, heads=1)
with torch.no_grad():
    _, (_, alpha_plain) = graphormer(features, all_pairs, return_attention_weights=True)
    _, (_, alpha_spatial) = graphormer(features, all_pairs, edge_bias=bias_table[edge_hops],
                                       return_attention_weights=True)
share = pd.DataFrame({"without spatial encoding": [alpha_plain[edge_hops == d].sum().item() / n_k for d in range(6)],
                      "with spatial encoding": [alpha_spatial[edge_hops == d].sum().item() / n_k for d in range(6)],
                      "pairs at this distance": [int((edge_hops == d).sum()) for d in range(6)]})
share.index.name = "shortest-path distance"
share

# %%
assert nx.diameter(karate) == 5 and karate.number_of_edges() == 78
near_plain, near_spatial = (share[c].iloc[:2].sum() for c in ("without spatial encoding", "with spatial encoding"))
assert near_spatial > 2.5 * near_plain and near_spatial > 0.4  # self and neighbours: about 0.15 -> 0.45
hops_read = {c: (share[c] * share.index).sum() for c in ("without spatial encoding", "with spatial encoding")}
assert hops_read["with spatial encoding"] < hops_read["without spatial encoding"] - 0.5
assert abs(share["with spatial encoding"].sum() - 1) < 1e-5

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
dense_plain = ga.graphs.edge_weights_to_dense(all_pairs, alpha_plain, (n_k, n_k))[0]
dense_spatial = ga.graphs.edge_weights_to_dense(all_pairs, alpha_spatial, (n_k, n_k))[0]
top = float(max(dense_plain.max(), dense_spatial.max()))
viz.attention_heatmap(dense_plain, ax=axes[0], vmin=0, vmax=top, title="complete graph, no bias", colorbar=False)
image = viz.attention_heatmap(dense_spatial, ax=axes[1], vmin=0, vmax=top, title="+ spatial encoding b(phi(i, j))")

# %% [markdown]
# ## A GraphGPS-style layer
#
# GraphGPS (Rampášek et al. 2022) runs, in every layer, a **local** message
# passing step along the graph's own edges and a **global** attention step over
# all node pairs *of the same graph*, adds both to the input, and applies an MLP.
# In a batch of graphs the global step must not mix graphs: its edge list is the
# disjoint union of one complete graph per graph, which is what
# `graphs.batch_sequences(lengths, patterns.full())` builds from the graph sizes.
#
# The dataset (offline, generated with networkx): 240 graphs of 12 to 24 nodes,
# half Watts–Strogatz small worlds (`k = 4`, `p = 0.2`), half Barabási–Albert
# graphs (`m = 2`), about the same number of edges; node features are one-hot
# degrees. Task: tell the two families apart.

# %%
from torch_geometric.data import Batch, Data
from torch_geometric.nn import global_mean_pool
from torch_geometric.utils import from_networkx

MAX_DEGREE = 12


def make_graph(kind, n, seed):
    g = nx.watts_strogatz_graph(n, 4, 0.2, seed=seed) if kind == 0 else nx.barabasi_albert_graph(n, 2, seed=seed)
    data = from_networkx(g)
    degree = torch.tensor([d for _, d in g.degree()]).clamp(max=MAX_DEGREE)
    return Data(x=nn.functional.one_hot(degree, MAX_DEGREE + 1).float(), edge_index=data.edge_index,
                y=torch.tensor([kind]))


sizes = torch.randint(12, 25, (240,), generator=gen).tolist()
dataset = [make_graph(k % 2, n, seed=k) for k, n in enumerate(sizes)]
train_set, test_set = dataset[:160], dataset[160:]


class GPSLayer(nn.Module):
    def __init__(self, dim, heads=2):
        super().__init__()
        self.local = GINConv(nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim)))
        self.glob = ga.AttentionConv(dim, dim, heads=heads)
        self.norm_local, self.norm_glob, self.norm_out = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, dim))

    def forward(self, x, edge_index, global_index):
        h = self.norm_local(x + self.local(x, edge_index)) + self.norm_glob(x + self.glob(x, global_index))
        return self.norm_out(h + self.mlp(h))


class GPS(nn.Module):
    def __init__(self, dim=32, depth=2):
        super().__init__()
        self.embed = nn.Linear(MAX_DEGREE + 1, dim)
        self.layers = nn.ModuleList(GPSLayer(dim) for _ in range(depth))
        self.head = nn.Linear(dim, 2)

    def forward(self, batch):
        lengths = torch.bincount(batch.batch, minlength=batch.num_graphs).tolist()
        global_index, node_graph = ga.graphs.batch_sequences(lengths, ga.patterns.full())  # (2, sum n_b^2), (N,)
        assert torch.equal(node_graph, batch.batch)  # PyG keeps each graph's nodes contiguous
        h = self.embed(batch.x)
        for layer in self.layers:
            h = layer(h, batch.edge_index, global_index)
        return self.head(global_mean_pool(h, batch.batch))


torch.manual_seed(0)
gps = GPS()
optimizer = torch.optim.Adam(gps.parameters(), lr=3e-3)
order = torch.Generator().manual_seed(0)
start = time.perf_counter()
for epoch in range(15):
    for idx in torch.randperm(len(train_set), generator=order).split(32):
        batch = Batch.from_data_list([train_set[k] for k in idx.tolist()])
        loss = nn.functional.cross_entropy(gps(batch), batch.y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
seconds = time.perf_counter() - start
gps.eval()
with torch.no_grad():
    test_batch = Batch.from_data_list(test_set)
    accuracy = (gps(test_batch).argmax(1) == test_batch.y).float().mean().item()
print(f"trained in {seconds:.1f} s, test accuracy {accuracy:.3f} on {len(test_set)} graphs")

# %% [markdown]
# Measured: the layer learns the task (chance is 0.5). And the global step
# stays inside each graph: changing every feature of the last test graph
# leaves the predictions for all other graphs unchanged.

# %%
assert accuracy > 0.85
with torch.no_grad():
    changed = test_batch.clone()
    changed.x = changed.x.clone()
    changed.x[changed.batch == test_batch.num_graphs - 1] = 1.0
    before, after = gps(test_batch), gps(changed)
assert torch.allclose(before[:-1], after[:-1], atol=1e-6) and not torch.allclose(before[-1], after[-1])
lengths = torch.bincount(test_batch.batch).tolist()
global_index, _ = ga.graphs.batch_sequences(lengths, ga.patterns.full())
assert global_index.size(1) == sum(n * n for n in lengths)
assert (test_batch.batch[global_index[0]] == test_batch.batch[global_index[1]]).all()

# %% [markdown]
# ## Exercises
#
# 1. GAT is static: for a fixed GATConv, which key does *every* query rank
#    first on the complete graph? Compute it without running the layer, from
#    `att_src` and the projected features.
# 2. How many edges does GraphGPS's global step have for graphs of 12, 20 and
#    7 nodes? And the complete graph on their 39 nodes?
# 3. Which `edge_bias` turns full attention into causal attention exactly?
# 4. Is AttentionConv with an ALiBi bias still permutation-equivariant if you
#    permute the nodes but keep the bias of each *edge*? And if the bias is
#    recomputed from the new node numbers?
#
# ### Answers (each checked)
#
# 1. The key with the largest `a_src · W x_j`: the query term is the same for
#    all keys of a row, and LeakyReLU and softmax keep the order.

# %%
gat = layers["GATConv"]
with torch.no_grad():
    source_score = (gat.lin(x) * gat.att_src.reshape(1, -1)).sum(-1)  # (N,): a_src · W x_j
assert (weights["GATConv"].argmax(1) == source_score.argmax()).all()

# %% [markdown]
# 2. `12^2 + 20^2 + 7^2 = 593` edges, against `39^2 = 1521` for one complete graph.

# %%
assert ga.graphs.batch_sequences([12, 20, 7], ga.patterns.full())[0].size(1) == 593 == 12**2 + 20**2 + 7**2

# %% [markdown]
# 3. `-inf` on every edge `(j, i)` with `j > i` and 0 elsewhere: those edges get
#    weight exactly 0, the same as removing them.

# %%
causal_bias = torch.where(full_L[0] > full_L[1], float("-inf"), 0.0).double()  # (E,)
with torch.no_grad():
    y_masked = conv2(tokens[:L], full_L, edge_bias=causal_bias)
    y_causal = conv2(tokens[:L], ga.patterns.causal().edge_index(L))
assert torch.allclose(y_masked, y_causal, atol=1e-12)

# %% [markdown]
# 4. Keeping each edge's bias: yes, it is just another edge feature that moves
#    with its edge. Recomputing `|i - j|` from the new numbers: no, the bias is
#    then a function of the positions, which is exactly how it breaks the symmetry.

# %%
p = torch.randperm(L, generator=gen)
inv = torch.empty_like(p)
inv[p] = torch.arange(L)
moved = inv[full_L]  # the same edges between renumbered nodes
with torch.no_grad():
    y0 = conv2(tokens[:L], full_L, edge_bias=alibi)
    y_kept = conv2(tokens[:L][p], moved, edge_bias=alibi)
    y_recomputed = conv2(tokens[:L][p], full_L, edge_bias=alibi)
assert torch.allclose(y_kept, y0[p], atol=1e-12)
assert not torch.allclose(y_recomputed, y0[p], atol=1e-6)
