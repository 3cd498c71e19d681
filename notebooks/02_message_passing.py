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
# # 2. Attention is message passing
#
# Treat the L tokens as the nodes of a graph. An edge `(j, i)` says "query i may
# read key/value j". Every query node i then does what a GNN layer does:
#
# - compute a score on each incoming edge, `q_i · k_j / sqrt(D)`,
# - normalise the scores over its incoming edges with a softmax: `alpha_ij`,
# - aggregate the messages `alpha_ij v_j`.
#
# Different attention masks are different graphs: the **complete graph**
# (encoder self-attention), a **DAG** (causal decoder attention) and a
# **bipartite graph** (cross-attention). `edge_index` is `(2, E)` with row 0 =
# source j (key) and row 1 = target i (query). Every claim is checked by the
# cell after it.

# %%
import math
import warnings

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm.auto without ipywidgets

import matplotlib.pyplot as plt
import networkx as nx
import pandas as pd
import torch

import graphattn as ga
from graphattn import analysis, viz
from graphattn.steps import edge_messages, edge_table

torch.manual_seed(0)  # the layers below draw their initial weights from torch's global generator
gen = torch.Generator().manual_seed(0)  # the data
pd.set_option("display.float_format", "{:.4f}".format)

# %% [markdown]
# ## Three graphs
#
# The complete graph on L nodes with self-loops has `L^2` edges; the causal
# graph keeps `(j, i)` only for `j <= i`, `L (L + 1) / 2` edges, and without its
# self-loops it is a DAG whose topological order is the token order.
# Cross-attention from L queries to S keys is the complete bipartite graph,
# `L S` edges.

# %%
L, S = 6, 4
full = ga.patterns.full().edge_index(L)
causal = ga.patterns.causal().edge_index(L)
bipartite = ga.graphs.mask_to_edge_index(torch.ones(L, S, dtype=torch.bool))  # L queries x S keys
print("complete:", full.shape, " causal:", causal.shape, " bipartite:", bipartite.shape)

# %%
assert full.shape[1] == L * L and causal.shape[1] == L * (L + 1) // 2 and bipartite.shape[1] == L * S
dag = nx.DiGraph(causal.T.tolist())
dag.remove_edges_from(nx.selfloop_edges(dag))
assert nx.is_directed_acyclic_graph(dag) and list(nx.topological_sort(dag)) == list(range(L))
assert (causal[0] <= causal[1]).all()  # every edge points forward: key j <= query i

# %%
fig, axes = plt.subplots(1, 3, figsize=(10, 3))
viz.pattern_mask(ga.patterns.full(), L, ax=axes[0])
viz.pattern_mask(ga.patterns.causal(), L, ax=axes[1])
viz.pattern_mask(torch.ones(L, S, dtype=torch.bool), ax=axes[2])
axes[2].set_title(f"cross-attention: {L * S} edges", fontsize=9)
fig.tight_layout()

# %% [markdown]
# ## One computation, three ways
#
# Take causal attention with one head on L = 6 tokens and compute it
#
# 1. as a **matrix**: the dense six steps with a mask (`graphattn.dense.six_steps`),
# 2. as an **edge list**: scores on the E edges, a softmax grouped by target,
#    a scatter-add of the messages (`graphattn.attention`),
# 3. as **one node's incoming messages**, written out by hand for query i = 4.
#
# All three give the same weights and outputs to float64 rounding.

# %%
F = D = 8
x = torch.randn(L, F, generator=gen, dtype=torch.float64)
w_q, w_k, w_v = (torch.randn(F, D, generator=gen, dtype=torch.float64) / math.sqrt(F) for _ in range(3))

# 1) matrix
mask = ga.patterns.causal().mask(L)  # (L, L) True = may attend
dense = ga.dense.six_steps(x, w_q, w_k, w_v, mask)
# 2) edge list
q, k, v = ((x @ w).reshape(L, 1, D) for w in (w_q, w_k, w_v))  # (L, H=1, D) each
out, alpha = ga.attention(q, k, v, causal, need_weights=True)  # (L, 1, D), (E, 1)
# 3) one node's incoming messages
i = 4
sources = causal[0][causal[1] == i]  # the keys j with an edge (j, i)
scores = torch.stack([q[i, 0] @ k[j, 0] / math.sqrt(D) for j in sources])
weights = torch.exp(scores) / torch.exp(scores).sum()
y_i = sum(w * v[j, 0] for w, j in zip(weights, sources))
print("incoming edges of node 4 from:", sources.tolist())
print("their weights:", [round(w, 4) for w in weights.tolist()])

