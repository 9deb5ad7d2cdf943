"""Which candidate a finished OPRO search returns, and why: selection policies over the run record.

The paper returns the best training score (:class:`OnTraining`). Training scores are optimistic (the search selected
on them), so :class:`OnValidation` (``select="validation"``) scores the ``top_k`` best on training on the valset and
returns the best validation mean. The extensions add two more policies: the validation gate
(:mod:`dspy_opro.extensions.val_gate`) and the label-free gate (:mod:`dspy_opro.extensions.label_free`).

A :class:`SelectionPolicy` says which candidates the run scores on the valset, in which order
(:meth:`~SelectionPolicy.validation_phases`), and then decides from the record (:meth:`~SelectionPolicy.decide`);
the run does the scoring. This module imports only the record's models.
"""

from __future__ import annotations

from typing import Protocol

from dspy_opro.state import FELL_BACK, START_ID, Candidate, RunState, Selection, ranked_candidates


class SelectionPolicy(Protocol):
    """How the run chooses what ``compile`` returns."""

    uses_valset: bool
    """Whether it reads the valset (the valset then counts in the resume fingerprint)."""

    def planned_evaluations(self, n_val: int) -> int:
        """At most how many validation evaluations it asks for, with ``n_val`` validation examples."""
        ...

    def validation_phases(self, state: RunState, *, has_valset: bool) -> list[list[Candidate]]:
        """The groups of candidates to score on the valset, one scoring phase each, in order."""
        ...

    def decide(self, state: RunState, *, has_valset: bool) -> Selection:
        """The selection, once the phases were scored (as far as the budget allowed)."""
        ...


def _best(state: RunState) -> Candidate:
    best = state.best()
    if best is None:
        raise ValueError("no candidate is scored, so there is nothing to select")
    return best


class OnTraining:
    """The paper's choice: the best training score."""

    uses_valset = False

    def planned_evaluations(self, n_val: int) -> int:
        return 0

    def validation_phases(self, state: RunState, *, has_valset: bool) -> list[list[Candidate]]:
        return []

    def decide(self, state: RunState, *, has_valset: bool) -> Selection:
        return on_training(_best(state))


class OnValidation:
    """The best validation mean of the ``top_k`` best on training (``select="validation"``).

    Args:
        top_k: How many of the best on training are scored on the valset.
    """

    uses_valset = True

    def __init__(self, *, top_k: int):
        self.top_k = top_k

    def planned_evaluations(self, n_val: int) -> int:
        return self.top_k * n_val

    def validation_phases(self, state: RunState, *, has_valset: bool) -> list[list[Candidate]]:
        return [ranked_candidates(state.candidates)[: self.top_k]]

    def decide(self, state: RunState, *, has_valset: bool) -> Selection:
        best = _best(state)
        contenders = ranked_candidates(state.candidates)[: self.top_k]
        if any(c.val_score is None for c in contenders):
            return Selection(candidate_id=best.id, selected_by="train",
                             reason=f"{FELL_BACK} {100 * (best.score or 0.0):.1f}")
        winner = best_on_validation(contenders)
        return Selection(candidate_id=winner.id, selected_by="validation",
                         reason=f"best validation score {100 * (winner.val_score or 0.0):.1f} of the top "
                                f"{len(contenders)} on training")


def on_training(best: Candidate) -> Selection:
    """The paper's choice: the best training score."""
    return Selection(candidate_id=best.id, selected_by="train",
                     reason=f"best training score {100 * (best.score or 0.0):.1f}")


def best_on_validation(contenders: list[Candidate]) -> Candidate:
    """The best validation mean; ``max`` keeps the first (the best on training) among ties."""
    return max(contenders, key=lambda c: c.val_score if c.val_score is not None else -1.0)


def start_of(state: RunState) -> Candidate:
    """The program as given (candidate 0)."""
    return state.candidates[START_ID]


__all__ = ["OnTraining", "OnValidation", "SelectionPolicy", "best_on_validation", "on_training", "start_of"]
