"""Every touch of a private torch, PyTorch Geometric or transformers API, in one place.

graphattn uses a public API wherever one serves (docs/style.md). Where none does, the private
name is read here and nowhere else, with the version it was checked on, so that an upgrade
that renames it breaks one function whose docstring says what to look for. The versions:

========================  ==========  ===============================================================
library                   checked on  private names used
========================  ==========  ===============================================================
torch                     2.13        ``torch._softmax``, ``torch._softmax_backward_data``,
                                      ``nn.Module._forward_hooks`` / ``_forward_pre_hooks``,
                                      ``torch._C._functorch.peek_interpreter_stack``
torch_geometric           2.8         ``MessagePassing._explain``, the ``_*_forward_hooks`` dicts,
                                      ``MessagePassing._orig_propagate``
transformers              5.24        ``transformers.utils.output_capturing._active_collector``,
                                      ``PretrainedConfig._attn_implementation``
========================  ==========  ===============================================================

Nothing here imports PyTorch Geometric or transformers at module level.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = [
    "CHECKED_ON",
    "softmax_into",
    "softmax_backward",
    "pyg_needs_propagate",
    "compiler_disable",
    "functorch_active",
    "keep_pyg_explain_path",
    "hf_collected_outputs",
    "hf_attn_implementation",
]

CHECKED_ON = {"torch": "2.13", "torch_geometric": "2.8", "transformers": "5.24"}

# PyG's per-step hook dicts on a MessagePassing (private attributes; checked on torch_geometric 2.8).
PYG_HOOKS = (
    "_propagate_forward_pre_hooks",
    "_propagate_forward_hooks",
    "_message_forward_pre_hooks",
    "_message_forward_hooks",
    "_aggregate_forward_pre_hooks",
    "_aggregate_forward_hooks",
    "_message_and_aggregate_forward_pre_hooks",
    "_message_and_aggregate_forward_hooks",
    "_edge_update_forward_pre_hooks",
    "_edge_update_forward_hooks",
)


def softmax_into(score: Tensor, out: Tensor) -> Tensor:
    """Softmax over the last axis of ``score`` written into ``out`` (same shape and dtype).

    ``torch._softmax``: the public ``torch.softmax`` has no ``out=`` (checked on torch 2.13).
    """
    return torch._softmax(score, -1, False, out=out)


def softmax_backward(grad: Tensor, alpha: Tensor) -> Tensor:
    """``alpha * (grad - sum(alpha * grad))`` over the last axis, fused.

    ``torch._softmax_backward_data``: no public fused softmax backward (checked on torch 2.13).
    """
    return torch._softmax_backward_data(grad, alpha, -1, alpha.dtype)


def pyg_needs_propagate(module: nn.Module) -> bool:
    """Whether a PyG ``MessagePassing`` is in explain mode or has a message-passing hook registered.

    ``MessagePassing._explain`` and the ``_*_forward_hooks`` dicts (``PYG_HOOKS``): PyG exposes the
    setter ``explain`` and the ``register_*_hook`` methods but no query (checked on torch_geometric 2.8).
    """
    return bool(getattr(module, "_explain", False)) or any(len(getattr(module, name, ())) for name in PYG_HOOKS)


def keep_pyg_explain_path(cls: type) -> None:
    """Point ``cls._orig_propagate`` back at ``MessagePassing.propagate``.

    PyG's explain mode swaps in ``_orig_propagate`` (the ``propagate`` that applies edge masks); for
    a subclass of a PyG conv, PyG records the parent's generated ``propagate`` there. A private PyG
    class attribute (checked on torch_geometric 2.8).
    """
    from torch_geometric.nn import MessagePassing

    cls._orig_propagate = MessagePassing.propagate  # type: ignore[attr-defined]


def hf_collected_outputs() -> set[str] | None:
    """The names of the outputs transformers is collecting with hooks right now, or None.

    transformers 5 records ``output_attentions`` with hooks; ``output_capturing._active_collector``
    says what is being recorded (a private context variable; checked on transformers 5.24).
    """
    try:
        from transformers.utils.output_capturing import _active_collector

        collected = _active_collector.get()
    except (ImportError, LookupError):
        return None
    return set(collected) if collected else set()


def hf_attn_implementation(model) -> str | None:
    """The attention implementation a transformers model runs now.

    ``config._attn_implementation``: the setter ``set_attn_implementation`` is public, the getter is
    not (checked on transformers 5.24).
    """
    return model.config._attn_implementation


def functorch_active() -> bool:
    """Whether a ``torch.func`` transform (``grad``, ``vmap``, ``jacrev``, ``vjp``, ...) is running now.

    Custom operators with ``register_autograd`` fail under these transforms (pytorch/pytorch#168393:
    the generated ``autograd.Function`` has no ``setup_context``), so graphattn takes its plain-PyTorch
    paths there. ``torch._C._functorch.peek_interpreter_stack``: torch has no public query (checked on
    torch 2.13; on a torch without it, False). False while ``torch.compile`` traces: dynamo's own tracing
    would read as a transform, and compiled models keep the operators.
    """
    if torch.compiler.is_compiling():
        return False
    peek = getattr(getattr(torch._C, "_functorch", None), "peek_interpreter_stack", None)
    return peek is not None and peek() is not None


def compiler_disable(reason: str):
    """``torch.compiler.disable`` with a ``reason`` dynamo prints at the graph break.

    ``reason=`` is newer than torch 2.4 (the floor): older releases get the decorator without it
    (checked on torch 2.13).
    """
    import inspect

    if "reason" in inspect.signature(torch.compiler.disable).parameters:
        return torch.compiler.disable(reason=reason)
    return torch.compiler.disable


def has_hooks(module: nn.Module) -> bool:
    """Whether a hook would see ``module``'s call: its own forward/backward hooks, or global module hooks."""
    from torch.nn.modules import module as nn_module

    own = (module._forward_hooks, module._forward_pre_hooks, module._backward_hooks, module._backward_pre_hooks)
    shared = (
        nn_module._global_forward_hooks,
        nn_module._global_forward_pre_hooks,
        nn_module._global_backward_hooks,
        nn_module._global_backward_pre_hooks,
    )
    return any(len(hooks) > 0 for hooks in own + shared)
