"""Checkers for notebooks 3 (a real model), 5 (the karate club) and 6 (graph transformers)."""

from __future__ import annotations

import torch
from torch import Tensor

from graphattn.exercises.base import as_edges, as_tensor, close, same_edges, unanswered, verdict

__all__ = [
    "check_top_received",
    "check_cls_reads",
    "check_sentence_embedding",
    "check_karate_edges",
    "check_relabelled_edges",
    "check_gat_first_key",
    "check_global_edges",
    "check_causal_bias",
]


def check_top_received(answer, weights: Tensor, tokens: list[str]):
    """Notebook 3: the token that receives the most attention, heads averaged (``weights`` (H, N, N), query = row)."""
    if (v := unanswered(answer)) is not None:
        return v
    received = weights.mean(0).sum(0)  # (N,): column sums, what all queries give to key j
    right = tokens[int(received.argmax())]
    if answer == right:
        return verdict(True, f"{right} receives {received.max().item():.2f} of the {len(tokens)} rows' weight.")
    if answer in tokens:
        got = received[tokens.index(answer)].item()
        return verdict(
            False,
            f"'{answer}' receives {got:.2f}; sum each key's column (weights[:, :, j]) over the "
            f"queries, heads averaged.",
        )
    return verdict(False, f"answer one of the tokens {tokens} (got {answer!r}).")


def check_cls_reads(answer, weights: Tensor, tokens: list[str]):
    """Notebook 3: the token other than [CLS] that [CLS]'s own row reads most (``weights`` (H, N, N))."""
    if (v := unanswered(answer)) is not None:
        return v
    row = weights.mean(0)[0].clone()  # (N,): what query [CLS] reads
    row[0] = -1
    right = tokens[int(row.argmax())]
    if answer == right:
        return verdict(True, f"[CLS] reads '{right}' most after itself ({row.max().item():.3f}).")
    if answer == tokens[0]:
        return verdict(False, "leave out [CLS] itself: which other token does its row read most?")
    column = weights.mean(0)[1:, :].sum(0).clone()  # (N,): what the others give each key
    column[0] = -1
    if answer == tokens[int(column.argmax())]:
        return verdict(False, "that is what the other tokens read (a column); [CLS]'s own row is weights[:, 0, :].")
    return verdict(False, f"read row 0 of the last layer's weights, heads averaged (got {answer!r}).")


def check_sentence_embedding(answer, last_hidden: Tensor, embedding: Tensor):
    """Notebook 3: MiniLM's sentence vector from the last layer's token vectors ``last_hidden`` (N, F)."""
    if (v := unanswered(answer)) is not None:
        return v
    a = as_tensor(answer)
    mean = last_hidden.double().mean(0)  # (F,)
    if close(a, embedding.double(), 1e-5):
        return verdict(True, "the normalised mean of the token vectors: this model pools by mean, not [CLS].")
    if close(a, last_hidden[0].double() / last_hidden[0].double().norm(), 1e-5):
        return verdict(False, "that is the [CLS] vector; this model's pooling is the mean of all tokens.")
    if close(a, mean, 1e-5):
        return verdict(False, "the mean is right; the sentence vector is then normalised to length 1.")
    return verdict(False, "average the last layer's token vectors, then normalise.")


def check_karate_edges(answer):
    """Notebook 5: the number of edges ``AttentionConv`` attends along in the karate club with self-loops."""
    if (v := unanswered(answer)) is not None:
        return v
    from torch_geometric.datasets import KarateClub

    data = KarateClub()[0]
    right = data.edge_index.size(1) + data.num_nodes  # directed friendships + one self-loop per member
    if answer == right:
        return verdict(
            True, f"{right}: {data.edge_index.size(1)} directed friendships and {data.num_nodes} self-loops."
        )
    if answer == data.edge_index.size(1):
        return verdict(False, "the self-loops added to the graph are edges too: each member reads itself.")
    if answer == data.edge_index.size(1) // 2 + data.num_nodes or answer == data.edge_index.size(1) // 2:
        return verdict(False, "edge_index stores each friendship twice, once per direction.")
    return verdict(False, f"count the columns of the edge_index the layer is given (got {answer}).")


