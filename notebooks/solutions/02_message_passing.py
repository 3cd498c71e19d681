# Solutions to the exercises of notebook 2. Each cell replaces the stub line that
# assigns the same name (`answer_1 = ...`), or the `return ...` of the function named.

# %% answer_1
answer_1 = ga.graphs.mask_to_edge_index(torch.ones(7, 3, dtype=torch.bool))  # 21 edges, 3 into each query

# %% answer_2
no_loop0 = causal[:, ~((causal[0] == 0) & (causal[1] == 0))]  # drop the only edge into node 0
answer_2 = ga.attention(q, k, v, no_loop0)[0][0]  # zero: no message reaches node 0

# %% attend
    from torch_geometric.utils import softmax

    src, dst = edge_index  # (E,) keys j, queries i
    score = (q[dst] * k[src]).sum(-1) / math.sqrt(q.size(-1))  # (E, H, D) · (E, H, D) -> (E, H)
    alpha = softmax(score, dst, num_nodes=q.size(0))  # (E, H): sums to 1 over the edges into each i
    out = torch.zeros(q.size(0), *v.shape[1:], dtype=v.dtype)  # (L, H, D)
    return out.index_add_(0, dst, alpha[..., None] * v[src])  # sum of alpha_ij v_j into each i
