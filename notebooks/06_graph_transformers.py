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
# **Static per head.** The ranking is fixed *per head*: each head has its own
# `a_src`, so a multi-head GAT has one static ranking per head, and heads can
# disagree. Concatenated or averaged heads therefore still read different keys
# for the different heads, but no head can rank the keys differently for two
# queries. Measured with four heads:

# %%
gat4 = GATConv(F, F, heads=4, add_self_loops=False)
with torch.no_grad():
    _, (ei4, alpha4) = gat4(x, complete, return_attention_weights=True)
dense4 = ga.graphs.edge_weights_to_dense(ei4, alpha4, (N, N))  # (H, N, N)
top_per_head = [sorted(set(dense4[h].argmax(1).tolist())) for h in range(4)]
print("top key of the 12 queries, per head:", top_per_head)
assert all(len(t) == 1 for t in top_per_head)  # static within each head
assert len({t[0] for t in top_per_head}) > 1  # but the heads disagree

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
# `phi(i, j)` between them. Its other structural terms (centrality, edge
# encoding, the virtual node) come in the next section. On Zachary's karate club (34 members, 78 friendships), with a
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
friends = torch.tensor(list(karate.edges())).T  # (2, 78) undirected: mark both directions
for ax in axes:  # the graph's own edges (friendships), drawn over the complete graph's weights
    ax.scatter(torch.cat([friends[0], friends[1]]), torch.cat([friends[1], friends[0]]), s=6, marker="o",
               facecolors="none", edgecolors="white", linewidths=0.6, label="friendship (graph edge)")
axes[1].legend(loc="lower left", fontsize=7, framealpha=0.8)

# %% [markdown]
# ## Graphormer completed: centrality, edge encoding, the virtual node
#
# Graphormer adds three more structural terms to the spatial encoding:
#
# - **centrality encoding**: a learned vector per degree, `z_deg(i)`, added to
#   node i's features before the first layer (a node feature);
# - **edge encoding**: for each pair, the mean over the edges of a shortest
#   path from i to j of `w · e` (a learned dot product with the edge
#   features), added to the score like the spatial term (an edge bias);
# - a **virtual node** joined to every node, with its own learned spatial
#   bias; its output is the graph's representation, the [CLS] analogue.
#
# All three are ordinary graph-attention inputs: node features and an
# `edge_bias` on the complete graph of n + 1 nodes. Here on the karate club,
# whose edges carry a weight (the number of interactions), with one
# untrained set of these parameters.

# %%
degree = torch.tensor([d for _, d in karate.degree()])  # (N,)
centrality = nn.Embedding(int(degree.max()) + 1, F)  # z_deg
edge_weight = {frozenset(e): float(w) for *e, w in karate.edges(data="weight")}
w_edge = 0.5  # the learned w of a 1-d edge feature
paths = dict(nx.all_pairs_shortest_path(karate))
edge_term = torch.tensor([[sum(edge_weight[frozenset(p)] for p in zip(paths[i][j], paths[i][j][1:]))
                           / max(len(paths[i][j]) - 1, 1) * w_edge if i != j else 0.0
                           for j in range(n_k)] for i in range(n_k)])  # (N, N) query i, key j
virtual = n_k  # node index of the virtual node
n_v = n_k + 1
all_v = ga.patterns.full().edge_index(n_v)  # (2, (N + 1)^2)
src, dst = all_v
is_virtual = (src == virtual) | (dst == virtual)  # (E,)
b_virtual = torch.tensor(-1.0)  # the virtual node's own learned spatial bias
spatial = torch.where(is_virtual, b_virtual, bias_table[hops[dst.clamp(max=n_k - 1), src.clamp(max=n_k - 1)]])
edge_enc = torch.where(is_virtual, 0.0, edge_term[dst.clamp(max=n_k - 1), src.clamp(max=n_k - 1)])
with torch.no_grad():
    nodes = torch.cat([features + centrality(degree), torch.zeros(1, F)])  # (N + 1, F); the virtual node starts at 0
    out_v, (_, alpha_v) = graphormer(nodes, all_v, edge_bias=spatial + edge_enc, return_attention_weights=True)
graph_vector = out_v[virtual]  # (F,) the readout: the virtual node's output
reads = ga.graphs.edge_weights_to_dense(all_v, alpha_v, (n_v, n_v))[0][virtual]  # (N + 1,) what it reads
print(f"the virtual node reads all {n_k} members and itself (weights sum {reads.sum():.3f}); "
      f"edge encoding range {edge_term.min():.2f} .. {edge_term.max():.2f}")
