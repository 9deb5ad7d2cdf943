"""Racing against full evaluation in real OPRO compiles on the simulated task: metric calls and the winner.

Every run is a real ``OPROTeleprompter.compile`` through DSPy and LiteLLM against the simulated OpenAI-compatible
endpoint (:class:`dspy_opro.testing.SimulatedEndpoint`, in-process on 127.0.0.1). Per seed, the same training set,
endpoint seed and run seed are compiled twice, with ``racing=False`` (full evaluation) and ``racing=True``. The
table reports, per mode, the metric calls the endpoint served to the task model (counted at the endpoint's request
log, not by the run), the selected instruction, and its training score computed from the simulator's answer key
(:func:`dspy_opro.testing.answers_correctly`), not from the run's own record. Racing changes the meta-prompts (a
raced-out candidate shows its partial mean), so after the first stop the two trajectories may diverge: "same
winner" says whether both modes returned the same instruction, and the score columns say how much it matters.

    python benchmarks/racing_runs.py                       # 10 seeds, n = 100, 5 steps x 8; writes results/
    python benchmarks/racing_runs.py --seeds 3 --steps 2 --no-write
"""

from __future__ import annotations

import argparse
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

RESULTS = Path(__file__).parent / "results" / "racing.md"


@dataclass(frozen=True)
class Outcome:
    """One compile's result."""

    metric_calls: int  # task-model requests the endpoint answered during the compile
    recorded_calls: int  # the run record's own count (a cross-check)
    raced_out: int
    candidates: int
    instruction: str
    answer_key_score: float  # the selected instruction's training score from the simulator's answer key
    seconds: float


def compile_once(*, seed: int, n: int, steps: int, candidates: int, threads: int, racing: bool,
                 alpha: float) -> Outcome:
    """One compile on the simulated task (see the module docstring)."""
    trainset = simulated_dataset(n, seed=seed)
    with SimulatedEndpoint(seed=seed) as endpoint:
        connection = {"api_base": endpoint.base_url, "api_key": "offline", "engine": "litellm", "cache": False,
                      "num_retries": 0}
        teleprompter = OPROTeleprompter(
            simulated_metric, prompt_model=dspy.LM("openai/sim-opt", **connection),
            task_model=dspy.LM("openai/sim-task", **connection), num_steps=steps, num_candidates=candidates,
            num_threads=threads, racing=Racing(alpha=alpha) if racing else False, seed=seed)
        started = time.perf_counter()
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


def _short(text: str, width: int = 48) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= width else text[: width - 3] + "..."


def render(rows: list[tuple[int, Outcome, Outcome]], *, args: argparse.Namespace) -> str:
    """The Markdown table and its summary."""
    lines = [
        "| seed | full calls | racing calls | ratio | raced out | same winner | full score | racing score |"
        " racing winner |",
        "|---:|---:|---:|---:|---:|:---:|---:|---:|:---|",
    ]
    for seed, full, race in rows:
        lines.append(
            f"| {seed} | {full.metric_calls} | {race.metric_calls} | {full.metric_calls / race.metric_calls:.2f}x "
            f"| {race.raced_out} of {race.candidates} | {'yes' if full.instruction == race.instruction else 'no'} "
            f"| {100 * full.answer_key_score:.1f} | {100 * race.answer_key_score:.1f} | {_short(race.instruction)} |")
    full_calls = sum(f.metric_calls for _, f, _ in rows)
    race_calls = sum(r.metric_calls for _, _, r in rows)
    same = sum(f.instruction == r.instruction for _, f, r in rows)
    full_mean = sum(f.answer_key_score for _, f, _ in rows) / len(rows)
    race_mean = sum(r.answer_key_score for _, _, r in rows) / len(rows)
    not_worse = sum(r.answer_key_score >= f.answer_key_score for _, f, r in rows)
    agree = all(o.metric_calls == o.recorded_calls for _, f, r in rows for o in (f, r))
    summary = [
        f"- Metric calls over {len(rows)} seeds: full {full_calls:,}, racing {race_calls:,}: "
        f"**{full_calls / race_calls:.2f}x fewer** with racing (aim: 2x).",
        f"- Same winner (identical instruction returned): {same} of {len(rows)} seeds; racing's winner scores at "
        f"least as high on the answer key in {not_worse} of {len(rows)}.",
        f"- Mean answer-key training score of the returned instruction: full {100 * full_mean:.1f}, "
        f"racing {100 * race_mean:.1f}.",
        "- Calls are the task-model requests the endpoint served; the run records agree "
        f"({'yes' if agree else 'NO'}).",
    ]
    header = [
        "# Racing against full evaluation (real compiles, simulated task)",
        "",
        f"`python benchmarks/racing_runs.py --seeds {args.seeds} --n {args.n} --steps {args.steps} "
        f"--candidates {args.candidates} --threads {args.threads} --alpha {args.alpha}`, "
        f"{datetime.date.today().isoformat()}, Python {platform.python_version()}, {platform.machine()}.",
        "",
        "Per seed: the same training set (`simulated_dataset(n, seed)`), endpoint seed and run seed, compiled "
        "with `racing=False` and `racing=True`. Score: the returned instruction's training accuracy from the "
        "simulator's answer key, in percent.",
        "",
    ]
    return "\n".join(header + lines + [""] + summary) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--n", type=int, default=100, help="training examples")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--candidates", type=int, default=8)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--no-write", action="store_true", help=f"do not write {RESULTS.name}")
    args = parser.parse_args(argv)
    logging.getLogger("dspy_opro").setLevel(logging.WARNING)
    rows = []
    for seed in range(args.seeds):
        outcomes = [compile_once(seed=seed, n=args.n, steps=args.steps, candidates=args.candidates,
                                 threads=args.threads, racing=racing, alpha=args.alpha) for racing in (False, True)]
        rows.append((seed, *outcomes))
        full, race = outcomes
        print(f"seed {seed}: full {full.metric_calls} calls ({100 * full.answer_key_score:.1f}), racing "
              f"{race.metric_calls} calls ({100 * race.answer_key_score:.1f}), {race.raced_out} raced out",
              file=sys.stderr, flush=True)
    text = render(rows, args=args)
    print(text)
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        existing = RESULTS.read_text() if RESULTS.exists() else ""
        marker = "\n## "  # the sections written by hand after the table (longer runs, the comparison) are kept
        tail = existing[existing.index(marker):] if marker in existing else ""
        RESULTS.write_text(text + tail)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
