"""Attention graphs as networkx graphs: export, rollout, flow, hubs, smoothing.

Every function follows docs/design.md: an edge ``(j, i)`` (``edge_index[0] = j``,
``edge_index[1] = i``) says query i reads key j with weight alpha_ij, and for
each query the weights sum to 1 over its incoming edges. Node indices are token
positions, so ``|i - j|`` is a distance in tokens.

- :func:`to_networkx` turns one layer's ``(edge_index, alpha)`` into a
  ``networkx.DiGraph`` with edges j -> i (GraphML export works).
- :func:`attention_received` and :func:`attention_pagerank` rank the tokens
  that collect attention (hubs such as [CLS] and [SEP]; PageRank [2]_); graph first,
  ``weight="weight"``, dicts keyed by node holding Python floats.
- :func:`attention_rollout` and :func:`attention_flow` follow information
  through the layers (Abnar & Zuidema 2020 [1]_).
- :func:`self_share` and :func:`mean_attention_distance` summarise each head;
  :func:`mean_cosine_similarity` measures over-smoothing of representations [3]_.

Modules: ``nxgraph`` (export, hubs), ``flow`` (rollout, flow), ``heads``
(per-head summaries, smoothing). Every function refuses NaN, inf or negative
weights and edge lists that are not ``(2, E)`` integer tensors, with
:mod:`graphattn.validate`'s message.

References
----------
.. [1] S. Abnar and W. Zuidema, "Quantifying Attention Flow in Transformers",
   ACL 2020, section 3. https://arxiv.org/abs/2005.00928
.. [2] L. Page, S. Brin, R. Motwani and T. Winograd, "The PageRank Citation
   Ranking: Bringing Order to the Web", Stanford InfoLab, 1999.
.. [3] K. Ethayarajh, "How Contextual are Contextualized Word
   Representations?", EMNLP 2019 (mean pairwise cosine similarity per layer).
"""

from graphattn.analysis.flow import FLOW_MAX_NODES, attention_flow, attention_rollout
from graphattn.analysis.heads import mean_attention_distance, mean_cosine_similarity, self_share, smoothing_per_layer
from graphattn.analysis.nxgraph import attention_pagerank, attention_received, to_networkx

__all__ = [
    "to_networkx",
    "attention_received",
    "attention_pagerank",
    "attention_rollout",
    "attention_flow",
    "self_share",
    "mean_attention_distance",
    "mean_cosine_similarity",
    "smoothing_per_layer",
    "FLOW_MAX_NODES",
]