def check_relabelled_edges(answer, edge_index: Tensor, perm: Tensor):
    """Notebook 5: ``edge_index`` renumbered for features ``x[perm]`` (new node n holds old node perm[n])."""
    if (v := unanswered(answer)) is not None:
        return v
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel())  # old node u is new node inverse[u]
    a = as_edges(answer)
    if same_edges(a, inverse[edge_index]):  # in any edge order: a graph's edges are a set
        return verdict(True, "old node u is new node inverse[u]: the same edges between renumbered nodes.")
    if same_edges(a, perm[edge_index]):
        return verdict(
            False,
            "x[perm] puts old node perm[n] at n, so old node u moves to the inverse "
            "permutation's position; use inverse[edge_index].",
        )
    return verdict(False, "renumber both rows of edge_index with the inverse permutation.")


def check_gat_first_key(answer, gat, x: Tensor):
    """Notebook 6: for each head of a GATConv on the complete graph, the key every query ranks first."""
    if (v := unanswered(answer)) is not None:
        return v
    heads, channels = gat.heads, gat.out_channels
    with torch.no_grad():
        source = (gat.lin(x).view(-1, heads, channels) * gat.att_src).sum(-1)  # (N, H): a_src · W x_j
    right = source.argmax(0)  # (H,): one key per head
    a = torch.as_tensor(answer).reshape(-1)
    if a.shape == right.shape and bool((a == right).all()):
        return verdict(
            True,
            f"per head, the key with the largest a_src · W x_j: {right.tolist()}; each head has "
            "its own static ranking.",
        )
    query = (gat.lin(x).view(-1, heads, channels) * gat.att_dst).sum(-1).argmax(0)  # (H,)
    if a.shape == right.shape and bool((a == query).all()):
        return verdict(
            False,
            "that ranks by the query term a_dst · W x_i, which is the same for every key of a row; "
            "the key term a_src · W x_j decides.",
        )
    return verdict(False, f"one key per head: the argmax over j of a_src · W x_j (got {a.tolist()}).")


def check_global_edges(answer, sizes=(12, 20, 7)):
    """Notebook 6: the edges of GraphGPS's global step on a batch of graphs with ``sizes`` nodes."""
    if (v := unanswered(answer)) is not None:
        return v
    right = sum(n * n for n in sizes)  # a complete graph per graph, none across graphs
    if answer == right:
        return verdict(True, f"{right} = sum of n^2: attention stays inside each graph.")
    if answer == sum(sizes) ** 2:
        return verdict(
            False,
            f"{sum(sizes) ** 2} = (sum n)^2 lets nodes of different graphs read each other; "
            "the global step is one complete graph per graph.",
        )
    return verdict(False, f"a complete graph with self-loops per graph: sum of n^2 (got {answer}).")


def check_causal_bias(bias, edge_index: Tensor):
    """Notebook 6: the ``edge_bias`` (E,) that turns full attention along ``edge_index`` into causal attention."""
    if (v := unanswered(bias)) is not None:
        return v
    b = as_tensor(bias).reshape(-1)
    future = edge_index[0] > edge_index[1]  # (E,): source j after target i
    if b.numel() != future.numel():
        return verdict(False, f"one bias per edge: {future.numel()} (got {b.numel()}).")
    blocked = bool(torch.isneginf(b[future]).all())
    if blocked and bool((b[~future] == 0).all()):
        return verdict(True, "-inf on the edges j > i gives them weight exactly 0; 0 elsewhere changes nothing.")
    if bool(torch.isneginf(b[~future & (edge_index[0] != edge_index[1])]).all()):
        return verdict(False, "that blocks the past: row 0 is the source j, row 1 the target i; causal blocks j > i.")
    if not blocked and bool((b[future] <= -1e4).all()):
        return verdict(
            False,
            "a large finite penalty such as -1e9 gives the future edges weight 0 here only because "
            "exp underflows while each row keeps an allowed key; -inf is exact for any scores.",
        )
    if not blocked:
        return verdict(False, "the future edges j > i need -inf (a finite penalty leaves them some weight).")
    return verdict(False, "the allowed edges j <= i need bias 0, or their scores change.")
