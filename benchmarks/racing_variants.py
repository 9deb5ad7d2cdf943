"""Racing variants on the synthetic landscapes of ``racing_simulation.py``: which schedule saves most, safely.

No language model. Each variant is :class:`dspy_opro.extensions.racing.StepRace` with some options changed; every
variant sees the same landscapes (``racing_simulation.held_out`` and ``racing_simulation.drifting``) and the same
example orders. Per variant: the ratio full calls / racing calls over all seeds and on the worst seed, whether the
returned candidate's training mean is full evaluation's, the wrong drops among the protected proposals, and the
guarantee's stress test (a proposal tied for the best of its step, dropped how often out of ``--trials``).

    python benchmarks/racing_variants.py --seeds 20 --trials 2000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from racing_simulation import Landscape, drifting, held_out, race_step, wrong_drops  # noqa: E402

from dspy_opro.extensions.racing import StepRace  # noqa: E402
from dspy_opro.extensions.racing_stats import RacingSchedule, example_order  # noqa: E402

VARIANTS: dict[str, dict[str, Any]] = {
    "a front-runner leads at once (scouts=1)": {"scouts": 1},
    "2 scouts": {"scouts": 2},
    "3 scouts": {"scouts": 3},
    "4 scouts (adopted)": {},
    "4 scouts, first lead after look 2": {"lead_after": 2},
    "4 scouts, first lead after look 4": {"lead_after": 4},
    "4 scouts, leads below the bar's rate too": {"lead_rule": "always"},
    "4 scouts, one lead": {"leaders": 1},
    "4 scouts, three leads": {"leaders": 3},
    "4 scouts, spending power 0.25": {"power": 0.25},
    "4 scouts, spending power 1": {"power": 1.0},
    "4 scouts, first look after 3": {"first": 3},
    "4 scouts, a look after every example": {"block": 1},
    "bound: the step's best runs in full first (an oracle)": {"oracle": True},
}


def _schedule(n: int, options: dict[str, Any]) -> RacingSchedule:
    first, block = options.pop("first", None), options.pop("block", None)
    return RacingSchedule.build(n, min_examples=first or max(5, -(-n // 20)), block_size=block)


def run(landscape: Landscape, *, seed: int, alpha: float, options: dict[str, Any]) -> tuple[int, float, int, int]:
    """Race a landscape step by step: metric calls, the winner's training mean, wrong drops, protected.

    With ``oracle``, each step's best proposal (known from the landscape) is scored in full first and the others
    race the better of it and the incumbent without leaders: what a perfect choice of leader would cost.
    """
    options = dict(options)
    n = len(landscape.start)
    oracle = options.pop("oracle", False)
    schedule = _schedule(n, options)
    order = example_order(n, seed=seed)
    scored, calls, wrong, protected = [landscape.start], n, 0, 0
    for proposals in landscape.steps:
        incumbent = max(scored, key=lambda s: s.mean())
        if oracle:
            best = int(np.argmax(proposals.mean(axis=1)))
            rest = np.delete(proposals, best, axis=0)
            bar = proposals[best] if proposals[best].mean() > incumbent.mean() else incumbent
            step_calls, stopped = race_step(rest, bar, order=order, schedule=schedule, alpha=alpha, seed=seed,
                                            options={**options, "leaders": 0})
            # Back to the proposals' ids (1..k): the best is never stopped.
            stopped = {cid + (cid > best) for cid in stopped}
            step_calls += n
        else:
            step_calls, stopped = race_step(proposals, incumbent, order=order, schedule=schedule, alpha=alpha,
                                            seed=seed, options=options)
        step_protected, step_wrong = wrong_drops(proposals, incumbent, stopped)
        calls, protected, wrong = calls + step_calls, protected + step_protected, wrong + step_wrong
        scored += [proposals[cid - 1] for cid in range(1, len(proposals) + 1) if cid not in stopped]
    return calls, max(s.mean() for s in scored), wrong, protected


def stress(*, trials: int, n: int, alpha: float, options: dict[str, Any]) -> int:
    """``racing_simulation.guarantee``'s steps: how often the proposal tied for the step's best is dropped."""
    options = dict(options)
    if options.pop("oracle", False):
        return -1  # not a schedule: no stress test
    schedule = _schedule(n, options)
    dropped = 0
    for trial in range(trials):
        rng = np.random.default_rng([trial, 7])
        totals = [int(0.7 * n), int(0.7 * n), *rng.integers(int(0.4 * n), int(0.7 * n) + 1, size=6)]
        proposals = np.zeros((8, n))
        for row, total in zip(proposals, totals, strict=True):
            row[rng.choice(n, size=total, replace=False)] = 1.0
        incumbent = np.zeros(n)
        incumbent[rng.choice(n, size=int(0.6 * n), replace=False)] = 1.0
        step = StepRace(incumbent=list(incumbent), entrants=list(range(1, 9)), order=example_order(n, seed=trial),
                        schedule=schedule, alpha=alpha, seed=trial, incumbent_id=0, **options)
        while rounds := step.next_round():
            for cid, examples in rounds.items():
                for e in examples:
                    step.record(cid, e, float(proposals[cid - 1][e]))
        dropped += step.decision(1).action == "stop"
    return dropped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--variants", type=str, default="", help="comma-separated indexes into VARIANTS (all)")
    args = parser.parse_args(argv)
    names = list(VARIANTS)
    chosen = [names[int(i)] for i in args.variants.split(",")] if args.variants else names
    families = {"held-out 120": [held_out(seed=s) for s in range(args.seeds)]}
    for n in (50, 100, 200):
        families[f"drifting {n}"] = [drifting(seed=s, n=n, steps=5, candidates=8, shift=-0.1, spread=0.12, drift=0.05)
                                     for s in range(args.seeds)]
    full = {f: [len(ls.start) * (1 + sum(len(p) for p in ls.steps)) for ls in lss] for f, lss in families.items()}
    best = {f: [max([ls.start.mean(), *(p.mean(axis=1).max() for p in ls.steps)]) for ls in lss]
            for f, lss in families.items()}
    print("| variant | " + " | ".join(f"{f}: ratio (worst)" for f in families) + " | winner = full's | wrong drops "
          "| stress drops |")
    print("| --- |" + " ---: |" * (len(families) + 3))
    for name in chosen:
        cells, same, wrong, protected = [], 0, 0, 0
        for f, lss in families.items():
            outs = [run(ls, seed=s, alpha=args.alpha, options=VARIANTS[name]) for s, ls in enumerate(lss)]
            calls = [o[0] for o in outs]
            worst = min(a / b for a, b in zip(full[f], calls, strict=True))
            cells.append(f"{sum(full[f]) / sum(calls):.2f}x ({worst:.2f}x)")
            same += sum(abs(o[1] - b) < 1e-12 for o, b in zip(outs, best[f], strict=True))
            wrong += sum(o[2] for o in outs)
            protected += sum(o[3] for o in outs)
        dropped = stress(trials=args.trials, n=100, alpha=args.alpha, options=VARIANTS[name]) if args.trials else 0
        stressed = f"{dropped} of {args.trials} ({dropped / max(1, args.trials):.4f})" if dropped >= 0 else "n/a"
        print(f"| {name} | " + " | ".join(cells) + f" | {same} of {sum(len(v) for v in families.values())} "
              f"| {wrong} of {protected} | {stressed} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
