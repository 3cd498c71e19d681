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
# # 7. Efficient attention as graphs
#
# The fast attention kernels of the last years are graph algorithms in
# disguise. This notebook rebuilds five of them on the graph view of the
# earlier notebooks (`edge_index` row 0 = source = key j, row 1 = target =
# query i) and checks each against full attention:
#
# 1. **FlashAttention** streams the complete graph's sources in blocks with an
#    *online* softmax (a running max and sum per target);
# 2. **block-sparse** attention is a graph on blocks;
# 3. sparse attention on a general graph is **SDDMM -> segment softmax ->
#    SpMM**, the names DGL uses and what graphattn's CSR kernel runs;
# 4. whether dense or sparse wins depends on the density *and the hardware*;
# 5. **decoding** grows a DAG one node at a time, and the **KV cache** keeps
#    its sources; **multi-query / grouped-query** attention lets query heads
#    share one source embedding.

# %%
import math
import time
import warnings

warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")

import matplotlib.pyplot as plt
import pandas as pd
import torch
import torch.nn.functional as F

import graphattn as ga

gen = torch.Generator().manual_seed(0)
pd.set_option("display.float_format", "{:.4g}".format)


def full_attention(q, k, v, allowed=None):
    """Reference: dense softmax(q k^T / sqrt(D)) v per head; q (L, H, D), k, v (S, H, D), allowed (L, S)."""
    s = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(q.size(-1))  # (H, L, S)
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hij,jhd->ihd", s.softmax(-1).nan_to_num(0.0), v)  # (L, H, D)


# %% [markdown]
# ## 1. The complete graph, streamed over source blocks
#
# Full attention on L tokens is the complete graph: every target i reads every
# source j. FlashAttention never forms the L x S score matrix. It cuts the
# sources into blocks and visits them one at a time, keeping per target only a
# running max `m_i`, a running sum `l_i = sum_j exp(s_ij - m_i)` and an
# unnormalised output `o_i = sum_j exp(s_ij - m_i) v_j`. When a block raises
# the max from `m` to `m'`, the old sum and output are rescaled by
# `exp(m - m')`. At the end `y_i = o_i / l_i`: exactly the softmax over *all*
# incoming edges, computed as a segment softmax that arrives in pieces.

# %%
L, H, D, block = 64, 2, 8, 16
q, k, v = (torch.randn(L, H, D, generator=gen, dtype=torch.float64) for _ in range(3))


