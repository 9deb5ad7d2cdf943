"""Racing against full evaluation in real OPRO compiles on the simulated task: metric calls and the winner.

Every run is a real ``OPROTeleprompter.compile`` through DSPy and LiteLLM against the simulated OpenAI-compatible
endpoint (:class:`dspy_opro.testing.SimulatedEndpoint`, in-process on 127.0.0.1). Per seed and training-set size,
the same training set, endpoint seed and run seed are compiled three times: ``racing=False`` (full evaluation),
``racing=True`` under the 0.2 schedule (``benchmarks/racing_legacy.py``, "old racing") and ``racing=True`` (the
racing of this version, "new racing"). The table reports, per mode, the metric calls the endpoint served to the
task model (counted at the endpoint's request log, not by the run) and the returned instruction's training score
computed from the simulator's answer key (:func:`dspy_opro.testing.answers_correctly`), not from the run's record.
Racing changes the meta-prompts (a raced-out candidate shows its partial mean), so after the first stop the
trajectories may diverge and the returned instructions differ.

    python benchmarks/racing_runs.py --seeds 6 --n 100,50,200 --jobs 2   # results/racing.md, 5 steps x 8
    python benchmarks/racing_runs.py --seeds 2 --n 50 --steps 2 --no-write
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import datetime
import logging
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))

from racing_legacy import legacy_racing  # noqa: E402

from dspy_opro import OPROTeleprompter, Racing  # noqa: E402
from dspy_opro.testing import SimulatedEndpoint, answers_correctly, simulated_dataset, simulated_metric  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "racing.md"
END_OF_TABLES = "<!-- end of the generated tables; what follows is written by hand -->"
MODES = ("full", "old", "new")


@dataclass(frozen=True)
class Outcome:
    """One compile's result."""

    metric_calls: int  # task-model requests the endpoint answered during the compile
    recorded_calls: int  # the run record's own count (a cross-check)
    raced_out: int
    candidates: int
    instruction: str
    answer_key_score: float  # the returned instruction's training score from the simulator's answer key
    seconds: float


def compile_once(*, seed: int, n: int, steps: int, candidates: int, threads: int, mode: str,
                 alpha: float) -> Outcome:
    """One compile on the simulated task (see the module docstring)."""
    trainset = simulated_dataset(n, seed=seed)
    with SimulatedEndpoint(seed=seed) as endpoint:
        connection = {"api_base": endpoint.base_url, "api_key": "offline", "engine": "litellm", "cache": False,
                      "num_retries": 0}
        teleprompter = OPROTeleprompter(
            simulated_metric, prompt_model=dspy.LM("openai/sim-opt", **connection),
            task_model=dspy.LM("openai/sim-task", **connection), num_steps=steps, num_candidates=candidates,
            num_threads=threads, racing=False if mode == "full" else Racing(alpha=alpha), seed=seed)
        started = time.perf_counter()
        with legacy_racing() if mode == "old" else contextlib.nullcontext():
            compiled = teleprompter.compile(dspy.Predict("question -> answer"), trainset=trainset)
        seconds = time.perf_counter() - started
        served = endpoint.count("task")
    run = compiled.opro_run
    instruction = compiled.signature.instructions
    right = sum(answers_correctly(instruction, example.question, seed=seed) for example in trainset)
    return Outcome(metric_calls=served, recorded_calls=run.metric_calls,
                   raced_out=sum(c.status == "raced_out" for c in run.candidates),
                   candidates=sum(c.status in ("scored", "raced_out") for c in run.candidates) - 1,
                   instruction=instruction, answer_key_score=right / n, seconds=seconds)


