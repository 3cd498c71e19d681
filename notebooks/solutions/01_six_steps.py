# Solutions to the exercises of notebook 1. Each cell replaces the line of the
# stub that assigns the same name (`answer_1 = ...`, or `return ...` in `masked_softmax`).

# %% answer_1
answer_1 = worked_example((3.0, 3.0, 3.0), d_k=9, values=torch.eye(3).tolist())["weights"]

# %% answer_2
e = torch.exp(torch.tensor([2.1, 0.4, -0.3], dtype=torch.float64) / math.sqrt(4))
answer_2 = e / e.sum()  # 0.578 / 0.247 / 0.174: the token keeps 58 %, not two thirds

# %% masked_softmax
    weights = scores.masked_fill(~keep, float("-inf")).softmax(-1)  # mask before the softmax
    return torch.nan_to_num(weights, nan=0.0)  # a row with no key: 0 / 0 -> a zero row