assert abs(reads.sum().item() - 1) < 1e-5 and (reads > 0).all()
assert nx.shortest_path_length(karate, 0, 33) > 1  # far apart in the graph, one hop via the virtual node
assert edge_term[0, 1] == w_edge * karate[0][1]["weight"]  # a friendship's own weight

# %% [markdown]
# The virtual node is one hop from everyone: any two members are at most two
# hops apart through it, which is how Graphormer (and MPNNs with a virtual
# node) pass information across the whole graph; [CLS] plays the same role in
# a sentence.

# %% [markdown]
# ## A GraphGPS-style layer, on a task where global attention matters
#
# GraphGPS (Rampášek et al. 2022) runs, in every layer, a **local** message
# passing step along the graph's own edges and a **global** attention step over
# all node pairs *of the same graph*, adds both, and applies an MLP. In a batch
# of graphs the global step must not mix graphs: its edge list is the disjoint
# union of one complete graph per graph (`graphs.batch_sequences(lengths,
# patterns.full())`).
#
# The task (generated offline) needs reach: each graph is a path of 16 to 24
# nodes. Node 0, at one end, is the *query*; one *key* node, at least 8 hops
# away, carries a colour (red or blue), and four distractor nodes carry random
# colours too. The label, read out at node 0, is the key's colour. Two local
# layers see 2 hops: they cannot reach the key. Global attention can, if its
# queries and keys learn to match "query" with "key" among the distractors.
# The degree histogram (the same for every path of a given length) says
# nothing about the colour: a degree-only baseline is the floor.

# %%
from torch_geometric.data import Batch, Data
from torch_geometric.utils import from_networkx

FEATURES = 4  # is_query, is_key, red, blue


def make_graph(seed):
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(16, 25, (1,), generator=g))
    x = torch.zeros(n, FEATURES)
    x[0, 0] = 1  # the query node, at one end of the path
    key = int(torch.randint(8, n, (1,), generator=g))  # at least 8 hops away
    colour = int(torch.randint(0, 2, (1,), generator=g))
    x[key, 1], x[key, 2 + colour] = 1, 1
    for k in [k for k in torch.randperm(n, generator=g).tolist() if k not in (0, key)][:4]:
        x[k, 2 + int(torch.randint(0, 2, (1,), generator=g))] = 1  # distractors: coloured, not the key
    return Data(x=x, edge_index=from_networkx(nx.path_graph(n)).edge_index, y=torch.tensor([colour]), num_nodes=n)


dataset = [make_graph(seed) for seed in range(240)]
train_set, test_set = dataset[:160], dataset[160:]
test_batch = Batch.from_data_list(test_set)


class GPSLayer(nn.Module):
    def __init__(self, dim, mode, heads=2):
        super().__init__()
        self.mode = mode  # "local", "global" or "both"
        self.local = GINConv(nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim)))
        self.glob = ga.AttentionConv(dim, dim, heads=heads)
        self.norm_local, self.norm_glob, self.norm_out = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, dim))

    def forward(self, x, edge_index, global_index):
        h = 0
        if self.mode in ("local", "both"):
            h = h + self.norm_local(x + self.local(x, edge_index))
        if self.mode in ("global", "both"):
            h = h + self.norm_glob(x + self.glob(x, global_index))
        return self.norm_out(h + self.mlp(h))


class GPS(nn.Module):
    def __init__(self, mode, dim=32, depth=2):
        super().__init__()
        self.embed = nn.Linear(FEATURES, dim)
        self.layers = nn.ModuleList(GPSLayer(dim, mode) for _ in range(depth))
        self.head = nn.Linear(dim, 2)

    def forward(self, batch):
        lengths = torch.bincount(batch.batch, minlength=batch.num_graphs).tolist()
        global_index, node_graph = ga.graphs.batch_sequences(lengths, ga.patterns.full())  # (2, sum n_b^2), (N,)
        assert torch.equal(node_graph, batch.batch)  # PyG keeps each graph's nodes contiguous
        h = self.embed(batch.x)
        for layer in self.layers:
            h = layer(h, batch.edge_index, global_index)
        return self.head(h[batch.ptr[:-1]])  # read out at each graph's query node


