"""Checkers for the notebooks' exercises: each ``check_*`` says whether an answer is right and, if not, why.

A learner fills a stub cell (``answer = ...  # your code``) and calls the
checker under it. A checker recomputes the right answer independently, and for
a wrong one names the likely mistake (a swapped edge direction, a softmax over
all edges instead of per target, the book's numbers...). It returns a
:class:`Verdict`, true when right, shown as its message.

With the environment variable ``GRAPHATTN_EXERCISES_STRICT=1`` a wrong or
missing answer raises ``AssertionError`` instead: the test suite runs every
notebook with the solutions of ``notebooks/solutions/`` filled in that way.
"""

from __future__ import annotations

from graphattn.exercises.base import Verdict
from graphattn.exercises.basics import (
    check_bipartite_edges,
    check_book_softmax,
    check_equal_scores,
    check_masked_softmax,
    check_message_passing,
    check_no_incoming,
)
from graphattn.exercises.efficient import (
    check_causal_density,
    check_kv_cache_bytes,
    check_online_merge,
    check_sliding_window,
    check_window_edges,
)
from graphattn.exercises.models import (
    check_causal_bias,
    check_cls_reads,
    check_gat_first_key,
    check_global_edges,
    check_karate_edges,
    check_relabelled_edges,
    check_sentence_embedding,
    check_top_received,
)

__all__ = [
    "Verdict",
    "check_book_softmax",
    "check_bipartite_edges",
    "check_equal_scores",
    "check_masked_softmax",
    "check_message_passing",
    "check_no_incoming",
    "check_causal_density",
    "check_kv_cache_bytes",
    "check_online_merge",
    "check_sliding_window",
    "check_window_edges",
    "check_causal_bias",
    "check_cls_reads",
    "check_gat_first_key",
    "check_global_edges",
    "check_karate_edges",
    "check_relabelled_edges",
    "check_sentence_embedding",
    "check_top_received",
]
