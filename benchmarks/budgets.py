"""Quality per evaluation: full evaluation, racing and the ``auto`` presets at equal budgets, and racing's wall time.

What a user buys is the best instruction a budget finds. Every run here is a real ``OPROTeleprompter.compile``
through DSPy and LiteLLM against the simulated OpenAI-compatible endpoint
(:class:`dspy_opro.testing.SimulatedEndpoint`, in-process on 127.0.0.1) on ``n`` training examples, with
``max_metric_calls`` set to the budget and steps enough that the budget, not the steps, ends the run:

* ``full``: ``racing=False``, 8 candidates per step (the paper's scoring);
* ``racing``: ``racing=True``, 8 candidates per step;
* ``light``, ``medium``, ``heavy``: ``auto=...`` with its defaults (which race, at twice the preset's steps) and the
  same ``max_metric_calls``.

Per budget and mode, over the seeds: the answer-key training score of the returned instruction (computed from the
simulator's answer key, :func:`dspy_opro.testing.answers_correctly`, not from the run's record; mean and worst
seed), the candidates fully scored, the steps reached, and the metric calls the endpoint served (its request log).

``--wall`` adds the wall time: the endpoint answering each request after ``--latency`` seconds, ``--threads``
evaluations at once, full evaluation and racing with the same ``num_steps`` side by side in one run: each step's
wall time, the whole compile's, and when the first step's best was known (step 0's end, from the compile's start).

    python benchmarks/budgets.py --seeds 8 --n 100 --budgets 1000,2000,4000 --jobs 2   # results/budgets.md
    python benchmarks/budgets.py --seeds 2 --budgets 500 --no-write
    python benchmarks/budgets.py --wall --seeds 2 --steps 3 --latency 0.2 --threads 16
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
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

from dspy_opro import OPROTeleprompter, Racing  # noqa: E402
from dspy_opro.testing import SimulatedEndpoint, answers_correctly, simulated_dataset, simulated_metric  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "budgets.md"
MODES = ("full", "racing", "light", "medium", "heavy")
MANY_STEPS = 1000  # steps enough that the budget ends every run


@dataclass(frozen=True)
class Outcome:
    """One compile's result."""

    score: float  # the returned instruction's answer-key training accuracy
    scored: int  # candidates fully scored, the program as given aside
    evaluated: int  # candidates scored in full or raced out (stopped early by racing)
    steps: int  # steps recorded
    served: int  # task-model requests the endpoint answered
    seconds: float
    step_seconds: tuple[float, ...] = ()  # each step's wall time (--wall)
    first_best: float = 0.0  # seconds from the compile's start to the end of step 0 (--wall)


def settings(mode: str, budget: int | None, steps: int | None) -> dict[str, object]:
    """The optimizer's settings of one mode."""
    if mode in ("full", "racing"):
        return {"num_steps": steps or MANY_STEPS, "num_candidates": 8,
                "racing": Racing() if mode == "racing" else False, "max_metric_calls": budget}
    return {"auto": mode, "max_metric_calls": budget}


def compile_once(*, mode: str, seed: int, n: int, budget: int | None, steps: int | None, threads: int,
                 latency: float = 0.0) -> Outcome:
    """One compile on the simulated task (see the module docstring)."""
    trainset = simulated_dataset(n, seed=seed)
    with SimulatedEndpoint(seed=seed, latency=latency) as endpoint:
        connection = {"api_base": endpoint.base_url, "api_key": "offline", "engine": "litellm", "cache": False,
                      "num_retries": 0}
        teleprompter = OPROTeleprompter(simulated_metric, prompt_model=dspy.LM("openai/sim-opt", **connection),
                                        task_model=dspy.LM("openai/sim-task", **connection), num_threads=threads,
                                        seed=seed, display_progress=False, **settings(mode, budget, steps))
        started = time.time()
        compiled = teleprompter.compile(dspy.Predict("question -> answer"), trainset=trainset)
        seconds = time.time() - started
        served = endpoint.count("task")
    run = compiled.opro_run
    instruction = compiled.signature.instructions
    right = sum(answers_correctly(instruction, example.question, seed=seed) for example in trainset)
    spans = tuple((s.ended_at or 0.0) - (s.started_at or 0.0) for s in run.steps)
    first = (run.steps[0].ended_at or started) - started if run.steps else 0.0
    return Outcome(score=right / n, scored=sum(c.status == "scored" and c.step >= 0 for c in run.candidates),
                   evaluated=sum(c.status in ("scored", "raced_out") and c.step >= 0 for c in run.candidates),
                   steps=len(run.steps), served=served, seconds=seconds, step_seconds=spans, first_best=first)


def run_cell(mode: str, seed: int, n: int, budget: int) -> Outcome:
    logging.getLogger("dspy_opro").setLevel(logging.WARNING)
    return compile_once(mode=mode, seed=seed, n=n, budget=budget, steps=None, threads=8)


