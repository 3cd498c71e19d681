"""The ``"graphattn"`` attention function and the per-module hook state behind ``sparsity``/``recording``.

:func:`graph_attention_forward` is what transformers calls in every attention
layer of a model loaded with ``attn_implementation="graphattn"`` (registered
by :func:`graphattn.interop.hf.register`):

1) mask -> graph  the 4-D mask transformers builds becomes edges ``(j, i)``
   (:func:`graphattn.interop.masks.base_graph`; padding is absent nodes);
2) sparsity       the innermost active :func:`~graphattn.interop.hf.sparsity`
   block of the module, if any, intersects its pattern with that graph (and
   every active block's ``observe`` sees the layer's result after step 3);
3) attend         ``ops.attention`` on nodes ``b * L + i`` (queries) and
   ``b * S + j`` (keys) of the flattened batch; one call per layer;
4) record         every active :func:`~graphattn.interop.hf.recording` block
   of the module receives ``(layer, graph, alpha)``.

Hook state is kept per attention module (weakly: a deleted model leaves
nothing behind), as a stack per module so that nested blocks restore the
outer block on exit, under one lock. It is per model, not per thread: two
threads that open different ``sparsity`` blocks on the same model see each
other's pattern.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from dataclasses import dataclass

from torch import Tensor, nn

from graphattn import _compat, ops
from graphattn.interop.masks import base_graph, sparse_graph

__all__ = ["graph_attention_forward", "attention_modules", "active"]

_LOCK = threading.RLock()
_LAYERS: weakref.WeakKeyDictionary[nn.Module, int] = weakref.WeakKeyDictionary()  # attention module -> layer
_SPARSITY: weakref.WeakKeyDictionary[nn.Module, list] = weakref.WeakKeyDictionary()  # module -> [_Entry]
_RECORDERS: weakref.WeakKeyDictionary[nn.Module, list] = weakref.WeakKeyDictionary()  # module -> [_Entry]
TABLES = {"sparsity": _SPARSITY, "recording": _RECORDERS}


@dataclass(eq=False)
class _Entry:
    """One open block: its value (a pattern or function, or the list of records) and the calls it saw."""

    value: object
    calls: int = 0


def _is_cross(module: nn.Module) -> bool:
    return "Cross" in type(module).__name__ or bool(getattr(module, "is_cross_attention", False))


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The self-attention modules of ``model``, numbered (their ``layer_idx``, else their order).

    Attention modules of transformers' ``AttentionInterface`` models carry
    ``is_causal`` (SDPA reads it); older ones only a ``layer_idx``.
    """
    inner = [m for m in model.modules() if m is not model and not hasattr(m, "config_class")]
    found = [m for m in inner if hasattr(m, "is_causal") and not _is_cross(m)]
    found = found or [m for m in inner if hasattr(m, "layer_idx") and not _is_cross(m)]
    with _LOCK:
        for order, m in enumerate(found):
            _LAYERS[m] = m.layer_idx if isinstance(getattr(m, "layer_idx", None), int) else order
    return found


