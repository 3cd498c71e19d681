# Solutions to the exercises of notebook 4. Each cell replaces the stub line that
# assigns the same name.

# %% answer_1
answer_1 = P.window(1, 1).edge_index(10).size(1)  # 3 L - 2 = 28: the end tokens have one neighbour

# %% answer_2
answer_2 = P.causal().edge_index(16).size(1) / 16 ** 2  # 136 / 256: the self-loops count

# %% answer_3
answer_3 = torch.tensor([(j, i) for i in range(8) for j in range(max(0, i - 2), i + 1)]).T  # (2, E)
