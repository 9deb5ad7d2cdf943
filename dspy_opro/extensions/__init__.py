"""The options beyond the authors' method, each plugged into the step loop through one seam.

* **Racing** (``racing=True`` or ``racing=Racing(alpha=...)``): a *scoring policy*
  (:class:`dspy_opro.scoring.scorer.ScoringPolicy`) that scores a step's new candidates block by block and stops
  the ones an exact sequential test finds below the bar (:mod:`dspy_opro.extensions.racing`).
* **Hard and diverse exemplars** (``exemplar_selection="hard_diverse"`` or ``HardDiverse(theta=...)``): an
  *exemplar policy* (:class:`dspy_opro.core.exemplars.ExemplarPolicy`) that shows the problems the instructions
  fail, spread out by a determinantal point process (:mod:`dspy_opro.extensions.hard_diverse`).
* **The validation gate** (``val_gate=True`` or ``ValGate(min_delta=...)``): a *selection policy*
  (:class:`dspy_opro.core.selection.SelectionPolicy`) that returns the best candidate only if it beats the program
  as given on the valset (:mod:`dspy_opro.extensions.val_gate`).
* **Label-free OPRO** (``metric=PairwisePreference(judge_model=...)``): an *anchored metric*
  (:class:`dspy_opro.scoring.evaluation.AnchoredMetric`) that judges each candidate's run against the starting
  program's run on the same example, and gates the result on its own scale (:mod:`dspy_opro.extensions.label_free`).

This module holds the options of the first three only: small frozen dataclasses, checked when they are made (the
label-free metric is its own class, ``dspy_opro.PairwisePreference``). Each extension's code is imported when a run
uses it, never by ``import dspy_opro``. An extension may import the subpackages and the selection module; nothing
in the method's core imports an extension module.
"""

from __future__ import annotations

from dataclasses import dataclass

from dspy_opro.checks import require_number


@dataclass(frozen=True)
class Racing:
    """Racing: stop a step's new candidate once an exact sequential test says it is below the bar (the best
    candidate's training mean at the start of the step, raised by the step's leaders; see
    ``dspy_opro.extensions.racing``).

    Args:
        alpha: The test's level: the probability of stopping a candidate at least as good as every bar it raced is
            at most this (for binary scores on any fixed training set, over the seeded order).
    """

    alpha: float = 0.05

    def __post_init__(self) -> None:
        require_number("Racing(alpha=...)", self.alpha, low=0.0, high=1.0, low_open=True, high_open=True,
                       meaning=", for example 0.05")


@dataclass(frozen=True)
class HardDiverse:
    """Hard-and-diverse exemplars: problems the instructions fail, spread out by a DPP. ``theta``: 0 picks for
    diversity alone, 1 for difficulty alone."""

    theta: float = 0.7

    def __post_init__(self) -> None:
        require_number("HardDiverse(theta=...)", self.theta, low=0.0, high=1.0,
                       meaning=" (0 = diversity only, 1 = top-k by difficulty)")


@dataclass(frozen=True)
class ValGate:
    """The validation gate: return the best candidate only if it beats the program as given on the valset by more
    than ``min_delta``, in [0, 1] (0: strictly better)."""

    min_delta: float = 0.0

    def __post_init__(self) -> None:
        require_number("ValGate(min_delta=...)", self.min_delta, low=0.0, high=1.0)
