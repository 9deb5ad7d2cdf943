"""Does showing a raced-out candidate's partial mean steer OPRO worse? Real compiles on the simulated task.

Issue 24 asks to check it. Racing shows a raced-out instruction in later meta-prompts with its partial mean (the
mean over the examples it ran). This script compiles ``racing=True`` three ways, changing only what the
meta-prompts show of raced-out candidates (benchmark-only patches of ``dspy_opro.core.run.predictor_history``, the
function that lists a predictor's scored instructions for the meta-prompt):

* **partial**: as the library does, the partial mean;
* **oracle**: the candidate's full training score from the simulator's answer key, as full evaluation would have
  shown it (not available in a real run: it isolates the effect of the partial means);
* **hidden**: raced-out candidates are left out of the meta-prompts.

Metric calls are counted at the endpoint; the score is the returned instruction's training accuracy from the
answer key. Compare with full evaluation in ``results/racing.md`` (same seeds and sizes).

    python benchmarks/racing_partial_means.py --seeds 4 --n 100,200 --jobs 4
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import os
from collections.abc import Iterator

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402

import dspy_opro.core.run as run_module  # noqa: E402
from dspy_opro import OPROTeleprompter  # noqa: E402
from dspy_opro.core.exemplars import predictor_history  # noqa: E402
from dspy_opro.state import CandidateStatus, RunState  # noqa: E402
from dspy_opro.testing import SimulatedEndpoint, answers_correctly, simulated_dataset, simulated_metric  # noqa: E402

MODES = ("partial", "oracle", "hidden")


@contextlib.contextmanager
def shown(mode: str, *, trainset: list[dspy.Example], seed: int) -> Iterator[None]:
    """Within the block, the meta-prompts show raced-out candidates as ``mode`` says."""

    def history(state: RunState, predictor: str) -> list[tuple[str, float, int]]:
        raced = {c.instruction: c for c in state.candidates if c.status == CandidateStatus.RACED_OUT}
        out = []
        for instruction, score, step in predictor_history(state, predictor):
            if instruction in raced and step == raced[instruction].step:
                if mode == "hidden":
                    continue
                if mode == "oracle":
                    score = sum(answers_correctly(instruction, e.question, seed=seed) for e in trainset) / len(
                        trainset)
            out.append((instruction, score, step))
        return out

    saved = run_module.predictor_history
    run_module.predictor_history = history if mode != "partial" else saved  # type: ignore[assignment]
    try:
        yield
    finally:
        run_module.predictor_history = saved  # type: ignore[assignment]


def compile_once(*, seed: int, n: int, mode: str, steps: int) -> tuple[int, float, int]:
    """(metric calls served, answer-key score of the returned instruction, raced out) of one compile."""
    trainset = simulated_dataset(n, seed=seed)
    with SimulatedEndpoint(seed=seed) as endpoint:
        connection = {"api_base": endpoint.base_url, "api_key": "offline", "engine": "litellm", "cache": False,
                      "num_retries": 0}
        teleprompter = OPROTeleprompter(
            simulated_metric, prompt_model=dspy.LM("openai/sim-opt", **connection),
            task_model=dspy.LM("openai/sim-task", **connection), num_steps=steps, num_candidates=8, num_threads=8,
            racing=True, seed=seed)
        with shown(mode, trainset=trainset, seed=seed):
            compiled = teleprompter.compile(dspy.Predict("question -> answer"), trainset=trainset)
        served = endpoint.count("task")
    instruction = compiled.signature.instructions
    right = sum(answers_correctly(instruction, e.question, seed=seed) for e in trainset)
    raced = sum(c.status == "raced_out" for c in compiled.opro_run.candidates)
    return served, right / n, raced


def cell(n: int, seed: int, steps: int) -> dict[str, tuple[int, float, int]]:
    return {mode: compile_once(seed=seed, n=n, mode=mode, steps=steps) for mode in MODES}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--n", type=str, default="100,200")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args(argv)
    sizes = [int(v) for v in args.n.split(",")]
    with cf.ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = {(n, seed): pool.submit(cell, n, seed, args.steps) for n in sizes for seed in range(args.seeds)}
        results = {key: future.result() for key, future in futures.items()}
    lines = ["| n | seed | " + " | ".join(f"{m} calls | {m} score" for m in MODES) + " |",
             "|---:|---:|" + "---:|---:|" * len(MODES)]
    for (n, seed), by_mode in results.items():
        lines.append(f"| {n} | {seed} | " + " | ".join(
            f"{by_mode[m][0]} | {100 * by_mode[m][1]:.1f}" for m in MODES) + " |")
    for n in sizes:
        rows = [by_mode for (size, _), by_mode in results.items() if size == n]
        lines.append(f"\nn = {n}: mean answer-key score " + ", ".join(
            f"{m} {100 * sum(r[m][1] for r in rows) / len(rows):.1f}" for m in MODES) + "; metric calls " + ", ".join(
            f"{m} {sum(r[m][0] for r in rows):,}" for m in MODES) + ".")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
