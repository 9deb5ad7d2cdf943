"""Racing against full evaluation on synthetic OPRO landscapes: metric calls saved, same winner, false stops.

No language model: each training example ``i`` has a difficulty ``u_i ~ U(0, 1)`` and each candidate instruction
a skill ``a``; the candidate scores 1 on example ``i`` when ``u_i + noise < a`` (``noise ~ N(0, --noise)`` per
candidate and example), so candidates agree on easy and hard examples as real instructions do. The starting
program has skill 0.5; each of ``--steps`` steps proposes ``--candidates`` instructions whose skills are the
step's reference skill plus ``N(--shift, --spread)`` (by default most proposals are well below the best, as in
the authors' traces), and the reference skill creeps up by ``--drift`` per step. The landscape is drawn once per
seed and both modes see exactly the same candidates and scores:

* **full**: every candidate is scored on all ``n`` examples; the winner is the best training mean.
* **racing**: each candidate races the current best (the best fully scored candidate so far, ties to the older)
  with :class:`dspy_opro.extensions.racing.Race` at ``--alpha``; a stopped candidate costs the examples it ran and can never
  become the best.

Per seed the script reports metric calls of both modes, whether the winner is the same candidate, both winners'
training means, and the *false stops*: candidates raced out although their full training mean was at least the
best's at the time of their race.

    python benchmarks/racing_simulation.py                 # 20 seeds, n = 100 and 1000; writes results/
    python benchmarks/racing_simulation.py --seeds 10 --n 200 --no-write
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dspy_opro.extensions.racing import DEFAULT_ALPHA, Race, RacingSchedule, example_order

RESULTS = Path(__file__).parent / "results" / "racing_simulation.md"


@dataclass(frozen=True)
class Landscape:
    """Every candidate's 0/1 score on every training example, candidate 0 being the starting program."""

    scores: np.ndarray  # (candidates, n)
    steps: list[list[int]]  # the candidate ids proposed at each step


@dataclass(frozen=True)
class Outcome:
    """One mode's result on one landscape."""

    metric_calls: int
    winner: int
    winner_mean: float
    false_stops: int
    at_least_as_good: int


def make_landscape(*, seed: int, n: int, steps: int, candidates: int, shift: float, spread: float, drift: float,
                   noise: float) -> Landscape:
    """Draw one synthetic landscape (see the module docstring)."""
    rng = np.random.default_rng([seed, 14])
    difficulty = rng.random(n)
    skills = [0.5]
    ids: list[list[int]] = []
    for step in range(steps):
        reference = 0.5 + drift * (step + 1)
        ids.append(list(range(len(skills), len(skills) + candidates)))
        skills.extend(reference + rng.normal(shift, spread, size=candidates))
    skill = np.asarray(skills)[:, None]
    scores = (difficulty[None, :] + rng.normal(0.0, noise, size=(len(skills), n)) < skill).astype(float)
    return Landscape(scores=scores, steps=ids)


def _best(scores: np.ndarray, scored: list[int]) -> int:
    means = scores[scored].mean(axis=1)
    return scored[int(np.argmax(means))]  # ties to the earliest candidate


def run_full(landscape: Landscape) -> Outcome:
    scores = landscape.scores
    n = scores.shape[1]
    scored = [0] + [c for step in landscape.steps for c in step]
    winner = _best(scores, scored)
    return Outcome(metric_calls=n * len(scored), winner=winner, winner_mean=float(scores[winner].mean()),
                   false_stops=0, at_least_as_good=0)


