"""Forward time of all-MiniLM-L6-v2 through graph attention vs Hugging Face eager and sdpa.

64 real English sentences (the Python reference documentation shipped with
CPython, ``pydoc_data.topics``), tokenised into one padded batch of at most 128
tokens, one forward pass each; ``--repeats`` rounds after a warm-up, the three
implementations alternating within each round. Prints the median seconds and
the median per-round ratio graphattn / eager (target: at most 2).

    python benchmarks/hf_forward.py [--batch 64] [--max-length 128] [--repeats 7] [--threads N]
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import time

import torch


def real_sentences(n: int, seed: int = 0, min_words: int = 4) -> list[str]:
    """``n`` sentences of the CPython reference documentation, drawn with a fixed seed."""
    from pydoc_data.topics import topics

    text = " ".join(topics[k] for k in sorted(topics))
    text = re.sub(r"\s+", " ", text)
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+(?=[A-Z])", text)]
    sentences = [s for s in sentences if len(s.split()) >= min_words]
    return random.Random(seed).sample(sentences, n)


def interleaved_times(fns: dict, repeats: int) -> dict[str, list[float]]:
    """Seconds per call of each function, the functions alternating in every round.

    Alternating spreads the load of a shared machine evenly over the
    implementations, so the per-round ratios are fairer than separate runs.
    """
    for fn in fns.values():
        fn()  # warm-up
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from graphattn.interop.hf import load_minilm

    texts = real_sentences(args.batch)
    models = {impl: load_minilm(impl) for impl in ("graphattn", "eager", "sdpa")}
    tokenizer = models["eager"][1]
    batch = tokenizer(texts, padding=True, truncation=True, max_length=args.max_length, return_tensors="pt")
    lengths = batch["attention_mask"].sum(1)
    print(
        f"{len(texts)} sentences, tokens per sentence: min {int(lengths.min())}, mean {float(lengths.float().mean()):.1f}, "
        f"max {int(lengths.max())}; padded to {batch['input_ids'].shape[1]}; torch threads {torch.get_num_threads()}"
    )

    def forward(model):
        def run():
            with torch.no_grad():  # a fresh mask every call: the graph is rebuilt once per forward
                model(**batch)

        return run

    times = interleaved_times({impl: forward(model) for impl, (model, _) in models.items()}, args.repeats)
    for impl, ts in times.items():
        print(f"{impl:>10}: median {statistics.median(ts) * 1e3:8.1f} ms  (min {min(ts) * 1e3:.1f})")
    for ref in ("eager", "sdpa"):
        ratios = [g / r for g, r in zip(times["graphattn"], times[ref])]
        print(
            f"ratio graphattn / {ref}: median {statistics.median(ratios):.2f} over {len(ratios)} rounds "
            f"(min {min(ratios):.2f}, max {max(ratios):.2f})"
        )
    with torch.no_grad():  # exactness on the same batch, real tokens only
        hidden = {impl: model(**batch).last_hidden_state for impl, (model, _) in models.items()}
    valid = batch["attention_mask"].bool()
    for impl in ("graphattn", "sdpa"):
        diff = (hidden[impl] - hidden["eager"])[valid].abs().max()
        print(f"max |{impl} - eager| of last_hidden_state on real tokens: {float(diff):.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
