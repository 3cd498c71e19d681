"""Paired tests for a pruned model against dense on the same queries, and the correction across a table.

- :func:`sign_flip_test`: the two-sided paired sign-flip (randomisation) test [1]_
  of ``mean(other - reference) = 0``. Under the null hypothesis that pruning
  changes nothing systematic, each query's difference is as likely to have
  either sign, so the observed ``|mean|`` is compared with ``|mean|`` under
  random sign flips. Only the queries whose score changed carry a sign;
  their number is returned beside the p-value (an interval that rests on
  12 changed queries of 76 says so). Exact enumeration of all ``2^m`` flips
  up to ``EXACT_MAX`` changed queries, a seeded Monte Carlo beyond.
- :func:`holm`: Holm-Bonferroni adjusted p-values [2]_ for a family of comparisons
  (every row of a table or sweep against dense), controlling the
  family-wise error rate.

References
----------
.. [1] Good, "Permutation, Parametric, and Bootstrap Tests of Hypotheses", 3rd ed., 2005, section 3.1.
.. [2] Holm, "A Simple Sequentially Rejective Multiple Test Procedure", Scand. J. Statist. 6, 1979.
"""

from __future__ import annotations

import numpy as np

__all__ = ["EXACT_MAX", "sign_flip_test", "holm"]

EXACT_MAX = 16  # changed queries up to which all 2^m sign patterns are enumerated (65536 rows)


def sign_flip_test(reference, other, seed: int = 0, resamples: int = 10_000) -> tuple[float, int]:
    """Two-sided paired sign-flip test of a zero mean difference; ``(p, changed)``.

    Parameters
    ----------
    reference, other : array_like, shape (n,)
        Paired per-query scores (dense, pruned); NaN pairs are dropped.
    seed : int, default 0
        Of the Monte Carlo flips (unused when the test is exact).
    resamples : int, default 10000
        Monte Carlo sign patterns beyond ``EXACT_MAX`` changed queries.

    Returns
    -------
    p : float
        In (0, 1]; 1.0 when no query changed. Monte Carlo p-values count the
        observed pattern, ``(1 + hits) / (1 + resamples)``, so never 0.
    changed : int
        Queries whose score differs.

    Examples
    --------
    >>> sign_flip_test([0, 0, 0, 0], [1, 1, 1, 0])   # 3 changed, all up: 2 of 8 patterns as extreme
    (0.25, 3)
    >>> sign_flip_test([1, 2], [1, 2])
    (1.0, 0)
    """
    reference, other = np.asarray(reference, dtype=np.float64), np.asarray(other, dtype=np.float64)
    diff = other - reference
    diff = diff[np.isfinite(diff) & (diff != 0)]  # (m,): a zero difference has no sign
    m = diff.size
    if m == 0:
        return 1.0, 0
    observed = abs(diff.sum()) * (1 - 1e-12)  # a relative tolerance: sums of the same values in another order
    if m <= EXACT_MAX:
        codes = np.arange(2**m)[:, None] >> np.arange(m) & 1  # (2^m, m): every sign pattern, bit k = query k
        sums = np.abs((1 - 2 * codes) @ diff)  # (2^m, m) · (m,) -> (2^m,)
        return float((sums >= observed).mean()), m
    rng = np.random.default_rng(seed)
    hits, done, chunk = 0, 0, max(1, 2**22 // m)  # about 32 MB of signs at a time
    while done < resamples:
        n = min(chunk, resamples - done)
        signs = rng.integers(0, 2, size=(n, m)) * 2 - 1  # (n, m)
        hits += int((np.abs(signs @ diff) >= observed).sum())  # (n, m) · (m,) -> (n,)
        done += n
    return (1 + hits) / (1 + resamples), m


def holm(pvalues) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values, in the input's order (NaN stays NaN, out of the family).

    The k-th smallest of m p-values is multiplied by ``m - k + 1`` (k from 1),
    made non-decreasing along that order and capped at 1; rejecting where the
    adjusted value is <= alpha keeps the family-wise error rate at alpha.

    Examples
    --------
    >>> holm([0.01, 0.04, 0.03, float("nan")]).round(3).tolist()
    [0.03, 0.06, 0.06, nan]
    """
    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    order = ok[np.argsort(p[ok], kind="stable")]  # indices of the family, smallest p first
    m = order.size
    adjusted = np.maximum.accumulate(p[order] * (m - np.arange(m)))  # (m,)
    out[order] = np.minimum(adjusted, 1.0)
    return out