def run_racing(landscape: Landscape, *, seed: int, alpha: float) -> Outcome:
    scores = landscape.scores
    n = scores.shape[1]
    order = example_order(n, seed=seed)
    schedule = RacingSchedule.build(n)
    scored = [0]
    calls = n
    false_stops = at_least_as_good = 0
    for step in landscape.steps:
        best = _best(scores, scored)  # fixed for the step: the step's candidates race in parallel
        for candidate in step:
            race = Race(best_scores=scores[best], order=order, schedule=schedule, alpha=alpha, seed=seed,
                        stream=candidate)
            for example in order:
                decision = race.record(example, scores[candidate, example])
                if decision.action != "continue":
                    break
            calls += decision.examples
            good = scores[candidate].mean() >= scores[best].mean()
            at_least_as_good += good
            if decision.action == "complete":
                scored.append(candidate)
            else:
                false_stops += good
    winner = _best(scores, scored)
    return Outcome(metric_calls=calls, winner=winner, winner_mean=float(scores[winner].mean()),
                   false_stops=false_stops, at_least_as_good=at_least_as_good)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--n", type=str, default="100,1000", help="training-set sizes, comma-separated")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--candidates", type=int, default=8)
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA)
    parser.add_argument("--shift", type=float, default=-0.10, help="mean proposal skill relative to the reference")
    parser.add_argument("--spread", type=float, default=0.08)
    parser.add_argument("--drift", type=float, default=0.01)
    parser.add_argument("--noise", type=float, default=0.15)
    parser.add_argument("--no-write", action="store_true", help="print only; do not write results/")
    args = parser.parse_args(argv)

    lines = [
        "# Racing against full evaluation on synthetic landscapes",
        "",
        f"Written by `python benchmarks/racing_simulation.py` ({' '.join(sys.argv[1:]) or 'defaults'}). "
        f"No LM: {args.steps} steps x {args.candidates} candidates, proposal skill = reference "
        f"+ N({args.shift}, {args.spread}), reference 0.5 + {args.drift} per step, per-example noise "
        f"{args.noise}; racing_alpha = {args.alpha}, default schedule (first look after max(10, n/10) "
        "examples, then every n/10). Both modes see the same candidates and scores.",
        "",
    ]
    for n in [int(v) for v in args.n.split(",")]:
        rows = []
        for seed in range(args.seeds):
            landscape = make_landscape(seed=seed, n=n, steps=args.steps, candidates=args.candidates,
                                       shift=args.shift, spread=args.spread, drift=args.drift, noise=args.noise)
            rows.append((seed, run_full(landscape), run_racing(landscape, seed=seed, alpha=args.alpha)))
        lines += [f"## n = {n} training examples, {args.seeds} seeds", "",
                  "| seed | full calls | racing calls | saved | same winner | full winner mean | racing winner mean "
                  "| false stops / at least as good |",
                  "| ---: | ---: | ---: | ---: | :---: | ---: | ---: | ---: |"]
        for seed, full, race in rows:
            lines.append(
                f"| {seed} | {full.metric_calls} | {race.metric_calls} | {full.metric_calls / race.metric_calls:.2f}x "
                f"| {'yes' if race.winner == full.winner else 'no'} | {full.winner_mean:.3f} | {race.winner_mean:.3f} "
                f"| {race.false_stops} / {race.at_least_as_good} |")
        full_calls = sum(f.metric_calls for _, f, _ in rows)
        race_calls = sum(r.metric_calls for _, _, r in rows)
        same = sum(r.winner == f.winner for _, f, r in rows)
        false_stops = sum(r.false_stops for _, _, r in rows)
        good = sum(r.at_least_as_good for _, _, r in rows)
        gap = np.mean([f.winner_mean - r.winner_mean for _, f, r in rows])
        lines += [
            "",
            f"**Summary (n = {n}):** metric calls {full_calls} full vs {race_calls} racing, "
            f"{full_calls / race_calls:.2f}x fewer ({100 * (1 - race_calls / full_calls):.1f}% saved); "
            f"same winner in {same} of {len(rows)} seeds; mean winner training score lower by {gap:.4f} under "
            f"racing; false-stop rate {false_stops} / {good} = {false_stops / max(good, 1):.4f} "
            f"(candidates whose full training mean was at least the best's, raced out; bound alpha = {args.alpha}).",
            "",
        ]
    lines += ["## Machine", "", f"- python: {platform.python_version()}", f"- numpy: {np.__version__}",
              f"- date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC", ""]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
