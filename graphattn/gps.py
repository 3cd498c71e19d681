"""GraphGPS with graphattn's global attention: a ``GPSConv`` that never pads, and a padded-layout drop-in attention.

PyG's ``GPSConv`` pads the nodes of each graph (``to_dense_batch``), calls its
``nn.MultiheadAttention`` as ``attn(h, h, h, key_padding_mask=~mask,
need_weights=False)`` and unpads (``h[mask]``): the input and output
projections run on every padding row too. Two exact replacements:

- :class:`GPSConv` (what :func:`use_graphattn` installs): PyG's ``GPSConv``
  (subclassed: same constructor, parameters, ``state_dict``, ``repr``) whose
  global attention runs on the node layout: the projections on the N real
  nodes only, attention within each graph on the ragged operator
  (:func:`graphattn.ops.batched_attention` with ``patterns.full()`` and
  ``batch``; no padded copy of the features, no unpadding).
- :class:`GPSAttention`: an ``nn.MultiheadAttention`` (same parameters) that
  answers GPSConv's padded call with one SDPA call under the key padding mask,
  straight on the padded layout (for code that calls the attention itself).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import GPSConv as _PyGGPSConv

from graphattn import patterns
from graphattn.ops import batched_attention
from graphattn.validate import message

__all__ = ["GPSConv", "GPSAttention", "use_graphattn"]


def _plain_self_attention(attn) -> bool:
    """``attn`` is an ``nn.MultiheadAttention`` whose self-attention is in_proj -> SDPA -> out_proj."""
    return (
        isinstance(attn, nn.MultiheadAttention)
        and attn._qkv_same_embed_dim
        and attn.bias_k is None
        and not attn.add_zero_attn
    )


class GPSConv(_PyGGPSConv):
    r"""PyG's ``GPSConv`` (Rampasek et al. 2022) whose global attention never pads.

    The update is PyG's, term for term:

    .. math::
        h_L = \mathrm{norm}_1(\mathrm{MPNN}(x) + x), \quad
        h_G = \mathrm{norm}_2(\mathrm{MHA}_{\text{per graph}}(x) + x), \quad
        y = \mathrm{norm}_3(h + \mathrm{MLP}(h)),\ h = h_L + h_G

    where :math:`\mathrm{MHA}_{\text{per graph}}` lets node i (query) read every
    node j (key) of its own graph. Here it is computed on the node layout:
    ``in_proj`` on the N nodes (N, 3 F), :func:`graphattn.ops.batched_attention`
    with ``patterns.full()`` and ``batch`` (the ragged operator), ``out_proj``
    on the N nodes. PyG pads to ``(B, T, F)`` first and runs both projections
    on ``B * T`` rows.

    Parameters
    ----------
    channels, conv, heads, dropout, act, act_kwargs, norm, norm_kwargs, attn_type, attn_kwargs
        As ``torch_geometric.nn.GPSConv`` (defaults ``heads=1``, ``dropout=0.0``,
        ``act="relu"``, ``norm="batch_norm"``, ``attn_type="multihead"``).

    Notes
    -----
    Exact against PyG's ``GPSConv`` with the same weights (outputs and every
    gradient, float64 to 1e-10) with dropout off. The attention dropout
    (``attn_kwargs={"dropout": p}``) draws its mask inside the operator: the
    same distribution as ``nn.MultiheadAttention``, not the same bits.
    ``attn_type="performer"`` and an ``nn.MultiheadAttention`` with
    ``add_bias_kv``, ``add_zero_attn`` or ``kdim``/``vdim`` run PyG's own forward.
    ``batch`` must be sorted (as PyG batches are; ``to_dense_batch`` assumes
    it too); ``None`` means one graph.

    Examples
    --------
    >>> import torch
    >>> from torch_geometric.nn import GINConv
    >>> mlp = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))
    >>> conv = GPSConv(8, GINConv(mlp), heads=2)
    >>> x, edge_index, batch = torch.randn(5, 8), torch.tensor([[0, 1, 3], [1, 2, 4]]), torch.tensor([0, 0, 0, 1, 1])
    >>> conv(x, edge_index, batch).shape
    torch.Size([5, 8])
    """

    @classmethod
    def from_gps_conv(cls, conv: _PyGGPSConv) -> GPSConv:
        """A :class:`GPSConv` holding ``conv``'s own submodules (the same parameter objects: optimizers still hold them)."""
        if not isinstance(conv, _PyGGPSConv):
            raise TypeError(message("conv", "a torch_geometric.nn.GPSConv", type(conv).__name__))
        new = cls(conv.channels, conv.conv, heads=conv.heads, dropout=conv.dropout, norm=None)
        new.attn_type, new.attn, new.mlp = conv.attn_type, conv.attn, conv.mlp
        new.norm1, new.norm2, new.norm3, new.norm_with_batch = conv.norm1, conv.norm2, conv.norm3, conv.norm_with_batch
        return new.train(conv.training)

    def _norm(self, norm, h: Tensor, batch: Tensor | None) -> Tensor:
        if norm is None:
            return h
        return norm(h, batch=batch) if self.norm_with_batch else norm(h)

    def global_attention(self, x: Tensor, batch: Tensor | None) -> Tensor:
        """``attn`` within each graph, on the node layout: ``(N, F) -> (N, F)``, PyG's ``h[mask]`` before dropout."""
        attn = self.attn
        H, D = attn.num_heads, attn.head_dim
        if batch is None:
            batch = torch.zeros(x.size(0), dtype=torch.long, device=x.device)  # (N,): one graph, as to_dense_batch
        qkv = F.linear(x, attn.in_proj_weight, attn.in_proj_bias)  # (N, 3 F)
        q, k, v = qkv.view(-1, 3, H, D).unbind(1)  # (N, H, D) each
        out, _ = batched_attention(
            q, k, v, patterns.full(), batch, dropout=attn.dropout, training=attn.training
        )  # (N, H, D)
        return attn.out_proj(out.reshape(-1, H * D))  # (N, F)

    def forward(self, x: Tensor, edge_index, batch: Tensor | None = None, **kwargs) -> Tensor:
        """PyG's ``GPSConv.forward``, with the global attention on the node layout."""
        if not _plain_self_attention(self.attn):
            return super().forward(x, edge_index, batch, **kwargs)
        hs = []
        if self.conv is not None:  # 1) local message passing, residual, norm (PyG's order)
            h = self.conv(x, edge_index, **kwargs)  # (N, F)
            h = F.dropout(h, p=self.dropout, training=self.training)
            hs.append(self._norm(self.norm1, h + x, batch))
        h = self.global_attention(x, batch)  # 2) global attention within each graph, (N, F)
        h = F.dropout(h, p=self.dropout, training=self.training)
        hs.append(self._norm(self.norm2, h + x, batch))
        out = sum(hs)  # 3) combine, MLP with residual, norm
        out = out + self.mlp(out)
        return self._norm(self.norm3, out, batch)