# %%
assert sources.tolist() == [0, 1, 2, 3, 4]
assert torch.allclose(dense.weights[0, causal[1], causal[0]], alpha[:, 0], atol=1e-12)
assert torch.allclose(dense.output, out.reshape(L, D), atol=1e-12)
assert torch.allclose(weights, dense.weights[0, i, : i + 1], atol=1e-12)
assert torch.allclose(y_i, dense.output[i], atol=1e-12)

# %% [markdown]
# ## The edge list, printed
#
# The same causal graph as a table: one row per edge `j -> i` with the raw
# score `q_i · k_j`, the scaled score, the weight `alpha_ij` (a softmax over the
# edges into i) and the message `alpha_ij v_j` (first three of its D = 8
# channels shown). `graphattn steps --causal` prints the same table for three
# tokens. Node 4's five incoming messages add up to its output row.

# %%
messages = edge_messages(q, k, v, causal)
table = pd.DataFrame(edge_table(messages))
table["alpha·v_j[:3]"] = [[round(c, 4) for c in m[:3]] for m in table.pop("alpha·v_j")]
print(f"{len(table)} edges")
table[table["j -> i"].str.endswith(f"-> {i}") | table["j -> i"].str.endswith("-> 1")]

# %%
into_i = causal[1] == i
summed = messages["message"][into_i, 0].sum(0)  # (D,): the sum of node 4's incoming messages
print("sum of the messages into node 4:", [round(c, 4) for c in summed.tolist()])
print("output row of node 4          :", [round(c, 4) for c in dense.output[i].tolist()])
assert len(table) == causal.shape[1] == L * (L + 1) // 2
assert torch.allclose(torch.tensor(table["alpha"].values), dense.weights[0, causal[1], causal[0]], atol=1e-12)
assert torch.allclose(torch.tensor(table["scaled"].values), torch.tensor(table["q·k"].values) / math.sqrt(D))
assert torch.allclose(summed, dense.output[i], atol=1e-12)
assert torch.allclose(messages["summed"].reshape(L, D), dense.output, atol=1e-12)

# %% [markdown]
# The layer `graphattn.AttentionConv` is the same computation as a PyTorch
# Geometric `MessagePassing` layer, and its parameter names match the dense
# reference module, so weights move between them with `load_state_dict`:

# %%
conv = ga.AttentionConv(F, F, heads=2).double()
reference = ga.dense.DenseAttention(F, F, heads=2).double()
reference.load_state_dict(conv.state_dict())
y_graph = conv(x, causal)
y_dense, _ = reference(x, mask=mask)
print(conv, "max difference:", (y_graph - y_dense).abs().max().item())

# %%
assert torch.allclose(y_graph, y_dense, atol=1e-12)

# %% [markdown]
# ## Cross-attention is a bipartite graph, and a node with no edges reads nothing
#
# With L queries and S keys, sources index the keys and targets the queries.
# Drop every edge into query 2 and its output row is exactly zero: a node
# without incoming messages aggregates nothing.

# %%
x_kv = torch.randn(S, F, generator=gen, dtype=torch.float64)
qc = (x @ w_q).reshape(L, 1, D)
kc, vc = ((x_kv @ w).reshape(S, 1, D) for w in (w_k, w_v))
cut = bipartite[:, bipartite[1] != 2]  # no edges into query 2
out_cross, alpha_cross = ga.attention(qc, kc, vc, cut, need_weights=True)
cross_mask = ga.graphs.edge_index_to_mask(cut, (S, L))  # (L, S)
dense_cross = ga.dense.six_steps(x, w_q, w_k, w_v, cross_mask, x_kv=x_kv)
print("output row of query 2:", out_cross[2, 0].tolist())