def train(mode, seed, epochs=20):
    torch.manual_seed(seed)
    model = GPS(mode)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    order = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(len(train_set), generator=order).split(32):
            batch = Batch.from_data_list([train_set[k] for k in idx.tolist()])
            loss = nn.functional.cross_entropy(model(batch), batch.y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():
        return model, (model(test_batch).argmax(1) == test_batch.y).float().mean().item()


def degree_histogram(data):
    degree = torch.bincount(data.edge_index[1], minlength=data.num_nodes)
    return torch.bincount(degree, minlength=3)[:3].float() / data.num_nodes  # paths: degrees 1 and 2


def degree_baseline(seed, epochs=300):
    torch.manual_seed(seed)
    model = nn.Linear(3, 2)  # logistic regression on the degree histogram, no edges, no attention
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    xs, ys = torch.stack([degree_histogram(d) for d in train_set]), torch.cat([d.y for d in train_set])
    for _ in range(epochs):
        loss = nn.functional.cross_entropy(model(xs), ys)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        xt = torch.stack([degree_histogram(d) for d in test_set])
        return (model(xt).argmax(1) == test_batch.y).float().mean().item()


SEEDS = (0, 1, 2)
start = time.perf_counter()
runs = [dict(model="degree histogram only", seed=s, accuracy=degree_baseline(s)) for s in SEEDS]
models = {}
for mode in ("local", "global", "both"):
    for s in SEEDS:
        models[mode, s], accuracy = train(mode, s)
        runs.append(dict(model=f"GPS, {mode}", seed=s, accuracy=accuracy))
runs = pd.DataFrame(runs)
ablation = runs.groupby("model", sort=False).accuracy.agg(["mean", "std", "min", "max"])
print(f"{len(runs)} runs in {time.perf_counter() - start:.0f} s; test accuracy over seeds {SEEDS} "
      f"({len(test_set)} test graphs, chance 0.5)")
ablation

# %%
fig, ax = plt.subplots(figsize=(6, 2.8), layout="constrained")
ax.barh(ablation.index, ablation["mean"], xerr=ablation["std"], color="0.7", capsize=4)
ax.scatter(runs.accuracy, runs.model, color="k", s=12, zorder=3, label="one seed")
ax.axvline(0.5, color="tab:red", linestyle=":", label="chance")
ax.set(xlabel="test accuracy (mean, +-1 std over 3 seeds)", xlim=(0, 1.05), title="who can reach the key?")
ax.invert_yaxis()
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
plt.show()

# %% [markdown]
# Measured: the degree-only baseline and the local-only model stay near
# chance (the key is out of reach of two local layers); the global step solves
# the task, alone or with the local step, by a margin far beyond the spread
# over seeds. And the global step stays inside each graph: changing every
# feature of the last test graph leaves the predictions for all other graphs
# unchanged.

# %%
best, floor = ablation.loc["GPS, both"], ablation.loc[["degree histogram only", "GPS, local"]]
assert (best["min"] > floor["max"] + 0.2).all()  # every seed of "both" beats every seed of either floor
assert best["mean"] - best["std"] > floor["mean"].max() + floor["std"].max()  # beyond the error bars
assert ablation.loc["GPS, global", "mean"] > 0.9 and ablation.loc["GPS, local", "mean"] < 0.65
gps = models["both", 0]
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
# ## Worked example: a bias per edge or per position
#
# Is AttentionConv with an ALiBi bias still permutation-equivariant if you
# permute the nodes but keep the bias of each *edge*? Yes: it is another edge
# feature that moves with its edge. Recomputing `|i - j|` from the new node
# numbers: no, the bias is then a function of the positions, which is exactly
# how it breaks the symmetry.

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

# %% [markdown]
# ## Exercises
#
# Fill in each `...` and run the cell: the checker under it says whether your
# answer is right and, if not, what is likely wrong. Solutions are in
# `notebooks/solutions/06_graph_transformers.py` (try first).
#
# 1. GAT ranks keys statically, *per head*: for the fixed `GATConv`
#    `layers["GATConv"]`, which key does every query rank first on the
#    complete graph? Compute it from `att_src` and the projected features
#    `gat.lin(x)`, without running the layer (one key per head).

# %%
from graphattn.exercises import check_causal_bias, check_gat_first_key, check_global_edges

gat = layers["GATConv"]
answer_1 = ...  # your code: one key index per head
check_gat_first_key(answer_1, gat, x)

# %% [markdown]
# 2. How many edges does GraphGPS's global step have for a batch of graphs
#    of 12, 20 and 7 nodes?

# %%
answer_2 = ...  # your code: an int
check_global_edges(answer_2, sizes=(12, 20, 7))

# %% [markdown]
# 3. Which `edge_bias` (one value per edge of `full_L`) turns full attention
#    into causal attention exactly?

# %%
answer_3 = ...  # your code: a (E,) tensor
check_causal_bias(answer_3, full_L)
