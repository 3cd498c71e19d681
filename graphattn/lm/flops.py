"""Training FLOPs of the byte-level LM, split into attention and the rest.

Counted as 2 FLOPs per multiply-add of the matrix products, the convention of
Kaplan et al. [1]_ and Chinchilla [2]_, and a training step costs 3 times its
forward pass (the backward computes two products for each one of the
forward). Per sequence of T bytes, with d = ``d_model``, f = ``d_ff``,
V = 256, l = ``layers`` and E the attention graph's edges on T bytes:

- the rest (weights), forward: ``2 T (l (3 d^2 + d^2 + 2 d f) + d V)``: the
  q/k/v and output projections, the MLP, the tied head;
- attention, forward: ``4 d E l``: per edge and head a D-long dot product
  (q . k) and a D-long weighted sum of a value, 2 D multiply-adds, times H
  heads with H D = d.

Dense (SDPA causal) counts the causal DAG's T (T + 1) / 2 edges: the useful
work, which is what a causal kernel that skips the masked tiles does.
Softmax, LayerNorm, GELU and the embedding lookups are left out (a few
percent at these sizes).

References
----------
.. [1] Kaplan et al., "Scaling Laws for Neural Language Models", 2020, Table 1.
.. [2] Hoffmann et al., "Training Compute-Optimal Large Language Models", 2022, Appendix F.
"""

from __future__ import annotations

from graphattn.lm.model import DENSE, LMConfig, attention_graph

__all__ = ["BACKWARD_FACTOR", "num_edges", "forward_flops", "training_flops"]

BACKWARD_FACTOR = 3  # forward + backward = 3 x forward


def num_edges(spec: str, length: int) -> int:
    """Edges of the causal attention graph of ``spec`` on ``length`` bytes (dense: L (L + 1) / 2)."""
    if spec == DENSE:
        return length * (length + 1) // 2
    return int(attention_graph(spec).edge_index(length).size(1))


def forward_flops(config: LMConfig, length: int | None = None, edges: int | None = None) -> dict:
    """FLOPs of one forward pass over one sequence: ``{"attention", "other", "total"}`` (module docstring).

    Parameters
    ----------
    config : LMConfig
    length : int, optional
        T, default ``config.length``.
    edges : int, optional
        E, default :func:`num_edges` of ``config.pattern`` on T bytes.
    """
    T = config.length if length is None else length
    E = num_edges(config.pattern, T) if edges is None else edges
    d, f, V, n_layers = config.d_model, config.d_ff, config.vocab, config.layers
    other = 2 * T * (n_layers * (4 * d * d + 2 * d * f) + d * V)  # q, k, v, o projections; MLP; tied head
    attention = 4 * d * E * n_layers  # scores q·k and weighted sum of v: 2 d multiply-adds per edge each
    return {"attention": attention, "other": other, "total": attention + other}


def training_flops(config: LMConfig, sequences: int = 1, edges: int | None = None) -> dict:
    """FLOPs of training on ``sequences`` sequences of ``config.length`` bytes (3 x forward)."""
    one = forward_flops(config, edges=edges)
    return {k: BACKWARD_FACTOR * v * sequences for k, v in one.items()}