def streamed_attention(q, k, v, block, allowed_blocks=None):
    """Online softmax over source blocks; allowed_blocks (n_blocks, n_blocks) skips whole blocks."""
    n_blocks = k.size(0) // block
    m = torch.full((q.size(0), q.size(1)), float("-inf"), dtype=q.dtype)  # (L, H) running max
    l = torch.zeros(q.size(0), q.size(1), dtype=q.dtype)  # (L, H) running sum
    o = torch.zeros_like(q)  # (L, H, D) unnormalised output
    for b in range(n_blocks):
        cols = slice(b * block, (b + 1) * block)
        s = torch.einsum("ihd,jhd->ihj", q, k[cols]) / math.sqrt(q.size(-1))  # (L, H, block)
        if allowed_blocks is not None:  # a block graph: target block of row i reads source block b or not
            reads = allowed_blocks[torch.arange(q.size(0)) // block, b]  # (L,)
            s = s.masked_fill(~reads[:, None, None], float("-inf"))
        m_new = torch.maximum(m, s.amax(-1))  # (L, H)
        safe = torch.where(torch.isinf(m_new), 0.0, m_new)  # a target with nothing read yet
        rescale = torch.exp(m - safe)  # (L, H): exp(m - m'), 0 on the first block
        p = torch.exp(s - safe[..., None])  # (L, H, block)
        l = rescale * l + p.sum(-1)
        o = rescale[..., None] * o + torch.einsum("ihj,jhd->ihd", p, v[cols])
        m = m_new
    return o / l.clamp_min(torch.finfo(q.dtype).tiny)[..., None], m, l  # a target that read nothing: zero row


y_stream, m_final, l_final = streamed_attention(q, k, v, block)
y_full = full_attention(q, k, v)
y_graph, _ = ga.attention(q, k, v, ga.patterns.full())
print(f"{L // block} source blocks of {block}: max |streamed - full| = {(y_stream - y_full).abs().max():.1e}, "
      f"max |streamed - graph attention| = {(y_stream - y_graph).abs().max():.1e}")
assert torch.allclose(y_stream, y_full, atol=1e-12) and torch.allclose(y_stream, y_graph, atol=1e-12)
s_all = torch.einsum("ihd,jhd->ihj", q, k) / math.sqrt(D)  # (L, H, S): only to check the running statistics
assert torch.allclose(m_final, s_all.amax(-1)) and torch.allclose(l_final, (s_all - m_final[..., None]).exp().sum(-1))

# %% [markdown]
# ## 2. Block-sparse attention is a graph on blocks
#
# Block-sparse kernels (BigBird, the Sparse Transformer's fixed pattern,
# FlexAttention's block mask) decide per *pair of blocks* whether target block
# r reads source block c. That is a graph on `L / block` nodes; the token
# graph is its Kronecker product with a complete `block x block` graph. The
# streaming loop above only visits allowed blocks: here a causal band of
# width 2 blocks plus a global first block.

# %%
n_blocks = L // block
block_graph = torch.zeros(n_blocks, n_blocks, dtype=torch.bool)  # (target block, source block)
for r in range(n_blocks):
    block_graph[r, max(0, r - 1): r + 1] = True  # this block and the one before
block_graph[:, 0] = True  # every block reads the first (a global block)
token_mask = torch.kron(block_graph.int(), torch.ones(block, block, dtype=torch.int)).bool()  # (L, L)
edge_index = ga.graphs.mask_to_edge_index(token_mask)  # the token graph's edges
y_blocks, _, _ = streamed_attention(q, k, v, block, allowed_blocks=block_graph)
y_edges, _ = ga.attention(q, k, v, edge_index)
print(f"block graph: {int(block_graph.sum())} of {n_blocks ** 2} block pairs; token graph: {edge_index.size(1)} "
      f"edges = {int(block_graph.sum())} x {block}^2; max |blocks - graph| = {(y_blocks - y_edges).abs().max():.1e}")
assert edge_index.size(1) == int(block_graph.sum()) * block ** 2
assert torch.allclose(y_blocks, y_edges, atol=1e-12)
fig, axes = plt.subplots(1, 2, figsize=(7, 3.2), layout="constrained")
axes[0].imshow(block_graph, cmap="Greys")
axes[0].set(title="block graph (black = reads)", xlabel="source block c", ylabel="target block r",
            xticks=range(n_blocks), yticks=range(n_blocks))
axes[1].imshow(token_mask, cmap="Greys")
axes[1].set(title="token graph = kron(block graph, 1)", xlabel="source j", ylabel="target i")
plt.show()

# %% [markdown]
# ## 3. SDDMM -> segment softmax -> SpMM
#
# On a general graph, sparse attention is three sparse kernels (DGL's names):
#
# - **SDDMM**, sampled dense-dense matmul: `s_e = q_i · k_j` only on the edges
#   `e = (j, i)`, i.e. `Q K^T` sampled at the adjacency's nonzeros;
# - **segment softmax**: a softmax over each target's segment of edges (in CSR,
#   a row);
# - **SpMM**, sparse-dense matmul: `Y = A V` with the sparse weights `A`.
#
# graphattn's CSR kernel (`graphattn.ops.csr`: `sddmm`, `segment_softmax`,
# `spmm`) is exactly this, with `torch.sparse.sampled_addmm` and a CSR x dense
# product. Here the three steps with plain torch.sparse on one head, against
# `ga.attention(..., impl="csr")`.

# %%
Lg = 40
adj = torch.rand(Lg, Lg, generator=gen) < 0.15  # (target i, source j): a random directed graph
adj.fill_diagonal_(True)
qg, kg, vg = (torch.randn(Lg, 1, D, generator=gen, dtype=torch.float64) for _ in range(3))
pattern = adj.double().to_sparse_csr()  # CSR: row = target i, column = source j
scores = torch.sparse.sampled_addmm(pattern, qg[:, 0], kg[:, 0].T, beta=0.0,
                                    alpha=1 / math.sqrt(D))  # SDDMM: (Q K^T)[i, j] on the pattern's nonzeros only
weights = torch.sparse.softmax(scores.to_sparse_coo(), dim=1)  # segment softmax per row i
y_sparse = torch.sparse.mm(weights, vg[:, 0])  # SpMM: (L, L) sparse x (L, D) dense
y_csr, _ = ga.attention(qg, kg, vg, ga.graphs.mask_to_edge_index(adj), impl="csr")
print(f"{int(adj.sum())} edges: max |SDDMM-softmax-SpMM - graphattn csr| = {(y_sparse - y_csr[:, 0]).abs().max():.1e}")
assert torch.allclose(y_sparse, y_csr[:, 0], atol=1e-12)
assert torch.allclose(y_sparse, full_attention(qg, kg, vg, adj)[:, 0], atol=1e-12)

# %% [markdown]
# ## 4. Where dense beats sparse: the hardware lottery
#
# A sparse kernel does work proportional to the edges E; a dense one to L^2,
# but on hardware built for dense matrix products (here: this machine's CPU,
# through PyTorch's fused SDPA). Below, on L = 512 tokens, H = 4, D = 32, random
# graphs of growing density, the time of `F.scaled_dot_product_attention`
# with a boolean mask (every score computed, then masked) against graph
# attention on the edges (`impl="csr"`). The crossover density is a property
# of the machine and the kernels, not of attention: measured here, printed,
# never asserted.

# %%
def best_time(fn, repeats=5):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


Lb, Hb, Db = 512, 4, 32
qb, kb, vb = (torch.randn(Lb, Hb, Db, generator=gen) for _ in range(3))
rows = []
with torch.no_grad():
    for density in (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0):
        mask = torch.rand(Lb, Lb, generator=gen) < density
        mask.fill_diagonal_(True)
        ei = ga.graphs.mask_to_edge_index(mask)
        dense_s = best_time(lambda: F.scaled_dot_product_attention(
            qb.transpose(0, 1), kb.transpose(0, 1), vb.transpose(0, 1), attn_mask=mask))
        sparse_s = best_time(lambda: ga.attention(qb, kb, vb, ei, impl="csr"))
        rows.append(dict(density=mask.float().mean().item(), edges=ei.size(1), dense_ms=1e3 * dense_s,
                         sparse_ms=1e3 * sparse_s, sparse_over_dense=sparse_s / dense_s))
timing = pd.DataFrame(rows)
crossover = timing[timing.sparse_over_dense > 1].density.min()
print(f"{time.strftime('%Y-%m-%d %H:%M')}, load average {' '.join(f'{x:.1f}' for x in __import__('os').getloadavg())}; "
      f"dense SDPA is faster from density {crossover:.3f} on (this machine, this run)")
fig, ax = plt.subplots(figsize=(5.5, 3.2), layout="constrained")
ax.plot(timing.density, timing.dense_ms, marker="o", label="dense SDPA + boolean mask (all L^2 scores)")
ax.plot(timing.density, timing.sparse_ms, marker="s", label='graph attention on the edges (impl="csr")')
if crossover == crossover:  # not NaN: sparse lost somewhere
    ax.axvline(crossover, color="0.5", linestyle=":", label=f"dense wins from {crossover:.2f} (this run)")
ax.set(xscale="log", yscale="log", xlabel="density (edges / L^2)", ylabel="best of 5, ms",
       title=f"L = {Lb}, H = {Hb}, D = {Db}, CPU, float32")
ax.legend(fontsize=7)
plt.show()
timing

# %% [markdown]
# ## 5. Decoding grows a DAG; the KV cache keeps its sources
#
# A decoder generates one token at a time. Step t adds node t to the causal
# DAG with the t + 1 edges `j -> t`, `j <= t`: a score *row* of shape 1 x (t + 1),
# not a square matrix. Earlier nodes never gain incoming edges, so their
# outputs never change, and their keys and values can be cached: each step
# computes one new query, appends one key and one value, and reads the cache.
# The result equals recomputing full causal attention on the whole prefix.

# %%
T, Hd = 12, 2
x = torch.randn(T, Hd * D, generator=gen, dtype=torch.float64)  # the tokens, one per step
w_q, w_k, w_v = (torch.randn(Hd * D, Hd * D, generator=gen, dtype=torch.float64) / math.sqrt(Hd * D)
                 for _ in range(3))
k_cache, v_cache, outputs, shapes = [], [], [], []
for t in range(T):
    q_t = (x[t] @ w_q).view(1, Hd, D)  # (1, H, D): the new node's query
    k_cache.append((x[t] @ w_k).view(1, Hd, D))
    v_cache.append((x[t] @ w_v).view(1, Hd, D))
    keys, values = torch.cat(k_cache), torch.cat(v_cache)  # (t + 1, H, D): the DAG's sources so far
    edges = torch.stack([torch.arange(t + 1), torch.zeros(t + 1, dtype=torch.long)])  # j -> the one new query
    y_t, alpha_t = ga.attention(q_t, keys, values, edges, need_weights=True)
    outputs.append(y_t)
    shapes.append(tuple(alpha_t.T.shape))  # (H, t + 1): one score row per head
y_cached = torch.cat(outputs)  # (T, H, D)
qs, ks, vs = ((x @ w).view(T, Hd, D) for w in (w_q, w_k, w_v))
y_recomputed, _ = ga.attention(qs, ks, vs, ga.patterns.causal())
print("score rows per step:", shapes[:3], "...", shapes[-1],
      f"\nmax |KV-cached - full causal recomputation| = {(y_cached - y_recomputed).abs().max():.1e}; "
      f"edges {sum(s[1] for s in shapes)} = T (T + 1) / 2 = {T * (T + 1) // 2}")
assert torch.allclose(y_cached, y_recomputed, atol=1e-12)
assert sum(s[1] for s in shapes) == T * (T + 1) // 2

# %% [markdown]
# ## 6. Multi-query and grouped-query attention: heads share a source embedding
#
# In multi-head attention every head h has its own keys and values: H source
# embeddings per token. Grouped-query attention (GQA) gives G < H key-value
# heads, each shared by H / G query heads; multi-query attention (MQA) is
# G = 1. As graphs: the same edges, but the messages `v_j` of a group's heads
# come from one shared source embedding. The cache shrinks by H / G; the
# scores do not (there are still H weights per edge).

# %%
Hq, G = 8, 2
qh = torch.randn(L, Hq, D, generator=gen, dtype=torch.float64)
kh, vh = (torch.randn(L, G, D, generator=gen, dtype=torch.float64) for _ in range(2))  # G shared heads
y_shared, _ = ga.attention(qh, kh.repeat_interleave(Hq // G, dim=1), vh.repeat_interleave(Hq // G, dim=1),
                           ga.patterns.causal())  # query head h reads key-value head h // (H / G)
y_sdpa = F.scaled_dot_product_attention(qh.transpose(0, 1), kh.transpose(0, 1), vh.transpose(0, 1),
                                        is_causal=True, enable_gqa=True).transpose(0, 1)
print(f"GQA with {Hq} query heads, {G} key-value heads: max |graph - SDPA enable_gqa| = "
      f"{(y_shared - y_sdpa).abs().max():.1e}")
assert torch.allclose(y_shared, y_sdpa, atol=1e-12)

# %% [markdown]
# The memory arithmetic of the cache, for a 7B-parameter-class decoder
# (32 layers, 32 query heads of width 128) holding 4096 tokens in 16-bit
# floats: keys and values, per layer, per key-value head, per token.

# %%
def kv_bytes(layers, kv_heads, head_dim, tokens, bytes_per_value=2):
    return 2 * layers * kv_heads * head_dim * tokens * bytes_per_value  # K and V


cache = pd.DataFrame([dict(attention=name, kv_heads=g, cache_MiB=kv_bytes(32, g, 128, 4096) / 2 ** 20)
                      for name, g in (("multi-head", 32), ("grouped-query, 8 groups", 8), ("multi-query", 1))])
cache["saving"] = cache.cache_MiB[0] / cache.cache_MiB
assert cache.cache_MiB[0] == 2048 and list(cache.saving) == [1, 4, 32]
cache

# %% [markdown]
# ## Exercises
#
# Fill in each `...` and run the cell: the checker under it says whether your
# answer is right and, if not, what is likely wrong. Solutions are in
# `notebooks/solutions/07_efficient_attention.py` (try first).
#
# 1. Write the merge step of the online softmax: given two source blocks'
#    running max `m1, m2` `(L,)`, sums `l1, l2` `(L,)` (`l = sum exp(s - m)`)
#    and unnormalised outputs `o1, o2` `(L, D)` (`o = sum exp(s - m) v`),
#    return `(m, l, o)` for both blocks together, so that `o / l` is full
#    attention over both.

# %%
from graphattn.exercises import check_kv_cache_bytes, check_online_merge


def merge(m1, l1, o1, m2, l2, o2):
    return ...  # your code


check_online_merge(merge)

# %% [markdown]
# 2. A decoder with 24 layers and 16 query heads of width 64 uses
#    grouped-query attention with 4 key-value heads. How many bytes does its
#    KV cache take for 2048 tokens in 16-bit floats (2 bytes each)?

# %%
answer_2 = ...  # your code: an int
check_kv_cache_bytes(answer_2, layers=24, query_heads=16, kv_heads=4, head_dim=64, tokens=2048, bytes_per_value=2)
