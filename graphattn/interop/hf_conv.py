"""A layer from a Hugging Face attention module: :func:`attention_conv_from_hf`.

This is the way to get an :class:`~graphattn.AttentionConv` carrying the
weights of a transformers attention module (the layer itself knows nothing of
Hugging Face). Nothing of transformers is imported: the module is read by
its attributes.
"""

from __future__ import annotations

import torch
from torch import nn

from graphattn.conv import AttentionConv
from graphattn.validate import message

__all__ = ["attention_conv_from_hf"]


def attention_conv_from_hf(module: nn.Module):
    """An :class:`~graphattn.AttentionConv` carrying the weights of a Hugging Face attention module.

    ``BertSelfAttention`` (``query``/``key``/``value`` linear layers, no output
    projection: that is ``BertSelfOutput.dense``, followed by the residual and
    LayerNorm) gives a layer with ``output_projection=False``; ``GPT2Attention``
    (``c_attn`` packing Q, K, V and ``c_proj``, both ``Conv1D``, ``y = x W + b``)
    gives one with ``lin_out = c_proj``. On ``x (N, F)`` of one sequence,
    ``conv(x, patterns.full().edge_index(N))`` (BERT) or
    ``conv(x, patterns.causal().edge_index(N))`` (GPT-2) equals the module's
    attention output for ``x[None]``.

    Raises
    ------
    TypeError
        For a module of another layout.
    NotImplementedError
        For a scaling other than ``1 / sqrt(D)`` or a cross-attention module.
    """
    if all(isinstance(getattr(module, n, None), nn.Linear) for n in ("query", "key", "value")):
        heads = module.num_attention_heads
        weights = [(getattr(module, n).weight, getattr(module, n).bias) for n in ("query", "key", "value")]
        out_proj, dropout = None, module.dropout.p
    elif hasattr(module, "c_attn") and hasattr(module, "c_proj"):
        if getattr(module, "is_cross_attention", False):
            raise NotImplementedError(message("module", "a GPT-2 self-attention module", "cross-attention"))
        heads = module.num_heads
        w, b = module.c_attn.weight.t(), module.c_attn.bias  # (3F, F), (3F,)
        weights = list(zip(w.chunk(3), b.chunk(3)))
        out_proj, dropout = (module.c_proj.weight.t(), module.c_proj.bias), module.attn_dropout.p
    else:
        raise TypeError(
            message(
                "module",
                "a BertSelfAttention-like module (query/key/value nn.Linear) or a GPT2Attention (c_attn/c_proj)",
                type(module).__name__,
            )
        )
    in_channels, out_channels = weights[0][0].size(1), weights[0][0].size(0)
    dim = out_channels // heads
    scaling = getattr(module, "scaling", dim**-0.5)
    if abs(scaling - dim**-0.5) > 1e-12 * dim**-0.5:
        raise NotImplementedError(message("module.scaling", f"1/sqrt(D) = {dim**-0.5}", scaling))
    ref = weights[0][0]
    conv = AttentionConv(
        in_channels,
        out_channels,
        heads=heads,
        dropout=dropout,
        bias=weights[0][1] is not None,
        output_projection=out_proj is not None,
    ).to(device=ref.device, dtype=ref.dtype)
    with torch.no_grad():
        lins = [conv.lin_query, conv.lin_key, conv.lin_value] + ([conv.lin_out] if out_proj is not None else [])
        for lin, (w, b) in zip(lins, weights + ([out_proj] if out_proj is not None else [])):
            lin.weight.copy_(w)
            if b is not None:
                lin.bias.copy_(b)
    return conv.train(module.training)