# %%
assert (out_cross[2] == 0).all() and (dense_cross.output[2] == 0).all()
assert torch.allclose(out_cross.reshape(L, D), dense_cross.output, atol=1e-12)

# %% [markdown]
# ## Multi-head attention: parallel edges, one weight per head
#
# With H heads, every edge carries H weights, `alpha` of shape `(E, H)`. Each
# head is its own softmax over the same incoming edges, so for every query and
# every head the weights sum to 1. As a networkx `MultiDiGraph` this is H
# parallel edges per `(j, i)`, keyed by head.

# %%
H = 3
conv3 = ga.AttentionConv(F, 3 * 4, heads=H).double()
_, (ei, alpha3) = conv3(x, causal, return_attention_weights=True)
per_query = torch.zeros(L, H, dtype=torch.float64).index_add_(0, ei[1], alpha3)  # (L, H)
multi = nx.MultiDiGraph()
multi.add_nodes_from(range(L))
for h in range(H):
    multi.add_weighted_edges_from((j, i, w) for (j, i), w in zip(ei.T.tolist(), alpha3[:, h].tolist()))
print("alpha:", tuple(alpha3.shape), " sums per query and head:", per_query[0].tolist(),
      " parallel edges 0 -> 5:", multi.number_of_edges(0, 5))

# %%
assert alpha3.shape == (causal.shape[1], H)
assert torch.allclose(per_query, torch.ones(L, H, dtype=torch.float64), atol=1e-12)
assert multi.number_of_edges() == causal.shape[1] * H and multi.number_of_edges(0, 5) == H

# %%
fig, axes = plt.subplots(1, H, figsize=(11, 3))
for h in range(H):
    viz.attention_graph(ei, alpha3.detach(), tokens=[f"t{n}" for n in range(L)], ax=axes[h], head=h, vmax=1.0)
    axes[h].set_title(f"head {h}: width ~ alpha (one scale: width 6 = weight 1)", fontsize=9)
fig.tight_layout()

# %% [markdown]
# ## The diagonal: how much a token reads itself
#
# The self-loop `(i, i)` is an edge like any other; its weight `alpha_ii` is the
# share of query i's attention that stays at home. `analysis.self_share` gives
# it per head as the sum of the diagonal weights over the total weight, which
# equals the mean of `alpha_ii` over the queries. On the causal graph the
# first token can only read itself, so its `alpha_00 = 1` in every head.
# Without self-loops the share is exactly 0 and the outputs change: the
# builders include `i -> i`, and the layer never adds it by itself.

# %%
share = analysis.self_share(ei, alpha3.detach())  # (1, H)
dense_w = torch.zeros(H, L, L, dtype=torch.float64)
dense_w[:, ei[1], ei[0]] = alpha3.detach().T  # (H, L, S)
no_self = ga.graphs.mask_to_edge_index(mask & ~torch.eye(L, dtype=torch.bool))
_, (ei_ns, alpha_ns) = conv3(x, no_self, return_attention_weights=True)
print("self share per head:", [round(s, 3) for s in share[0].tolist()],
      " without self-loops:", analysis.self_share(ei_ns, alpha_ns.detach())[0].tolist())

# %%
assert torch.allclose(share[0], dense_w.diagonal(dim1=1, dim2=2).mean(-1), atol=1e-12)
assert torch.allclose(dense_w[:, 0, 0], torch.ones(H, dtype=torch.float64))
assert (analysis.self_share(ei_ns, alpha_ns.detach()) == 0).all()
y_ns = conv3(x, no_self)
assert not torch.allclose(y_ns[1:], conv3(x, causal)[1:])

# %%
fig, ax = plt.subplots(figsize=(3.5, 3))
viz.attention_heatmap(dense_w[0], ax=ax, mask=mask, title="head 0 on the causal graph",
                      row_labels=[f"t{n}" for n in range(L)], col_labels=[f"t{n}" for n in range(L)])
fig.tight_layout()

