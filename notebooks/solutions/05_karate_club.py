# Solutions to the exercises of notebook 5. Each cell replaces the stub line that
# assigns the same name.

# %% answer_1
answer_1 = EDGES_WITH_SELF.size(1)  # 156 directed friendships + 34 self-loops

# %% answer_2
inverse = torch.empty_like(perm)
inverse[perm] = torch.arange(34)  # old node u is new node inverse[u]
answer_2 = inverse[EDGES_WITH_SELF]
torch.manual_seed(0)
layer = ga.AttentionConv(34, 8, heads=2)
with torch.no_grad():
    assert torch.allclose(layer(data.x[perm], answer_2), layer(data.x, EDGES_WITH_SELF)[perm], atol=1e-6)
