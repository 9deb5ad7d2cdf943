"""Peak memory and time of one hard-and-diverse selection, before and after QuestionFeatures, in one run.

*Before*: what ``exemplar_selection="hard_diverse"`` did at every step until QuestionFeatures: tokenise the
eligible questions, build the ``n x n`` cosine similarity, weigh it into the kernel ``L`` and run greedy DPP MAP on
it (``similarity_matrix`` + ``quality_weights`` + ``greedy_dpp_map``). *After*: :class:`QuestionFeatures` built
once per compile, then one :meth:`QuestionFeatures.select` per step, asking only for the kernel rows of its picks.
Both make the same selection (the script checks it). Peak memory is measured with tracemalloc (numpy reports its
buffers to it), each phase from a fresh start of tracing; times are the median of ``--repeats`` runs.

Synthetic questions: ``--n`` texts of 20-60 words drawn from a Zipf-like vocabulary of 5,000 words.

    python benchmarks/diversity_memory.py              # n = 5000, k = 3; writes results/diversity_memory.md
    python benchmarks/diversity_memory.py --n 2000 --no-write
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dspy_opro.extensions.hard_diverse import QuestionFeatures, greedy_dpp_map, quality_weights, similarity_matrix

RESULTS = Path(__file__).parent / "results" / "diversity_memory.md"


def synthetic_questions(n: int, *, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(5000)]
    weights = 1.0 / np.arange(1, 5001)
    weights /= weights.sum()
    return [" ".join(rng.choice(vocab, size=int(rng.integers(20, 61)), p=weights)) for _ in range(n)]


def before(texts: list[str], difficulties: np.ndarray, k: int, theta: float) -> list[int]:
    r = quality_weights(difficulties, len(texts), theta=theta)
    S = similarity_matrix(texts)
    return greedy_dpp_map(r[:, None] * S * r[None, :], k).indices


def measure(fn: Callable[[], Any], repeats: int) -> tuple[Any, float, float]:
    """The result, the peak traced memory in MB (first run) and the median wall time in seconds."""
    tracemalloc.start()
    try:
        result = fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return result, peak / 1024**2, statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--theta", type=float, default=0.7)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)

    texts = synthetic_questions(args.n)
    difficulties = np.random.default_rng(1).uniform(0.0, 1.0, args.n)
    old, old_peak, old_time = measure(lambda: before(texts, difficulties, args.k, args.theta), args.repeats)
    features, build_peak, build_time = measure(lambda: QuestionFeatures.build(texts), args.repeats)
    full = list(range(args.n))
    features.select(difficulties, args.k, subset=full, theta=args.theta)  # the previous step, same subset
    new, select_peak, select_time = measure(
        lambda: features.select(difficulties, args.k, subset=full, theta=args.theta), args.repeats
    )
    # Alternating between two subsets makes every call recompute the weights (a cache miss).
    subsets = [list(range(1, args.n)), list(range(args.n - 1))]

    def fresh_select() -> None:
        subsets.reverse()
        features.select(difficulties[: args.n - 1], args.k, subset=subsets[0], theta=args.theta)

    _, fresh_peak, fresh_time = measure(fresh_select, args.repeats)
    same = new.indices == old
    lines = [
        "# hard_diverse selection: peak memory before and after QuestionFeatures",
        "",
        f"Written by `python benchmarks/diversity_memory.py`. n = {args.n} synthetic questions (20-60 words, "
        f"Zipf-like 5,000-word vocabulary), k = {args.k}, theta = {args.theta}, TF-IDF features. Peak: tracemalloc "
        f"(numpy buffers included), first run of each phase; time: median of {args.repeats} runs.",
        "",
        "| phase | runs | peak MB | time s |",
        "| --- | --- | ---: | ---: |",
        f"| before: n x n similarity + kernel + greedy | every step | {old_peak:.1f} | {old_time:.3f} |",
        f"| after: QuestionFeatures.build (tokenise) | once per compile | {build_peak:.1f} | {build_time:.3f} |",
        f"| after: select, same subset as the last step (cached weights) | every step | {select_peak:.1f} "
        f"| {select_time:.3f} |",
        f"| after: select, new subset (weights recomputed) | when the eligible examples change | {fresh_peak:.1f} "
        f"| {fresh_time:.3f} |",
        "",
        f"Same selection before and after: {'yes' if same else 'NO'} ({new.indices} vs {old}). "
        f"Peak per step {old_peak:.1f} MB -> {max(select_peak, fresh_peak):.1f} MB "
        f"({old_peak / max(select_peak, fresh_peak):.0f}x less).",
        "",
        f"Machine: python {platform.python_version()}, numpy {np.__version__}, "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        RESULTS.write_text(text)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