@contextlib.contextmanager
def active(kind: str, model: nn.Module, modules: list[nn.Module], value):
    """Push ``value`` on the ``kind`` stack of every module in ``modules`` for the duration of the block.

    A forward pass of ``model`` inside the block in which none of
    ``modules`` called graph attention raises ``NotImplementedError``
    naming the model class: the hook would otherwise be a silent no-op.
    """
    table, entry, before = TABLES[kind], _Entry(value), []
    with _LOCK:
        for m in modules:
            table.setdefault(m, []).append(entry)

    def check(_module, _args, _output):
        if before and entry.calls == before.pop():
            raise NotImplementedError(
                f"{type(model).__name__} ran a forward pass without calling graph attention in any of its "
                f"{len(modules)} attention modules, so {kind}() would change nothing; it needs a model whose "
                "attention goes through transformers' AttentionInterface"
            )

    handles = [
        model.register_forward_pre_hook(lambda _m, _a: before.append(entry.calls)),
        model.register_forward_hook(check),
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        with _LOCK:
            for m in modules:
                stack = [e for e in table.get(m, ()) if e is not entry]
                if stack:
                    table[m] = stack
                else:
                    table.pop(m, None)


def _state(module: nn.Module) -> tuple[int | None, object, list, list]:
    """``(layer, innermost spec or None, observers, open recording lists)`` of ``module``; counts the call."""
    with _LOCK:
        sparsity, recorders = list(_SPARSITY.get(module, ())), list(_RECORDERS.get(module, ()))
        for entry in sparsity + recorders:
            entry.calls += 1
        observers = [e.value[1] for e in sparsity if e.value[1] is not None]
        spec = sparsity[-1].value[0] if sparsity else None
        return _LAYERS.get(module), spec, observers, [e.value for e in recorders]


def graph_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[Tensor, Tensor | None]:
    """The ``"graphattn"`` attention function, with the signature transformers calls.

    Parameters
    ----------
    module : nn.Module
        The calling attention layer (``training``, ``is_causal``, ``config``).
    query : Tensor, shape (B, H, L, D)
    key : Tensor, shape (B, H_kv, S, D)
        ``H_kv`` divides H (grouped-query attention repeats each key head).
    value : Tensor, shape (B, H_kv, S, D_v)
    attention_mask : Tensor, shape (B, 1 or H, L, S), or None
        Bool (True = may attend) or additive float (``finfo.min``/-inf blocks).
    scaling : float, optional
        Default ``D ** -0.5``.
    dropout : float, default 0.0
        On the attention weights, while ``module.training``.

    Returns
    -------
    attn_output : Tensor, shape (B, L, H, D_v)
        Exact 0 rows for queries without edges (padding).
    attn_weights : Tensor, shape (B, H, L, S), or None
        Dense weights only when ``output_attentions`` is requested; under
        dropout, the weights as used (after dropout).

    Raises
    ------
    NotImplementedError
        For ``softcap``, ``position_bias`` or ``s_aux``.
    """
    for name in ("softcap", "position_bias", "s_aux"):
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"The 'graphattn' attention does not support {name!r} yet")
    num_b, heads, num_q, dim = query.shape
    num_k = key.size(2)
    if key.size(1) != heads:  # grouped-query attention
        key = key.repeat_interleave(heads // key.size(1), dim=1)  # (B, H, S, D)
        value = value.repeat_interleave(heads // value.size(1), dim=1)  # (B, H, S, D_v)
    is_causal = kwargs.get("is_causal")
    is_causal = getattr(module, "is_causal", False) if is_causal is None else is_causal
    graph = base_graph(
        attention_mask,
        num_b,
        num_q,
        num_k,
        bool(is_causal) and num_q > 1,
        query.device,
        self_attention=not _is_cross(module),
    )
    layer, spec, observers, recorders = _state(module)
    if spec is not None:
        graph = sparse_graph(graph, spec, layer, query, key)
    q = query.transpose(1, 2).reshape(num_b * num_q, heads, dim)  # (B*L, H, D)
    k = key.transpose(1, 2).reshape(num_b * num_k, heads, dim)  # (B*S, H, D)
    v = value.transpose(1, 2).reshape(num_b * num_k, heads, value.size(-1))  # (B*S, H, D_v)
    edge_bias = None if graph.edge_bias is None else graph.edge_bias.to(q.dtype)  # (E, Hm)
    wanted = _weights_requested(module, kwargs)
    need = wanted or bool(recorders) or bool(observers)  # weights only for someone who reads them
    out, alpha = ops.attention(
        q,
        k,
        v,
        graph.edge_index,
        scale=scaling,
        edge_bias=edge_bias,
        dropout=dropout,
        training=module.training,
        need_weights=need,
    )  # (B*L, H, D_v), (E, H) or None
    for calls in recorders:
        calls.append((layer, graph, alpha.detach()))
    out = out.view(num_b, num_q, heads, -1)  # (B, L, H, D_v)
    for observe in observers:
        observe(layer, query, key, value, graph, out, alpha)
    weights = graph.dense(alpha) if wanted else None  # (B, H, L, S)
    return out, weights


def _weights_requested(module: nn.Module, kwargs: dict) -> bool:
    """Whether the caller collects attention weights (``output_attentions``; some layers swallow the kwarg)."""
    if kwargs.get("output_attentions") or getattr(getattr(module, "config", None), "output_attentions", False):
        return True
    collected = _compat.hf_collected_outputs()  # transformers 5 collects them with hooks
    return bool(collected) and any(k.endswith("attentions") for k in collected)