class GPSAttention(nn.MultiheadAttention):
    """``nn.MultiheadAttention`` whose padded self-attention is one SDPA call under the key padding mask.

    Parameters
    ----------
    embed_dim, num_heads, dropout, bias, batch_first, ...
        As :class:`torch.nn.MultiheadAttention`.

    Notes
    -----
    The fast path answers ``attn(h, h, h, key_padding_mask=pad, need_weights=False)``
    with a boolean ``pad`` (GPSConv's call): ``in_proj`` on the padded input,
    :func:`torch.nn.functional.scaled_dot_product_attention` with ``~pad`` as
    the key mask, ``out_proj``; no unpadding. Equal to
    ``nn.MultiheadAttention`` at every position, padding queries included,
    except a batch row with no real key, whose output is 0 (a query with no
    visible key; MHA gives NaN there). Dropout: same distribution as MHA, not
    the same bits. Every other call (weights requested, ``attn_mask``, a float
    mask, cross-attention, ``add_bias_kv``/``add_zero_attn``, unbatched input)
    is ``nn.MultiheadAttention``'s own. :class:`GPSConv` is faster still: it
    never pads.

    Raises
    ------
    ValueError
        A ``key_padding_mask`` whose shape is not ``(B, T)`` (as ``nn.MultiheadAttention``).

    Examples
    --------
    >>> import torch
    >>> attn = GPSAttention(8, 2, batch_first=True)
    >>> h, pad = torch.randn(3, 4, 8), torch.tensor([[False] * 4, [False, False, True, True], [False, True, True, True]])
    >>> attn(h, h, h, key_padding_mask=pad, need_weights=False)[0].shape
    torch.Size([3, 4, 8])
    """

    @classmethod
    def from_multihead_attention(cls, mha: nn.MultiheadAttention) -> GPSAttention:
        """The same module (weights, dtype, device, mode) as a :class:`GPSAttention`."""
        if not isinstance(mha, nn.MultiheadAttention):
            raise TypeError(message("mha", "an nn.MultiheadAttention", type(mha).__name__))
        weight = mha.out_proj.weight
        new = cls(
            mha.embed_dim,
            mha.num_heads,
            dropout=mha.dropout,
            bias=mha.in_proj_bias is not None,
            add_bias_kv=mha.bias_k is not None,
            add_zero_attn=mha.add_zero_attn,
            kdim=mha.kdim,
            vdim=mha.vdim,
            batch_first=mha.batch_first,
            device=weight.device,
            dtype=weight.dtype,
        )
        new.load_state_dict(mha.state_dict())
        return new.train(mha.training)

    def _fast_ok(self, query, key, value, key_padding_mask, need_weights, attn_mask, is_causal) -> bool:
        return (
            query is key
            and key is value
            and key_padding_mask is not None
            and not need_weights
            and attn_mask is None
            and not is_causal
            and _plain_self_attention(self)
            and query.dim() == 3
            and key_padding_mask.dtype == torch.bool
        )

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ):
        """``nn.MultiheadAttention.forward``; self-attention with a boolean key padding mask is one SDPA call."""
        if not self._fast_ok(query, key, value, key_padding_mask, need_weights, attn_mask, is_causal):
            return super().forward(
                query,
                key,
                value,
                key_padding_mask=key_padding_mask,
                need_weights=need_weights,
                attn_mask=attn_mask,
                average_attn_weights=average_attn_weights,
                is_causal=is_causal,
            )
        padded = query if self.batch_first else query.transpose(0, 1)  # (B, T, F)
        B, T, _ = padded.shape
        if tuple(key_padding_mask.shape) != (B, T):
            raise ValueError(
                message(
                    "key_padding_mask",
                    f"to have shape (B, T) = ({B}, {T}) (batch, source length)",
                    f"shape {tuple(key_padding_mask.shape)}",
                )
            )
        H, D = self.num_heads, self.head_dim
        qkv = F.linear(padded, self.in_proj_weight, self.in_proj_bias)  # (B, T, 3 F)
        q, k, v = qkv.view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)  # (B, H, T, D) each
        visible = ~key_padding_mask[:, None, None, :]  # (B, 1, 1, T): True = may attend
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=visible, dropout_p=self.dropout if self.training else 0.0
        )  # (B, H, T, D)
        out = self.out_proj(out.transpose(1, 2).reshape(B, T, H * D))  # (B, T, F)
        return (out if self.batch_first else out.transpose(0, 1)), None


def use_graphattn(module: nn.Module) -> nn.Module:
    """Replace every PyG ``GPSConv`` in ``module`` by a :class:`GPSConv` holding the same submodules.

    The parameters stay the same objects (an optimizer built before keeps
    working) and the outputs are the original model's. Returns ``module``, or
    its replacement when ``module`` is itself a ``GPSConv``.
    """
    if type(module) is _PyGGPSConv:
        return GPSConv.from_gps_conv(module)
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is _PyGGPSConv:
                setattr(parent, name, GPSConv.from_gps_conv(child))
    return module
