"""A drop-in global attention for ``torch_geometric.nn.GPSConv``: ``nn.MultiheadAttention`` on graphattn's ragged kernel.

``GPSConv`` pads the nodes of each graph (``to_dense_batch``) and calls its
``nn.MultiheadAttention`` as ``attn(h, h, h, key_padding_mask=~mask,
need_weights=False)``. :class:`GPSAttention` is an ``nn.MultiheadAttention``
(same parameters, same ``state_dict``) that answers exactly that call by
dropping the padding, projecting the real nodes only, and attending within each
graph with :func:`graphattn.ops.batched_attention` (per-size buckets of
dense SDPA: no query reads a padding key, no FLOP goes to padding). Every other
call (weights requested, an ``attn_mask``, cross-attention) is
``nn.MultiheadAttention``'s own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from graphattn import patterns
from graphattn.ops import batched_attention
from graphattn.validate import message

__all__ = ["GPSAttention", "use_graphattn"]


class GPSAttention(nn.MultiheadAttention):
    """``nn.MultiheadAttention`` whose padded self-attention runs per graph on the ragged kernel.

    Parameters
    ----------
    embed_dim, num_heads, dropout, bias, batch_first, ...
        As :class:`torch.nn.MultiheadAttention` (``add_bias_kv``, ``add_zero_attn``
        and ``kdim``/``vdim`` other than ``embed_dim`` take MHA's own path).

    Notes
    -----
    On the fast path the output at padding positions is exactly 0 (MHA leaves
    values there that ``GPSConv`` discards). Dropout draws its mask inside SDPA
    (same distribution as MHA, not the same bits).

    Examples
    --------
    >>> import torch
    >>> from torch_geometric.nn import GPSConv
    >>> gps = use_graphattn(GPSConv(16, None, heads=4))
    >>> type(gps.attn).__name__
    'GPSAttention'
    """

    @classmethod
    def from_multihead_attention(cls, mha: nn.MultiheadAttention) -> GPSAttention:
        """The same module (weights, dtype, device, mode) as a :class:`GPSAttention`."""
        if not isinstance(mha, nn.MultiheadAttention):
            raise TypeError(message("mha", "an nn.MultiheadAttention", type(mha).__name__))
        weight = mha.out_proj.weight
        new = cls(mha.embed_dim, mha.num_heads, dropout=mha.dropout, bias=mha.in_proj_bias is not None,
                  add_bias_kv=mha.bias_k is not None, add_zero_attn=mha.add_zero_attn, kdim=mha.kdim,
                  vdim=mha.vdim, batch_first=mha.batch_first, device=weight.device, dtype=weight.dtype)
        new.load_state_dict(mha.state_dict())
        return new.train(mha.training)

    def _ragged_ok(self, query, key, value, key_padding_mask, need_weights, attn_mask, is_causal) -> bool:
        return (query is key and key is value and key_padding_mask is not None and not need_weights
                and attn_mask is None and not is_causal and self._qkv_same_embed_dim and self.bias_k is None
                and not self.add_zero_attn and query.dim() == 3 and key_padding_mask.dtype == torch.bool)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor | None = None,
                need_weights: bool = True, attn_mask: Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False):
        """``nn.MultiheadAttention.forward``; self-attention with a boolean key padding mask runs per graph."""
        if not self._ragged_ok(query, key, value, key_padding_mask, need_weights, attn_mask, is_causal):
            return super().forward(query, key, value, key_padding_mask=key_padding_mask, need_weights=need_weights,
                                   attn_mask=attn_mask, average_attn_weights=average_attn_weights,
                                   is_causal=is_causal)
        padded = query if self.batch_first else query.transpose(0, 1)  # (B, T, F)
        valid = ~key_padding_mask  # (B, T), True at real nodes
        nodes = padded[valid]  # (N, F), graph after graph
        counts = valid.sum(1)  # (B,)
        batch = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts)  # (N,)
        H, D = self.num_heads, self.head_dim
        qkv = F.linear(nodes, self.in_proj_weight, self.in_proj_bias)  # (N, 3 F)
        q, k, v = qkv.view(-1, 3, H, D).unbind(1)  # (N, H, D) each
        out, _ = batched_attention(q, k, v, patterns.full(), batch, dropout=self.dropout,
                                   training=self.training)  # (N, H, D)
        out = self.out_proj(out.reshape(-1, H * D))  # (N, F)
        result = out.new_zeros(padded.shape).masked_scatter(valid.unsqueeze(-1), out)  # (B, T, F)
        return (result if self.batch_first else result.transpose(0, 1)), None


def use_graphattn(module: nn.Module) -> nn.Module:
    """Replace, in place, the ``nn.MultiheadAttention`` of every ``GPSConv`` in ``module`` by a :class:`GPSAttention`.

    Returns ``module`` (weights unchanged, so outputs are those of the original model).
    """
    from torch_geometric.nn import GPSConv

    for sub in module.modules():
        if isinstance(sub, GPSConv) and type(sub.attn) is nn.MultiheadAttention:
            sub.attn = GPSAttention.from_multihead_attention(sub.attn)
    return module
