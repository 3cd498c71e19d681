"""Forward time of all-MiniLM-L6-v2 through graph attention vs Hugging Face eager and sdpa.

64 real English sentences (the Python reference documentation shipped with
CPython, ``pydoc_data.topics``), tokenised into one padded batch of at most 128
tokens, one forward pass each; the median of ``--repeats`` timed runs after a
warm-up. Prints seconds and the ratio graphattn / eager (target: at most 2).

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


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up (also builds caches: a fresh mask each call, so the graph is rebuilt every run)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


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
    print(f"{len(texts)} sentences, tokens per sentence: min {int(lengths.min())}, mean {float(lengths.float().mean()):.1f}, "
          f"max {int(lengths.max())}; padded to {batch['input_ids'].shape[1]}; torch threads {torch.get_num_threads()}")
    seconds = {}
    for impl, (model, _) in models.items():
        with torch.inference_mode():
            seconds[impl] = median_time(lambda: model(**batch), args.repeats)
        print(f"{impl:>10}: {seconds[impl] * 1e3:8.1f} ms")
    print(f"ratio graphattn / eager: {seconds['graphattn'] / seconds['eager']:.2f}  "
          f"(graphattn / sdpa: {seconds['graphattn'] / seconds['sdpa']:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
