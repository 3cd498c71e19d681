# Solutions to the exercises of notebook 3. Each cell replaces the stub line that
# assigns the same name.

# %% answer_1
received = dense[-1].mean(0).sum(0)  # (N,): column sums, what every query gives key j
answer_1 = tired.tokens[int(received.argmax())]

# %% answer_2
cls_row = dense[-1].mean(0)[0].clone()  # (N,): what query [CLS] reads
cls_row[0] = -1  # leave out [CLS] itself
answer_2 = tired.tokens[int(cls_row.argmax())]

# %% answer_3
mean_vector = tired.hidden_states[-1].mean(0)  # (F,): this model pools by mean, not [CLS]
answer_3 = mean_vector / mean_vector.norm()
