"""Attention records: what every layer and head of a real model attended to, per sentence, as graphs.

:func:`attention_records` runs a Hugging Face model (``attn_implementation=
"graphattn"``) over texts and returns one :class:`AttentionRecord` per text:
its tokens and, for every layer, the edges the layer attended along and their
weights. This is the data structure the analysis, plotting and pruning code
consume.

Conventions (docs/design.md): node ids are token positions ``0 .. N-1`` of the
sentence (special tokens such as ``[CLS]``/``[SEP]`` included, padding never);
``edge_index[0]`` is the source = key j, ``edge_index[1]`` the target = query
i; ``alpha[e, h]`` is the weight with which query i reads key j in head h, and
for each query and head the weights of its incoming edges sum to 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from graphattn.graphs import edge_index_to_mask, edge_weights_to_dense
from graphattn.validate import check_bool, check_int, message

__all__ = ["AttentionRecord", "attention_records"]


@dataclass
class AttentionRecord:
    """The attention graphs of one input sequence, one per layer.

    Attributes
    ----------
    text : str
        The input text.
    tokens : list of str, length N
        The model's tokens, in order; node i is ``tokens[i]``.
    edge_index : list of Tensor, one per layer, each shape (2, E_l), int64
        Row 0 = source = key j, row 1 = target = query i, both in ``[0, N)``;
        sorted by i, then j. For a dense encoder every layer holds the same
        complete graph (N^2 edges, the same tensor); under a sparsity pattern
        layers may differ.
    alphas : list of Tensor, one per layer, each shape (E_l, H)
        Attention weights on the edges of ``edge_index[l]``: for each query i
        and head h they sum to 1 over the edges into i (0 on an edge a head
        does not keep, under a per-head sparsity mask). Detached, on the CPU.
        These are the weights as the model used them: recorded in ``train()``
        mode with attention dropout, they are taken after dropout (0 on a
        dropped edge, the others scaled by ``1 / (1 - p)``), and rows no
        longer sum to 1; call ``model.eval()`` first for the model's weights.
    hidden_states : list of Tensor, each shape (N, F), or None
        The embedding output and the output of every layer (``layers + 1``
        entries) when requested.

    Examples
    --------
    >>> rec = AttentionRecord("a b", ["a", "b"], [torch.tensor([[0, 0, 1], [0, 1, 1]])],
    ...                       [torch.tensor([[1.0], [0.25], [0.75]])])
    >>> rec.num_layers, rec.num_heads, len(rec)
    (1, 1, 2)
    >>> rec.dense()[0, 0]
    tensor([[1.0000, 0.0000],
            [0.2500, 0.7500]])
    """

    text: str
    tokens: list[str]
    edge_index: list[Tensor]
    alphas: list[Tensor]
    hidden_states: list[Tensor] | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def num_layers(self) -> int:
        return len(self.alphas)

    @property
    def num_heads(self) -> int:
        return self.alphas[0].size(1) if self.alphas else 0

    def layer(self, layer: int) -> tuple[Tensor, Tensor]:
        """``(edge_index (2, E), alpha (E, H))`` of one layer (negative indices count from the end)."""
        return self.edge_index[layer], self.alphas[layer]

    def dense(self, layer: int | None = None) -> Tensor:
        """Dense weights, queries on rows: ``(layers, H, N, N)``, or ``(H, N, N)`` for one ``layer``.

        Zero where there is no edge. Memory grows as N^2: meant for short inputs.
        """
        layers = range(self.num_layers) if layer is None else [layer]
        out = [
            edge_weights_to_dense(self.edge_index[idx], self.alphas[idx], len(self.tokens))  # (H, N, N)
            for idx in layers
        ]
        return torch.stack(out) if layer is None else out[0]  # (layers, H, N, N) or (H, N, N)

    def mask(self, layer: int = 0) -> Tensor:
        """The edge set of ``layer`` as a bool ``(N, N)`` mask, True = may attend."""
        return edge_index_to_mask(self.edge_index[layer], len(self.tokens))

    def find(self, word: str) -> list[int]:
        """Positions of the tokens equal to ``word`` (case-insensitive; ``##`` word-piece marks ignored)."""
        word = word.lower()
        return [i for i, t in enumerate(self.tokens) if t.lower().removeprefix("##") == word]


def _split(calls: list, valid: Tensor) -> list[list[tuple[Tensor, Tensor]]]:
    """Per sequence, per layer ``(edge_index, alpha)`` in local token ids, from recorded batch graphs.

    Only edges between real tokens (``valid (B, T)``) are kept: a graph whose
    padding the bridge did not know (a 4-D mask) may hold padding queries.
    """
    compact = torch.cumsum(valid.long(), dim=1) - 1  # (B, T): padded position -> token id
    per_seq: list[list] = [[] for _ in range(valid.size(0))]
    shared: dict = {}
    for _, graph, alpha in sorted(calls, key=lambda c: c[0]):
        if id(graph) not in shared:  # one local edge_index per graph, shared by the layers that use it
            b, i, j = (t.cpu() for t in graph.positions())  # (E,) each, sorted by (b, i, j)
            real = valid[b, i] & valid[b, j]  # (E,)
            b, i, j = b[real], i[real], j[real]
            counts = torch.bincount(b, minlength=valid.size(0)).tolist()
            local = torch.stack([compact[b, j], compact[b, i]])  # (2, E')
            shared[id(graph)] = (real, counts, local.split(counts, dim=1))
        real, counts, edges = shared[id(graph)]
        for seq, (e, a) in enumerate(zip(edges, alpha.cpu()[real].split(counts))):
            per_seq[seq].append((e, a))
    return per_seq


@torch.no_grad()
def attention_records(
    model,
    tokenizer,
    texts: list[str] | str,
    *,
    batch_size: int = 32,
    max_length: int | None = None,
    hidden_states: bool = False,
) -> list[AttentionRecord]:
    """Run ``model`` over ``texts`` and record every self-attention layer's graph and weights.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        Running with ``attn_implementation="graphattn"`` (e.g. from
        :func:`graphattn.interop.hf.load_minilm`); inside a
        :func:`graphattn.interop.hf.sparsity` block the records hold the kept edges.
    tokenizer : the model's tokenizer
    texts : str or list of str
    batch_size : int, default 32
        Texts per forward pass (padded to the longest in the batch).
    max_length : int, optional
        Longer inputs are truncated to this many tokens; at most the model's
        ``max_position_embeddings``. Default 512 (BERT's limit), or the model's
        positions if fewer.
    hidden_states : bool, default False
        Also keep every layer's hidden states.

    Returns
    -------
    list of AttentionRecord
        One per text, in order, tensors on the CPU.

    Raises
    ------
    ValueError
        If ``model`` does not run with ``attn_implementation="graphattn"``,
        ``batch_size < 1``, or ``max_length`` outside [1, the model's positions].
    NotImplementedError
        If ``model`` does not route attention through ``AttentionInterface``.
    TypeError
        If ``texts`` is not a str or a list of str, a size is not an int, or
        ``hidden_states`` not a bool.
    """
    from graphattn.interop.hf import check_max_length, check_model, recording

    check_model(model)
    texts = [texts] if isinstance(texts, str) else texts
    if not isinstance(texts, (list, tuple)) or not all(isinstance(t, str) for t in texts):
        raise TypeError(message("texts", "a str or a list of str", type(texts).__name__))
    batch_size = check_int("batch_size", batch_size, low=1)
    max_length = check_max_length(model, max_length, default=512)
    check_bool("hidden_states", hidden_states)
    records: list[AttentionRecord] = []
    for start in range(0, len(texts), batch_size):
        chunk = list(texts[start : start + batch_size])
        batch = tokenizer(chunk, padding=True, truncation=True, max_length=max_length, return_tensors="pt").to(
            model.device
        )
        with recording(model) as calls:
            out = model(**batch, output_hidden_states=hidden_states)
        valid = batch["attention_mask"].bool().cpu()  # (B, T)
        per_seq = _split(calls, valid)
        for seq, text in enumerate(chunk):
            ids = batch["input_ids"][seq].cpu()[valid[seq]]  # (N,)
            states = [h[seq][valid[seq].to(h.device)].cpu() for h in out.hidden_states] if hidden_states else None
            records.append(
                AttentionRecord(
                    text=text,
                    tokens=tokenizer.convert_ids_to_tokens(ids.tolist()),
                    edge_index=[e for e, _ in per_seq[seq]],
                    alphas=[a for _, a in per_seq[seq]],
                    hidden_states=states,
                )
            )
    return records
