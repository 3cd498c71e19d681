"""AttentionConv as a drop-in for nn.MultiheadAttention inside an existing model.

    python examples/mha_drop_in.py                 # exact swap: same outputs
    python examples/mha_drop_in.py --window 2      # then make the attention sparse

``TinyEncoder`` is ordinary PyTorch code that calls
``self.attn(x, x, x, key_padding_mask=pad, need_weights=False)`` on a padded
batch. :class:`GraphSelfAttention` has the same call signature; it copies the
``nn.MultiheadAttention`` weights into an :class:`graphattn.AttentionConv`
and runs it on one disjoint graph holding the whole batch: padding tokens are
absent nodes (no masking needed), and each sequence is a complete graph, or any
:mod:`graphattn.patterns` pattern. Swapping the module changes nothing else in
the model; the script checks that the outputs on real tokens agree with the
original model to float32 noise, then shows a sliding-window variant.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

import graphattn as ga
from graphattn.graphs import batch_sequences, nodes_to_padded, padded_to_nodes


class TinyEncoder(nn.Module):
    """An existing model: one pre-norm Transformer block around nn.MultiheadAttention."""

    def __init__(self, dim: int = 32, heads: int = 4):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x, pad):  # x (B, T, F); pad (B, T) True = padding (MHA's polarity)
        h = self.norm1(x)
        x = x + self.attn(h, h, h, key_padding_mask=pad, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class GraphSelfAttention(nn.Module):
    """``nn.MultiheadAttention``'s self-attention call, computed as graph attention.

    Parameters
    ----------
    mha : nn.MultiheadAttention
        ``batch_first=True``; its weights are copied.
    pattern : graphattn.patterns.Pattern, optional
        Edges inside each sequence (default: complete graph = dense attention).
    """

    def __init__(self, mha: nn.MultiheadAttention, pattern=None):
        super().__init__()
        if not mha.batch_first:
            raise NotImplementedError("Expected 'mha' with batch_first=True (got batch_first=False)")
        self.conv = ga.AttentionConv.from_multihead_attention(mha)
        self.pattern = pattern

    def forward(self, query, key, value, key_padding_mask=None, need_weights=False, attn_mask=None):
        if not (query is key is value) or attn_mask is not None or need_weights:
            raise NotImplementedError(
                "Expected self-attention (query is key is value) without attn_mask or need_weights"
            )
        num_b, num_t, _ = query.shape
        pad = torch.zeros(num_b, num_t, dtype=torch.bool) if key_padding_mask is None else key_padding_mask
        lengths = (~pad).sum(dim=1)  # (B,); right padding assumed
        if not torch.equal(pad, torch.arange(num_t) >= lengths[:, None]):
            raise ValueError("Expected right padding: 'key_padding_mask' True only after the real tokens")
        nodes, batch = padded_to_nodes(query, lengths.tolist())  # (N, F), (N,)
        edge_index, _ = batch_sequences(lengths.tolist(), self.pattern)  # (2, E), one graph per sequence
        out = self.conv(nodes, edge_index)  # (N, F)
        padded, _ = nodes_to_padded(out, batch, max_length=num_t)  # (B, T, F), zeros at padding
        return padded, None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4, help="sequences in the batch (default 4)")
    parser.add_argument("--max-len", type=int, default=12, help="longest sequence (default 12)")
    parser.add_argument("--window", type=int, default=None, help="also run a window(w, w) variant")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.batch < 1 or args.max_len < 1:
        print(f"Expected --batch and --max-len >= 1 (got {args.batch}, {args.max_len})", file=sys.stderr)
        return 2

    torch.manual_seed(args.seed)
    model = TinyEncoder().eval()
    lengths = torch.randint(1, args.max_len + 1, (args.batch,))
    lengths[0] = args.max_len
    pad = torch.arange(args.max_len) >= lengths[:, None]  # (B, T) True = padding
    x = torch.randn(args.batch, args.max_len, 32)
    with torch.no_grad():
        reference = model(x, pad)
        model.attn = GraphSelfAttention(model.attn)  # the swap: one line
        swapped = model(x, pad)
    real = ~pad
    err = (swapped[real] - reference[real]).abs().max().item()
    print(f"lengths {lengths.tolist()}; max |graph - nn.MultiheadAttention| on real tokens: {err:.2e}")
    if err > 1e-5:
        print("mismatch: expected agreement to float32 noise (1e-5)", file=sys.stderr)
        return 1
    if args.window is not None:
        model.attn.pattern = ga.patterns.window(args.window, args.window)
        with torch.no_grad():
            sparse = model(x, pad)
        change = (sparse[real] - reference[real]).norm() / reference[real].norm()
        edges = batch_sequences(lengths.tolist(), model.attn.pattern)[0].size(1)
        dense_edges = int((lengths**2).sum())
        print(
            f"window({args.window}, {args.window}): {edges} of {dense_edges} edges, "
            f"relative change of the output {change:.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