def render_n(n: int, rows: list[tuple[int, dict[str, Outcome]]]) -> list[str]:
    """One training-set size: the per-seed table and its summary."""
    lines = [
        f"## n = {n}",
        "",
        "| seed | full calls | old calls | new calls | old ratio | new ratio | new raced out | full score "
        "| old score | new score | new = full winner |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for seed, o in rows:
        full, old, new = o["full"], o["old"], o["new"]
        lines.append(
            f"| {seed} | {full.metric_calls} | {old.metric_calls} | {new.metric_calls} "
            f"| {full.metric_calls / old.metric_calls:.2f}x | {full.metric_calls / new.metric_calls:.2f}x "
            f"| {new.raced_out} of {new.candidates} | {100 * full.answer_key_score:.1f} "
            f"| {100 * old.answer_key_score:.1f} | {100 * new.answer_key_score:.1f} "
            f"| {'yes' if full.instruction == new.instruction else 'no'} |")
    total = {m: sum(o[m].metric_calls for _, o in rows) for m in MODES}
    worst = {m: min(o["full"].metric_calls / o[m].metric_calls for _, o in rows) for m in ("old", "new")}
    mean = {m: sum(o[m].answer_key_score for _, o in rows) / len(rows) for m in MODES}
    not_worse = {m: sum(o[m].answer_key_score >= o["full"].answer_key_score for _, o in rows) for m in ("old", "new")}
    agree = all(o[m].metric_calls == o[m].recorded_calls for _, o in rows for m in MODES)
    lines += [
        "",
        f"- Metric calls over {len(rows)} seeds: full {total['full']:,}, old racing {total['old']:,} "
        f"({total['full'] / total['old']:.2f}x fewer, worst seed {worst['old']:.2f}x), new racing {total['new']:,} "
        f"(**{total['full'] / total['new']:.2f}x fewer, worst seed {worst['new']:.2f}x**).",
        f"- Mean answer-key training score of the returned instruction: full {100 * mean['full']:.1f}, "
        f"old {100 * mean['old']:.1f}, new {100 * mean['new']:.1f}; at least full's in {not_worse['old']} (old) "
        f"and {not_worse['new']} (new) of {len(rows)} seeds.",
        f"- Calls are the task-model requests the endpoint served; the run records agree ({'yes' if agree else 'NO'}).",
        "",
    ]
    return lines


def run_cell(*, n: int, seed: int, args: argparse.Namespace) -> dict[str, Outcome]:
    """One training-set size and seed: the three modes, one after the other."""
    logging.getLogger("dspy_opro").setLevel(logging.WARNING)
    return {mode: compile_once(seed=seed, n=n, steps=args.steps, candidates=args.candidates, threads=args.threads,
                               mode=mode, alpha=args.alpha) for mode in MODES}


def render(sizes: list[int], seeds: int, done: dict[tuple[int, int], dict[str, Outcome]]) -> list[str]:
    """Every size with at least one finished seed (a size still running says how many of its seeds are in)."""
    lines: list[str] = []
    for n in sizes:
        rows = [(seed, done[(n, seed)]) for seed in range(seeds) if (n, seed) in done]
        if rows:
            lines += render_n(n, rows) if len(rows) == seeds else render_n(n, rows) + [
                f"(partial: {len(rows)} of {seeds} seeds)", ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--n", type=str, default="50,100,200", help="training-set sizes, comma-separated")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--candidates", type=int, default=8)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--jobs", type=int, default=1, help="(n, seed) cells compiled in parallel processes")
    parser.add_argument("--no-write", action="store_true", help=f"do not write {RESULTS.name}")
    args = parser.parse_args(argv)
    logging.getLogger("dspy_opro").setLevel(logging.WARNING)
    header = [
        "# Racing against full evaluation (real compiles, simulated task)",
        "",
        f"`python benchmarks/racing_runs.py --seeds {args.seeds} --n {args.n} --steps {args.steps} "
        f"--candidates {args.candidates} --threads {args.threads} --alpha {args.alpha} --jobs {args.jobs}`, one run, "
        f"{datetime.date.today().isoformat()}, Python {platform.python_version()}, {platform.machine()}.",
        "",
        "Per seed and n: the same training set (`simulated_dataset(n, seed)`), endpoint seed and run seed, compiled "
        "with `racing=False` (full), the 0.2 racing (`benchmarks/racing_legacy.py`, old) and `racing=True` (new). "
        "Ratio: full calls / racing calls. Score: the returned instruction's training accuracy from the simulator's "
        "answer key, in percent.",
        "",
    ]
    sizes = [int(v) for v in args.n.split(",")]
    cells = [(n, seed) for n in sizes for seed in range(args.seeds)]
    done: dict[tuple[int, int], dict[str, Outcome]] = {}
    # Each cell (n, seed) compiles full, old and new in one process; --jobs cells run side by side.
    with cf.ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(run_cell, n=n, seed=seed, args=args): (n, seed) for n, seed in cells}
        for future in cf.as_completed(futures):
            n, seed = futures[future]
            done[(n, seed)] = outcomes = future.result()
            print(f"n {n} seed {seed}: " + ", ".join(
                f"{m} {o.metric_calls} calls ({100 * o.answer_key_score:.1f})" for m, o in outcomes.items()),
                file=sys.stderr, flush=True)
            write(header + render(sizes, args.seeds, done), args)  # what is measured so far is kept
    lines = header + render(sizes, args.seeds, done)
    print("\n".join(lines))
    return 0


def write(lines: list[str], args: argparse.Namespace) -> None:
    """The tables, followed by the hand-written part of the results file (kept)."""
    if args.no_write:
        return
    text = "\n".join(lines + [END_OF_TABLES]) + "\n"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    existing = RESULTS.read_text() if RESULTS.exists() else ""
    tail = existing.split(END_OF_TABLES, 1)[1] if END_OF_TABLES in existing else ""
    RESULTS.write_text(text.rstrip("\n") + tail if tail else text)


if __name__ == "__main__":
    raise SystemExit(main())
