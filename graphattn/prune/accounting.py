"""Per-layer accounting of one pattern's run: the bridge's sparsity callable and its observer.

:class:`LayerRun` is handed to :func:`graphattn.interop.hf.sparsity` as
``spec=run.select, observe=run.observe``. In each attention call, for the
whole batch:

1) ``select`` gets the layer's queries, keys and the model's own graph (padding,
   causality, a local window) and returns what the spec keeps (a Pattern the
   bridge places, a bool mask, or None for dense); a data-dependent spec
   (top-k, threshold, oracle) computes the dense weights here, so its time
   includes its selection;
2) the bridge builds the kept graph and runs graph attention on it;
3) ``observe`` measures, against dense attention on the *same* inputs
   (on-policy): the attention mass on the kept edges, ``-log`` of it
   (``neg_log_mass``, what ``KL(sparse || dense)`` equals exactly), the
   relative error of the layer's attention output, kept edges and FLOPs.
   ``attn_s`` is the time from 1) to 3): selection, graph building, attention;
   ``observe_s`` the time 3) itself takes, which the row's forward time leaves out.

The dense row's run also carries *teacher-forced* accounting for every other
row (``forced``): the mass each spec would keep of the dense model's own
weights, layer by layer, on the dense run's inputs.

Layers are numbered in call order within a forward pass (modulo the model's
layer count), so a model that reuses one attention module for every layer
(ALBERT) still gets one number per layer.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

import torch
from torch import Tensor

from graphattn.prune import metrics
from graphattn.prune.specs import Spec, dense_weights
from graphattn.validate import message

__all__ = ["LayerRun", "Observed", "LayerMetric", "LAYER_METRICS", "layer_metric"]


class Observed(NamedTuple):
    """One attention call of one layer, as the per-layer metrics read it."""

    keep: Tensor  # (B, H, L, S) bool: the kept edges
    valid: Tensor  # (B, 1, L, S) bool: the model's graph
    rows: Tensor  # (B, 1, L) bool: the queries that exist
    mass: Tensor  # (B, H, L): dense mass on the kept edges
    nonempty: Tensor  # (B, H, L) bool: queries that keep some mass
    out: Tensor  # (B, H, L, D): the layer's sparse output
    reference: Tensor  # (B, H, L, D): dense attention on the same inputs


def _share(total: float, count: float) -> float:
    return total / (count or 1)


@dataclass(frozen=True)
class LayerMetric:
    """A per-layer metric: ``part(observed) -> (numerator, denominator)`` summed over a layer's calls,
    then ``finish(numerator, denominator)``; a row's value pools every layer's sums, or with
    ``total="mean"`` is the mean of the per-layer values. ``per_layer=False``: in the row only.
    """

    part: Callable[[Observed], tuple[float, float]]
    finish: Callable[[float, float], float] = _share
    per_layer: bool = True
    total: str = "pooled"


# name -> metric, in column order; a metric is one function here and a column in report.TABLE_COLUMNS
LAYER_METRICS: dict[str, LayerMetric] = {}

P = TypeVar("P", bound=Callable[[Observed], tuple[float, float]])


def layer_metric(name: str, **how) -> Callable[[P], P]:
    """Register ``part(observed) -> (numerator, denominator)`` as the per-layer metric ``name`` (see :class:`LayerMetric`)."""

    def register(part: P) -> P:
        LAYER_METRICS[name] = LayerMetric(part, **how)
        return part

    return register


def _heads(o: Observed) -> int:
    return o.keep.shape[1]


@layer_metric("density")
def _density(o: Observed) -> tuple[float, float]:
    """Kept (edge, head) pairs over the model's own."""
    return int(o.keep.sum()), _heads(o) * int(o.valid.sum())


@layer_metric("keys_per_query", per_layer=False)
def _keys_per_query(o: Observed) -> tuple[float, float]:
    """Kept keys per (query, head)."""
    return int(o.keep.sum()), _heads(o) * int(o.rows.sum())


@layer_metric("mass")
def _mass(o: Observed) -> tuple[float, float]:
    """On-policy dense mass on the kept edges, per (query, head)."""
    return float((o.mass * o.rows).sum()), _heads(o) * int(o.rows.sum())


@layer_metric("neg_log_mass", finish=lambda total, count: total / count if count else math.inf)
def _neg_log_mass(o: Observed) -> tuple[float, float]:
    """``-log`` of the mass (``KL(sparse || dense)``), over the queries that keep some."""
    return float(-o.mass[o.nonempty].double().log().sum()), int(o.nonempty.sum())


@layer_metric("empty")
def _empty(o: Observed) -> tuple[float, float]:
    """Share of (query, head) pairs that keep no mass."""
    return float((o.rows & ~o.nonempty).sum()), _heads(o) * int(o.rows.sum())


@layer_metric("out_err", finish=lambda err2, ref2: math.sqrt(err2 / ref2) if ref2 else 0.0, total="mean")
def _out_err(o: Observed) -> tuple[float, float]:
    """Relative error of the layer's output, ``||y - y_ref|| / ||y_ref||`` over the queries that exist."""
    err2 = float((((o.out - o.reference).double() ** 2).sum(-1) * o.rows).sum())
    return err2, float(((o.reference.double() ** 2).sum(-1) * o.rows).sum())