# %% [markdown]
# ## Multi-head attention as a picture: split -> H graphs -> concat -> W_O
#
# The layer projects `x (N, F)` to queries, keys and values of width `H·D`,
# splits them into H heads of width D, runs one attention **per head on the
# same graph** (each head has its own weights `alpha[:, h]`), concatenates the H
# outputs back to `(N, H·D)` and mixes them with `W_O`. Below, the three heads of
# `conv3` on the causal graph; then the same output rebuilt by hand from the
# per-head graphs.

# %%
fig = plt.figure(figsize=(13, 3.8), layout="constrained")
drawn = viz.multihead(ei, alpha3.detach(), in_channels=F, out_channels=12, tokens=[f"t{n}" for n in range(L)],
                      fig=fig)

# %%
with torch.no_grad():
    qh = conv3.lin_query(x).reshape(L, H, 4)  # (N, H, D): split
    kh, vh = (lin(x).reshape(L, H, 4) for lin in (conv3.lin_key, conv3.lin_value))
    per_head = [ga.attention(qh[:, h:h + 1], kh[:, h:h + 1], vh[:, h:h + 1], causal, need_weights=True)
                for h in range(H)]  # H graphs, one head each: ((N, 1, D), (E, 1))
    concat = torch.cat([out_h.reshape(L, 4) for out_h, _ in per_head], dim=1)  # (N, H·D)
    y_by_hand = conv3.lin_out(concat)  # (N, F_out): W_O
    print("shapes: split", tuple(qh.shape), " concat", tuple(concat.shape), " output", tuple(y_by_hand.shape))
    assert torch.allclose(y_by_hand, conv3(x, causal), atol=1e-12)
    for h, (_, alpha_h) in enumerate(per_head):
        assert torch.allclose(alpha_h[:, 0], alpha3[:, h], atol=1e-12)
assert len(drawn["graphs"]) == H

# %% [markdown]
# ## Cross-attention as a picture, and a model that learns it
#
# An encoder-decoder Transformer holds three graphs: the encoder's tokens
# attend along the **complete graph**, the decoder's along the **causal DAG**,
# and every decoder query reads every encoder output along the **complete
# bipartite graph** (cross-attention: keys and values from the encoder, queries
# from the decoder; S need not equal L).

# %%
fig, ax = plt.subplots(figsize=(7, 4.8), layout="constrained")
encdec = viz.encoder_decoder(5, 4, ax=ax)

# %%
assert [encdec["edge_index"][k].size(1) for k in ("encoder", "decoder", "cross")] == [25, 10, 20]
assert len(encdec["encoder"]) == 25 and len(encdec["decoder"]) == 10 and len(encdec["cross"]) == 20

# %% [markdown]
# **Reversal.** A decoder position i must output the input token at position
# `n - 1 - i`. We train only a cross-attention layer on the bipartite graph:
# queries from learned *decoder position* vectors, keys and values from the
# *input token plus its position*, a linear readout. To copy the right token,
# query i must put its weight on key `n - 1 - i`: the cross-attention map should
# become the **anti-diagonal**. A batch is one disjoint graph (each sequence's
# queries read only its own keys), built by `graphs.batch_sequences`.

# %%
import time

from torch import nn

n, vocab, width, batch_size = 6, 10, 32, 64


class Reverser(nn.Module):
    def __init__(self):
        super().__init__()
        self.token = nn.Embedding(vocab, width)
        self.src_position = nn.Embedding(n, width)
        self.tgt_position = nn.Embedding(n, width)
        self.cross = ga.AttentionConv((width, width), width, heads=1)  # (F_kv, F_q) -> F_out
        self.readout = nn.Linear(width, vocab)

    def forward(self, tokens, edge_index):  # tokens (B, n)
        b = tokens.size(0)
        x_kv = (self.token(tokens) + self.src_position.weight).reshape(b * n, width)  # (B·n, F): encoder side
        x_q = self.tgt_position.weight.repeat(b, 1)  # (B·n, F): decoder queries, positions only
        y, (ei, alpha) = self.cross((x_kv, x_q), edge_index, return_attention_weights=True)
        return self.readout(y).reshape(b, n, vocab), alpha  # (B, n, vocab), (E, 1)


