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

import torch
from torch import Tensor

from graphattn.prune import metrics
from graphattn.prune.specs import Spec, dense_weights

__all__ = ["LayerRun"]


class LayerRun:
    """One row's run over all batches; per-layer sums, :meth:`per_layer` and :meth:`summary` read them."""

    def __init__(self, spec: Spec, num_layers: int, forced: list[Spec] | None = None):
        self.spec, self.num_layers, self.forced = spec, num_layers, list(forced or [])
        self.calls, self.layer, self.valid, self.started = 0, 0, None, 0.0
        z = lambda: [0.0] * num_layers  # noqa: E731
        self.mass, self.nlm, self.queries, self.empty = z(), z(), z(), z()
        self.err2, self.ref2, self.kept, self.dense = z(), z(), z(), z()
        self.forced_mass = [z() for _ in self.forced]
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
                f"Expected graph attention to return finite outputs (got NaN or inf in "
                f"layer {at}, {int(keep.sum())} kept (edge, head) pairs)"
            )
        weights = dense_weights(query, key, valid)  # (B, H, L, S)
        rows = valid.any(-1)  # (B, 1, L): queries that exist
        mass = metrics.attention_mass(weights, keep)  # (B, H, L)
        nonempty = keep.any(-1) & rows & (mass > 0)  # (B, H, L)
        heads = query.shape[1]
        self.mass[at] += float((mass * rows).sum())
        self.nlm[at] += float(-mass[nonempty].double().log().sum())
        self.empty[at] += float((rows & ~nonempty).sum())
        self.queries[at] += heads * int(rows.sum())
        y_ref = weights @ value  # (B, H, L, S) · (B, H, S, D) -> (B, H, L, D)
        self.err2[at] += float((((y - y_ref).double() ** 2).sum(-1) * rows).sum())
        self.ref2[at] += float(((y_ref.double() ** 2).sum(-1) * rows).sum())
        kept = int(keep.sum())
        self.kept[at] += kept
        self.dense[at] += heads * int(valid.sum())
        self.flops += metrics.attention_flops(kept, query.shape[-1])
        if self.forced:  # teacher-forced: what each other spec keeps of these dense weights
            ranked = weights.sort(-1, descending=True).values.cumsum(-1)  # (B, H, L, S)
            for sums, spec in zip(self.forced_mass, self.forced):
                sums[at] += float((spec.forced_mass(at, weights, valid, ranked) * rows).sum())

    def per_layer(self) -> list[dict]:
        """One dict per layer: density, on-policy mass, neg_log_mass, empty, out_err."""
        out = []
        for i in range(self.num_layers):
            q = self.queries[i] or 1
            nonempty = q - self.empty[i]
            out.append(
                {
                    "layer": i,
                    "density": self.kept[i] / (self.dense[i] or 1),
                    "mass": self.mass[i] / q,
                    "neg_log_mass": self.nlm[i] / nonempty if nonempty else math.inf,
                    "empty": self.empty[i] / q,
                    "out_err": math.sqrt(self.err2[i] / self.ref2[i]) if self.ref2[i] else 0.0,
                }
            )
        return out

    def forced_per_layer(self) -> list[list[float]]:
        """Teacher-forced mass of each of ``forced``, per layer."""
        return [[m / (q or 1) for m, q in zip(sums, self.queries)] for sums in self.forced_mass]

    def summary(self) -> dict:
        """Totals over layers: density, keys_per_query, mass, neg_log_mass, empty, out_err (mean over layers)."""
        queries = sum(self.queries)
        nonempty = queries - sum(self.empty)
        layers = self.per_layer()
        return {
            "density": sum(self.kept) / sum(self.dense),
            "keys_per_query": sum(self.kept) / queries,
            "mass": sum(self.mass) / queries,
            "neg_log_mass": sum(self.nlm) / nonempty if nonempty else math.inf,
            "empty": sum(self.empty) / queries,
            "out_err": sum(r["out_err"] for r in layers) / len(layers),
        }