class LayerRun:
    """One row's run over all batches: one accumulator per layer; :meth:`per_layer` and :meth:`summary` read it."""

    def __init__(self, spec: Spec, num_layers: int, forced: list[Spec] | None = None):
        self.spec, self.num_layers, self.forced = spec, num_layers, list(forced or [])
        self.calls, self.layer, self.valid, self.started = 0, 0, None, 0.0
        # per layer, per metric: [numerator, denominator] summed over the layer's calls
        self.sums = [{name: [0.0, 0.0] for name in LAYER_METRICS} for _ in range(num_layers)]
        self.queries = [0.0] * num_layers  # (query, head) pairs per layer: the teacher-forced masses' count
        self.forced_mass = [[0.0] * num_layers for _ in self.forced]
        self.attn_s, self.observe_s, self.flops, self.select_flops = 0.0, 0.0, 0, 0

    @torch.no_grad()
    def select(self, layer: int, query: Tensor, key: Tensor, mask: Tensor):
        """1) the kept edges of this call's layer, inside the model's graph ``mask (B, L, S)``."""
        self.started = time.perf_counter()
        self.layer, self.calls = self.calls % self.num_layers, self.calls + 1
        self.valid = mask.unsqueeze(1)  # (B, 1, L, S)
        keep = self.spec.select(self.layer, query, key, self.valid)
        if isinstance(keep, Tensor) and keep.shape[1] == 1 and torch.equal(keep, self.valid):
            return None  # every edge kept: the bridge attends on the model's own (cached) graph
        if self.spec.data_dependent and self.spec.applies(self.layer):
            self.select_flops += metrics.score_flops(query.shape[1] * int(self.valid.sum()), query.shape[-1])
        return keep

    @torch.no_grad()
    def observe(self, layer: int, query: Tensor, key: Tensor, value: Tensor, graph, out: Tensor, alpha: Tensor):
        """3) local metrics of the layer against dense attention on the same inputs."""
        entered = time.perf_counter()
        self.attn_s += entered - self.started
        try:
            self._observe(query, key, value, graph, out)
        finally:
            self.observe_s += time.perf_counter() - entered

    def _observe(self, query: Tensor, key: Tensor, value: Tensor, graph, out: Tensor):
        at, valid = self.layer, self.valid
        y = out.transpose(1, 2)  # (B, L, H, D) -> (B, H, L, D)
        keep = graph.allowed.expand(y.shape[0], y.shape[1], *graph.allowed.shape[2:])  # (B, H, L, S)
        if not bool(torch.isfinite(y).all()):
            raise FloatingPointError(
                message(
                    "output",
                    "finite (graph attention's output)",
                    f"NaN or inf in layer {at}, {int(keep.sum())} kept (edge, head) pairs",
                )
            )
        weights = dense_weights(query, key, valid)  # (B, H, L, S)
        rows = valid.any(-1)  # (B, 1, L): queries that exist
        mass = metrics.attention_mass(weights, keep)  # (B, H, L)
        nonempty = keep.any(-1) & rows & (mass > 0)  # (B, H, L)
        y_ref = weights @ value  # (B, H, L, S) · (B, H, S, D) -> (B, H, L, D)
        observed = Observed(keep, valid, rows, mass, nonempty, y, y_ref)
        for name, metric in LAYER_METRICS.items():
            total, count = metric.part(observed)
            self.sums[at][name][0] += total
            self.sums[at][name][1] += count
        self.queries[at] += query.shape[1] * int(rows.sum())
        self.flops += metrics.attention_flops(int(keep.sum()), query.shape[-1])
        if self.forced:  # teacher-forced: what each other spec keeps of these dense weights
            ranked = weights.sort(-1, descending=True).values.cumsum(-1)  # (B, H, L, S)
            for sums, spec in zip(self.forced_mass, self.forced):
                sums[at] += float((spec.forced_mass(at, weights, valid, ranked) * rows).sum())

    def per_layer(self) -> list[dict]:
        """One dict per layer: ``layer`` and every per-layer metric of :data:`LAYER_METRICS`."""
        return [
            {"layer": i, **{name: m.finish(*self.sums[i][name]) for name, m in LAYER_METRICS.items() if m.per_layer}}
            for i in range(self.num_layers)
        ]

    def forced_per_layer(self) -> list[list[float]]:
        """Teacher-forced mass of each of ``forced``, per layer."""
        return [[m / (q or 1) for m, q in zip(sums, self.queries)] for sums in self.forced_mass]

    def summary(self) -> dict:
        """Every metric of :data:`LAYER_METRICS` over the layers: pooled sums, or the mean of the per-layer values."""
        out = {}
        for name, metric in LAYER_METRICS.items():
            if metric.total == "mean":
                values = [metric.finish(*layer[name]) for layer in self.sums]
                out[name] = sum(values) / len(values)
            else:
                out[name] = metric.finish(*(sum(layer[name][k] for layer in self.sums) for k in (0, 1)))
        return out