torch.manual_seed(0)
model = Reverser()
graph, _ = ga.graphs.batch_sequences([n] * batch_size, ga.patterns.full())  # (2, B·n·n): within each sequence
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
data_gen = torch.Generator().manual_seed(0)
start = time.perf_counter()
for step in range(300):
    tokens = torch.randint(vocab, (batch_size, n), generator=data_gen)
    logits, _ = model(tokens, graph)
    loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens.flip(1).reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
train_seconds = time.perf_counter() - start
with torch.no_grad():
    test = torch.randint(vocab, (batch_size, n), generator=data_gen)
    logits, alpha_rev = model(test, graph)
accuracy = (logits.argmax(-1) == test.flip(1)).double().mean().item()
cross_map = ga.graphs.edge_weights_to_dense(graph, alpha_rev, (batch_size * n, batch_size * n))[0, :n, :n]  # (L, S)
print(f"final loss {loss.item():.4f}, test accuracy {accuracy:.3f}")

# %%
fig, ax = plt.subplots(figsize=(4, 3.4), layout="constrained")
image = viz.attention_heatmap(cross_map, [f"out {i}" for i in range(n)], [f"in {j}" for j in range(n)], ax=ax,
                              vmin=0.0, vmax=1.0, title="learned cross-attention, sequence 0")

# %% [markdown]
# Measured: the layer copies the reversed sequence on held-out inputs, and the
# cross-attention of every query puts nearly all its weight on key `n - 1 - i`,
# the anti-diagonal.

# %%
assert accuracy > 0.99
anti = cross_map[torch.arange(n), n - 1 - torch.arange(n)]  # (n,): alpha from query i to key n - 1 - i
print("weights on the anti-diagonal:", [round(a, 3) for a in anti.tolist()])
assert (anti > 0.9).all() and (cross_map.argmax(1) == n - 1 - torch.arange(n)).all()

# %% [markdown]
# ## Worked examples: edge order and the weights into one query
#
# Shuffling the columns of `edge_index` (the order of the edges) changes
# neither the outputs nor the weights, once matched to their edges: the
# softmax groups by target and the sum does not care about order. And the
# weights into each query form a distribution over its incoming edges.

# %%
perm = torch.randperm(causal.size(1), generator=torch.Generator().manual_seed(3))
out_p, alpha_p = ga.attention(q, k, v, causal[:, perm], need_weights=True)
assert torch.allclose(out_p, out, atol=1e-12) and torch.allclose(alpha_p, alpha[perm], atol=1e-12)
assert abs(table.loc[table["j -> i"].str.endswith("-> 4"), "alpha"].sum() - 1.0) < 1e-12

# %% [markdown]
# ## Exercises
#
# Fill in each `...` and run the cell: the checker under it says whether your
# answer is right and, if not, what is likely wrong. Solutions are in
# `notebooks/solutions/02_message_passing.py` (try first).
#
# 1. Cross-attention from L = 7 decoder queries to S = 3 encoder keys: build
#    its `edge_index` (2, E), row 0 = source = key j, row 1 = target = query i.

# %%
from graphattn.exercises import check_bipartite_edges, check_message_passing, check_no_incoming

answer_1 = ...  # your code: the (2, E) edge_index
check_bipartite_edges(answer_1, num_queries=7, num_keys=3)

# %% [markdown]
# 2. Remove the self-loop `0 -> 0` from `causal` (the causal graph on 6 nodes
#    above) and run `ga.attention(q, k, v, ...)` on what is left. What is node
#    0's output row, and why?

# %%
answer_2 = ...  # your code: node 0's output row
check_no_incoming(answer_2)

# %% [markdown]
# 3. Write attention along the edges yourself: `attend(q, k, v, edge_index)`
#    with `q` `(L, H, D)` and `k`, `v` `(S, H, D)`. Gather `q_i` and `k_j` per
#    edge, score `q_i · k_j / sqrt(D)`, normalise over the edges into each
#    target (`torch_geometric.utils.softmax`), scatter-add `alpha_ij v_j` into
#    the targets. A query with no incoming edge gets a zero row.

# %%
def attend(q, k, v, edge_index):
    return ...  # your code


check_message_passing(attend)