def render_budgets(n: int, budgets: list[int], seeds: int, done: dict[tuple[str, int, int], Outcome]) -> list[str]:
    lines = [f"## Equal budgets, n = {n}, {seeds} seeds", "",
             "| budget | mode | mean score | worst seed | candidates fully scored (mean) | candidates scored or raced "
             "out (mean) | steps reached (mean) | calls served (mean) |", "|---:|---|---:|---:|---:|---:|---:|---:|"]
    verdicts = []
    for budget in budgets:
        means: dict[str, tuple[float, float]] = {}
        for mode in MODES:
            rows = [done[(mode, seed, budget)] for seed in range(seeds) if (mode, seed, budget) in done]
            if not rows:
                continue
            mean = sum(o.score for o in rows) / len(rows)
            scored = sum(o.scored for o in rows) / len(rows)
            evaluated = sum(o.evaluated for o in rows) / len(rows)
            means[mode] = (mean, evaluated)
            lines.append(f"| {budget:,} | {mode} | {100 * mean:.1f} | {100 * min(o.score for o in rows):.1f} "
                         f"| {scored:.1f} | {evaluated:.1f} | {sum(o.steps for o in rows) / len(rows):.1f} "
                         f"| {sum(o.served for o in rows) / len(rows):,.0f} |")
        if "full" in means and "racing" in means:
            (full, full_scored), (race, race_scored) = means["full"], means["racing"]
            verdicts.append(f"- Budget {budget:,}: racing's mean {100 * race:.1f} against full evaluation's "
                            f"{100 * full:.1f} ({'at least' if race >= full else 'BELOW'}), "
                            f"{race_scored / max(full_scored, 1e-9):.2f}x the candidates scored (in full or raced "
                            f"out; goal: at least full's mean and 1.8x).")
    return lines + [""] + verdicts + [""]


def render_wall(n: int, seeds: int, steps: int, latency: float, threads: int,
                done: dict[tuple[str, int], Outcome]) -> list[str]:
    lines = [f"## Wall time, n = {n}, {steps} steps x 8, {latency:g} s per request, {threads} threads", "",
             "| seed | mode | compile (s) | per step (s) | first step's best known at (s) | calls served |",
             "|---:|---|---:|---:|---:|---:|"]
    for seed in range(seeds):
        for mode in ("full", "racing"):
            if (mode, seed) not in done:
                continue
            o = done[(mode, seed)]
            lines.append(f"| {seed} | {mode} | {o.seconds:.1f} | {', '.join(f'{s:.1f}' for s in o.step_seconds)} "
                         f"| {o.first_best:.1f} | {o.served:,} |")
    pairs = [(done[("full", s)], done[("racing", s)]) for s in range(seeds) if ("full", s) in done
             and ("racing", s) in done]
    if pairs:
        ratio = sum(r.seconds for _, r in pairs) / sum(f.seconds for f, _ in pairs)
        first = sum(r.first_best for _, r in pairs) / sum(f.first_best for f, _ in pairs)
        lines += ["", f"- Racing's compile took {ratio:.2f}x full evaluation's wall time (goal: at most 1.00x); its "
                      f"first step's best was known at {first:.2f}x full's time (goal: at most 1.00x).", ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--budgets", type=str, default="1000,2000,4000")
    parser.add_argument("--jobs", type=int, default=1, help="compiles run in parallel processes")
    parser.add_argument("--wall", action="store_true", help="also measure wall time with a slow endpoint")
    parser.add_argument("--steps", type=int, default=3, help="--wall: num_steps of both modes")
    parser.add_argument("--latency", type=float, default=0.2, help="--wall: seconds per request")
    parser.add_argument("--threads", type=int, default=16, help="--wall: num_threads")
    parser.add_argument("--no-write", action="store_true", help=f"do not write {RESULTS.name}")
    args = parser.parse_args(argv)
    logging.getLogger("dspy_opro").setLevel(logging.WARNING)
    budgets = [int(b) for b in args.budgets.split(",")] if args.budgets else []
    started = time.time()
    done: dict[tuple[str, int, int], Outcome] = {}
    with cf.ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(run_cell, mode, seed, args.n, budget): (mode, seed, budget)
                   for budget in budgets for seed in range(args.seeds) for mode in MODES}
        for future in cf.as_completed(futures):
            done[futures[future]] = outcome = future.result()
            print(f"{futures[future]}: {100 * outcome.score:.1f}, {outcome.scored} scored, {outcome.steps} steps, "
                  f"{outcome.served} calls, {outcome.seconds:.1f} s", file=sys.stderr, flush=True)
    lines: list[str] = []
    if budgets:
        lines += render_budgets(args.n, budgets, args.seeds, done)
    if args.wall:
        walls: dict[tuple[str, int], Outcome] = {}
        for seed in range(args.seeds):
            for mode in ("full", "racing"):  # one after the other, in one process: side by side on one machine
                walls[(mode, seed)] = compile_once(mode=mode, seed=seed, n=args.n, budget=None, steps=args.steps,
                                                   threads=args.threads, latency=args.latency)
                print(f"wall {mode} {seed}: {walls[(mode, seed)].seconds:.1f} s", file=sys.stderr, flush=True)
        lines += render_wall(args.n, args.seeds, args.steps, args.latency, args.threads, walls)
    command = f"`python benchmarks/budgets.py {' '.join(argv if argv is not None else sys.argv[1:])}`"
    lines = ["# Quality per evaluation: full evaluation, racing and the presets at equal budgets", "",
             "Score: the returned instruction's training accuracy from the simulator's answer key, in percent. "
             "Every mode gets the same `max_metric_calls`; `full` and `racing` run 8 candidates per step until it "
             "is spent, the presets run their own steps (twice the preset's, racing) within it.", "",
             *lines[:1], "", f"{command}, one run, {datetime.date.today().isoformat()}, Python "
             f"{platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs, "
             f"{time.time() - started:.0f} s.", *lines[1:]]
    print("\n".join(lines))
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        existing = RESULTS.read_text() if RESULTS.exists() else ""
        kept = [section for section in existing.split("\n## ")[1:]
                if (section.startswith("Wall time") and not args.wall) or (section.startswith("Equal") and not budgets)]
        RESULTS.write_text("\n".join(lines).rstrip("\n") + "".join(f"\n\n## {s.rstrip()}" for s in kept) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
