"""Racing variants on the synthetic landscapes of ``racing_simulation.py``: which schedule saves most, safely.

No language model. Each variant is :class:`dspy_opro.extensions.racing.StepRace` with some options changed; every
variant sees the same landscapes (``racing_simulation.held_out`` and ``racing_simulation.drifting``) and the same
example orders. Per variant: the ratio full calls / racing calls over all seeds and on the worst seed, whether the
returned candidate's training mean is full evaluation's, the wrong drops among the protected proposals, and the
guarantee's stress test (a proposal tied for the best of its step, dropped how often out of ``--trials``).

Two rows are bounds, not schedules. The oracle knows each step's best proposal and, when it raises the bar,
scores it first: what a perfect choice of leader would cost with the library's test. The clairvoyant knows, besides,
every proposal's training total ``T``, and stops it by a likelihood-ratio test of ``T`` against the bar's total ``t``
(Wald's sequential test with the alternative known exactly, on the walk without replacement, stopping when the ratio
reaches ``1 / alpha``: by Ville's inequality it drops a proposal whose total is ``t`` with probability at most
``alpha``). With the alternative known this test needs about the fewest examples any level-``alpha`` test can, so
where the clairvoyant stays under a ratio, no schedule that keeps the guarantee gets far above it (a near-bound:
the threshold ``1 / alpha`` is conservative, and on one order the library's exact test can do a little better).

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

from dspy_opro.extensions.racing import RacingSchedule, StepRace, example_order  # noqa: E402

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
    "bound: the oracle, and each proposal's total known (clairvoyant)": {"clairvoyant": True},
}


def _schedule(n: int, options: dict[str, Any]) -> RacingSchedule:
    first, block = options.pop("first", None), options.pop("block", None)
    return RacingSchedule.build(n, min_examples=first or max(5, -(-n // 20)), block_size=block)


def run(landscape: Landscape, *, seed: int, alpha: float, options: dict[str, Any]) -> tuple[int, float, int, int]:
    """Race a landscape step by step: metric calls, the winner's training mean, wrong drops, protected.

    With ``oracle``, each step's best proposal (known from the landscape) is scored in full first when it raises
    the bar and the others race it without leaders: what a perfect choice of leader would cost. With
    ``clairvoyant``, each step is :func:`clairvoyant_step`.
    """
    options = dict(options)
    n = len(landscape.start)
    clairvoyant = options.pop("clairvoyant", False)
    oracle = options.pop("oracle", False)
    schedule = _schedule(n, options)
    order = example_order(n, seed=seed)
    scored, calls, wrong, protected = [landscape.start], n, 0, 0
    for proposals in landscape.steps:
        incumbent = max(scored, key=lambda s: s.mean())
        if clairvoyant:
            step_calls, stopped = clairvoyant_step(proposals, incumbent, order=order, alpha=alpha)
        elif oracle and proposals.mean(axis=1).max() <= incumbent.mean():  # no proposal raises the bar: no leader
            step_calls, stopped = race_step(proposals, incumbent, order=order, schedule=schedule, alpha=alpha,
                                            seed=seed, options={**options, "leaders": 0})
        elif oracle:
            best = int(np.argmax(proposals.mean(axis=1)))
            rest = np.delete(proposals, best, axis=0)
            step_calls, stopped = race_step(rest, proposals[best], order=order, schedule=schedule, alpha=alpha,
                                            seed=seed, options={**options, "leaders": 0})
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


def clairvoyant_step(proposals: np.ndarray, incumbent: np.ndarray, *, order: list[int],
                     alpha: float) -> tuple[int, set[int]]:
    """One step of the clairvoyant bound, as :func:`race_step` reports it: the bar is the better of the incumbent
    and the step's best from the start, and every proposal below it stops where :func:`likelihood_ratio_stop`,
    knowing its total, first rejects ``T >= bar`` (so the step's best runs in full only when it raises the bar)."""
    n = len(incumbent)
    bar = int(max(proposals.sum(axis=1).max(), incumbent.sum()))
    taken = [likelihood_ratio_stop(scores, order, total=int(scores.sum()), bar=bar, alpha=alpha)
             for scores in proposals]
    return sum(taken), {cid for cid, examples in enumerate(taken, start=1) if examples < n}


def likelihood_ratio_stop(scores: np.ndarray, order: list[int], *, total: int, bar: int, alpha: float) -> int:
    """Examples a proposal with 0/1 ``scores`` runs before Wald's test of the total ``bar`` against the alternative
    ``total`` (the clairvoyant passes the true one) rejects ``T >= bar`` at level ``alpha`` (``len(scores)``: never,
    it runs in full). Each example's likelihood under a total is that of the next draw from the urn of what is
    left; a draw impossible at the bar's total is a certain rejection."""
    n = len(scores)
    if total >= bar:
        return n
    threshold, log_ratio, right = np.log(1 / alpha), 0.0, 0
    for seen, example in enumerate(order):
        left = n - seen
        if scores[example]:
            under_total, under_bar = (total - right) / left, (bar - right) / left
            right += 1
        else:
            wrong = seen - right
            under_total, under_bar = (n - total - wrong) / left, (n - bar - wrong) / left
        if under_total <= 0:  # impossible at the alternative: it cannot beat the bar's total
            return n
        if under_bar <= 0:  # impossible at the bar's total: a certain rejection
            return seen + 1
        log_ratio += float(np.log(under_total / under_bar))
        if log_ratio >= threshold:
            return seen + 1
    return n


def stress(*, trials: int, n: int, alpha: float, options: dict[str, Any]) -> int:
    """``racing_simulation.guarantee``'s steps: how often the proposal tied for the step's best is dropped."""
    options = dict(options)
    if options.pop("oracle", False) or options.pop("clairvoyant", False):
        return -1  # a bound, not a schedule: no stress test
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
