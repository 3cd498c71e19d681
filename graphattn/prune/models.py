"""The experiment's models: any local Hugging Face encoder (or causal LM), its limits, and its forward pass.

Loading, the max-length check and pooling are the bridge's, one of each
(:mod:`graphattn.interop.hf`, :mod:`graphattn.interop.local`), named here as
the experiment uses them: :func:`load_model` is
:func:`graphattn.interop.hf.load_local` (the packaged all-MiniLM-L6-v2 by
default, or a local model folder, or an installed package that ships one,
always with ``local_files_only=True``: nothing is downloaded; a folder whose
config names a causal LM loads with its head, so that the experiment can
report the next-token NLL).

:func:`encode` is the one forward loop of every row: pooled, L2-normalised
embeddings (:func:`graphattn.interop.hf.pool`: ``mean`` over real tokens, as
sentence-transformers does for MiniLM, or the first token, ``cls``) and, for a
causal LM, the mean next-token negative log-likelihood of each text, in nats.
"""

from __future__ import annotations

import contextlib
import json
import os
import re

import torch
from torch import Tensor

from graphattn import _compat
from graphattn.interop import hf, hooks
from graphattn.interop.hf import IMPLEMENTATION, POOLINGS, check_max_length, pool
from graphattn.interop.hf import load_local as load_model
from graphattn.interop.local import default_pooling, model_config, model_path
from graphattn.prune import corpus

__all__ = [
    "IMPLEMENTATION",
    "POOLINGS",
    "load_model",
    "model_config",
    "model_path",
    "check_max_length",
    "trained_length",
    "default_pooling",
    "is_causal",
    "attention_implementation",
    "encode",
]


def trained_length(source=None, config=None) -> int | None:
    """The input length the model was trained on, from its card or folder, or None if unknown.

    Read in order: the model card's "sequence length was limited to N tokens"
    (sentence-transformers cards say so), ``sentence_bert_config.json``'s
    ``max_seq_length``, the config's ``max_position_embeddings``.
    """
    path = model_path(source)
    card = os.path.join(path, "README.md")
    if os.path.isfile(card):
        with open(card, encoding="utf-8", errors="replace") as f:
            found = re.search(r"sequence length was limited to (\d+) tokens", f.read())
        if found:
            return int(found.group(1))
    st = os.path.join(path, "sentence_bert_config.json")
    if os.path.isfile(st):
        with open(st, encoding="utf-8") as f:
            value = json.load(f).get("max_seq_length")
        if isinstance(value, int):
            return value
    config = config if config is not None else model_config(source)
    return getattr(config, "max_position_embeddings", None)


def is_causal(model) -> bool:
    """Whether the model's self-attention is causal (GPT-2 and other decoders)."""
    return any(bool(getattr(m, "is_causal", False)) for m in hooks.attention_modules(model))


@contextlib.contextmanager
def attention_implementation(model, name: str):
    """Run ``model`` with the attention implementation ``name`` inside the block (public
    ``set_attn_implementation``), then restore the one it had.
    """
    before = _compat.hf_attn_implementation(model)
    if name == IMPLEMENTATION:
        hf.register()
    model.set_attn_implementation(name)
    try:
        yield model
    finally:
        model.set_attn_implementation(before)


@torch.no_grad()
def encode(
    model, tokenizer, texts: list[str], max_length: int, batch_size: int = 16, pooling: str = "mean", step=None
) -> tuple[Tensor, Tensor | None]:
    """Pooled unit-norm embeddings of ``texts`` and, for a causal LM, their next-token NLL.

    Texts run in batches sorted by token count (less padding); results come back in the texts' order.

    Parameters
    ----------
    texts : list of str
    max_length : int
        Longer texts are truncated.
    batch_size : int, default 16
    pooling : {"mean", "cls"}, default "mean"
        Mean of the last hidden states over real tokens, or the first token's.
    step : callable, optional
        Called once per batch (a progress bar's ``update``).

    Returns
    -------
    embeddings : Tensor, shape (N, F)
        float32, unit-norm rows.
    nll : Tensor, shape (N,), or None
        Mean over each text's next-token predictions of ``-log p`` in nats
        (None unless the model returns ``logits``); a text of one token gets NaN.
    """
    texts = corpus.cut(texts, max_length)  # never tokenize a long text whole
    ids = tokenizer(texts, truncation=True, max_length=max_length, verbose=False)["input_ids"]
    lengths = [len(row) for row in ids]
    order = sorted(range(len(texts)), key=lambda i: lengths[i])
    embs, nlls = [], []
    for start in range(0, len(order), batch_size):
        batch = tokenizer(
            [texts[i] for i in order[start : start + batch_size]],
            padding=True,
            truncation=True,
            max_length=max_length,
            return_tensors="pt",
        ).to(model.device)
        # ids and padding only: token_type_ids default to zeros in BERT, and GPT-2 would embed them as tokens
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True)
        hidden = out.hidden_states[-1]  # (B, T, F)
        pooled = pool(hidden, batch["attention_mask"], pooling)  # (B, F)
        embs.append(torch.nn.functional.normalize(pooled.float(), dim=-1))
        if getattr(out, "logits", None) is not None:
            real = batch["attention_mask"].to(hidden.dtype)  # (B, T)
            nlls.append(_next_token_nll(out.logits, batch["input_ids"], real))
        if step is not None:
            step()
    unsort = torch.tensor(order).argsort()  # (N,): back to the texts' order
    emb = torch.cat(embs)[unsort]  # (N, F)
    return emb, (torch.cat(nlls)[unsort] if nlls else None)


def _next_token_nll(logits: Tensor, ids: Tensor, real: Tensor) -> Tensor:
    """Mean ``-log p(token t+1 | tokens <= t)`` over each row's real next tokens: (B,)."""
    logp = torch.log_softmax(logits[:, :-1].double(), -1)  # (B, T-1, V)
    target = ids[:, 1:]  # (B, T-1)
    picked = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (B, T-1)
    pair = (real[:, :-1] * real[:, 1:]).double()  # (B, T-1): both tokens real
    return ((picked * pair).sum(1) / pair.sum(1)).float()  # (B,); NaN for a text of one token
