"""Racing as it was in 0.2 ("today's racing" of issue 24), kept runnable for the benchmarks' comparison only.

Each new candidate raced the best at the start of its step alone, with the paired sequential sign test spending
the level linearly, a first look after ``max(10, ceil(n / 10))`` examples and one every ``ceil(n / 10)``; no
leaders, no threshold test. It is :class:`dspy_opro.extensions.racing.StepRace` with those options (the sign
test's coins and dynamic programme are unchanged), plugged in with :func:`legacy_racing`:

    with legacy_racing():
        OPROTeleprompter(metric, racing=True, ...).compile(...)

Not part of the library: the benchmarks import it to measure the old schedule against the new one in one run.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence

from dspy_opro.extensions import racing
from dspy_opro.extensions.racing import RacingSchedule
from dspy_opro.state import Candidate


def legacy_schedule(n: int) -> RacingSchedule:
    """The 0.2 looks: first after ``max(10, ceil(n / 10))`` examples, then every ``ceil(n / 10)``."""
    return RacingSchedule.build(n, min_examples=max(10, math.ceil(n / 10)), block_size=math.ceil(n / 10))


LEGACY_OPTIONS = {"test": "sign", "power": 1.0, "leaders": 0}


class LegacyRacingPolicy(racing.RacingPolicy):
    """The 0.2 scoring policy: every new candidate races the incumbent alone with the linear sign test."""

    def plan(self, candidates: Sequence[Candidate], baseline: Candidate,
             decided: Sequence[Candidate] = ()) -> racing.RacingPlan:
        n = len(baseline.scores)
        return racing.RacingPlan(candidates, baseline, decided=decided, alpha=self.alpha, seed=self.seed,
                                 schedule=legacy_schedule(n), **LEGACY_OPTIONS)


@contextlib.contextmanager
def legacy_racing() -> Iterator[None]:
    """Within the block, ``racing=True`` compiles with :class:`LegacyRacingPolicy`."""
    saved = racing.RacingPolicy
    racing.RacingPolicy = LegacyRacingPolicy  # type: ignore[misc]
    try:
        yield
    finally:
        racing.RacingPolicy = saved  # type: ignore[misc]
