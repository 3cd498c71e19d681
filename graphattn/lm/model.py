"""A GPT-style byte-level causal language model whose attention graph is a pattern.

Embedding of the 256 byte values plus learned positions, ``layers`` pre-norm
blocks (``x + attn(ln(x))``, then ``x + mlp(ln(x))``), a final LayerNorm and a
head tied to the embedding (GPT-2 and nanoGPT [1]_). The only difference
between runs is the graph each query reads:

- ``"dense"``: PyTorch's ``F.scaled_dot_product_attention(is_causal=True)``,
  the strongest dense baseline (its fused causal kernel);
- any pattern spec (``causal``, ``window:128``, ``strided:64``,
  ``window:128|global:first4``, ``bigbird:...``, ``random:...``,
  :func:`graphattn.patterns.from_spec`), intersected with the causal DAG
  (``& patterns.causal()``), run by :func:`graphattn.attention` on that
  pattern. ``causal`` is graphattn's own causal graph: the same edges as
  ``dense``, which :func:`graphattn.attention` dispatches to the same SDPA
  kernel (so the two must agree, and cost the same).

There is no second attention implementation: the batch is folded into the
heads (the graph is the same for every sequence), so one call of
:func:`graphattn.attention` serves the whole batch.

References
----------
.. [1] Karpathy, nanoGPT (model.py), 2023; Radford et al., "Language Models are
   Unsupervised Multitask Learners", 2019.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import graphattn
from graphattn import patterns
from graphattn.validate import message

__all__ = ["DENSE", "LMConfig", "attention_graph", "CausalSelfAttention", "Block", "ByteLM"]

DENSE = "dense"  # SDPA's causal kernel


@dataclass(frozen=True)
class LMConfig:
    """Sizes of the model; ``pattern`` is ``"dense"`` or a pattern spec (module docstring)."""

    length: int = 2048
    layers: int = 4
    d_model: int = 256
    heads: int = 4
    d_ff: int = 1024
    vocab: int = 256
    pattern: str = DENSE

    def __post_init__(self):
        if self.d_model % self.heads:
            raise ValueError(message("d_model", "a multiple of 'heads'", f"d_model={self.d_model}, heads={self.heads}"))
        for name in ("length", "layers", "d_model", "heads", "d_ff", "vocab"):
            if int(getattr(self, name)) < 1:
                raise ValueError(message(name, "at least 1", getattr(self, name)))

    def to_dict(self) -> dict:
        return asdict(self)


def attention_graph(spec: str):
    """The pattern of ``spec`` intersected with the causal DAG; None for ``"dense"``.

    ``pattern.edge_index(L)`` gives its edges (row 0 = key j, row 1 = query
    i, j <= i). ``causal`` keeps kind ``"causal"``, which
    :func:`graphattn.attention` runs on SDPA's fused kernel without building
    edges (graphattn's dispatch); every other spec runs on its edge list.

    Raises
    ------
    ValueError
        An unknown spec (the message of :func:`graphattn.patterns.from_spec`).
    """
    if spec == DENSE:
        return None
    return patterns.from_spec(spec) & patterns.causal()


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention on a fixed graph (or SDPA's causal kernel for ``"dense"``).

    Input and output ``(B, T, d_model)``. ``graph`` is a pattern (shared by
    the blocks, so graphattn builds its edges once per length) or None.
    """

    def __init__(self, config: LMConfig, graph=None):
        super().__init__()
        self.heads, self.graph = config.heads, graph
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        H = self.heads
        q, k, v = self.qkv(x).view(B, T, 3, H, C // H).unbind(2)  # 3 x (B, T, H, D)
        if self.graph is None:
            y = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            )  # (B, H, T, D)
            y = y.transpose(1, 2)  # (B, T, H, D)
        else:
            # the graph is the same for every sequence: the batch rides along as extra heads
            fold = [t.permute(1, 0, 2, 3).reshape(T, B * H, C // H) for t in (q, k, v)]  # 3 x (T, B*H, D)
            y, _ = graphattn.attention(*fold, self.graph)  # (T, B*H, D)
            y = y.view(T, B, H, C // H).permute(1, 0, 2, 3)  # (B, T, H, D)
        return self.proj(y.reshape(B, T, C))  # (B, T, C)


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))`` (GELU)."""

    def __init__(self, config: LMConfig, graph=None):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config, graph)
        self.ln_2 = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(config.d_model, config.d_ff), nn.GELU(), nn.Linear(config.d_ff, config.d_model)
        )

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))  # (B, T, C)
        return x + self.mlp(self.ln_2(x))  # (B, T, C)


class ByteLM(nn.Module):
    """The byte-level causal LM (module docstring).

    Parameters
    ----------
    config : LMConfig

    Examples
    --------
    >>> model = ByteLM(LMConfig(length=16, layers=1, d_model=8, heads=2, d_ff=16, pattern="window:4"))
    >>> model(torch.zeros(2, 16, dtype=torch.long)).shape
    torch.Size([2, 16, 256])
    """

    def __init__(self, config: LMConfig):
        super().__init__()
        self.config = config
        self.graph = attention_graph(config.pattern)  # a bad spec fails here, not in the first forward
        self.wte = nn.Embedding(config.vocab, config.d_model)
        self.wpe = nn.Embedding(config.length, config.d_model)
        self.blocks = nn.ModuleList(Block(config, self.graph) for _ in range(config.layers))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2's initialisation: normal(0, 0.02), residual projections scaled by 1 / sqrt(2 layers)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, 0.02)
            if isinstance(module, nn.Linear):
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.LayerNorm):
                module.reset_parameters()
        for block in self.blocks:  # the two projections that add into the residual stream
            for linear in (block.attn.proj, block.mlp[2]):
                nn.init.normal_(linear.weight, 0.0, 0.02 / math.sqrt(2 * self.config.layers))

    def forward(self, idx: Tensor) -> Tensor:
        """Next-byte logits ``(B, T, 256)`` for bytes ``idx`` ``(B, T)``, ``T <= config.length``."""
        T = idx.size(1)
        if T > self.config.length:
            raise ValueError(message("idx", f"at most {self.config.length} bytes per sequence", T))
        pos = torch.arange(T, device=idx.device)  # (T,)
        x = self.wte(idx) + self.wpe(pos)  # (B, T, C)
        for block in self.blocks:
            x = block(x)  # (B, T, C)
        return self.ln_f(x) @ self.wte.weight.t()  # (B, T, C) @ (C, V) -> (B, T, V), tied head

    def loss(self, idx: Tensor, targets: Tensor, reduction: str = "mean") -> Tensor:
        """Cross-entropy in nats; ``reduction="none"`` gives ``(B, T)``."""
        logits = self(idx)  # (B, T, V)
        out = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction=reduction)
        return out.view(targets.shape) if reduction == "none" else out

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
