"""The validation gate: return the best candidate only if it beats the program as given on held-out examples.

OPRO selects instructions by their training scores, and the optimizer model has seen training problems, so the best
training score is optimistic. :class:`ValGatePolicy` (``val_gate=True`` or ``val_gate=ValGate(min_delta=...)``)
scores the ``top_k`` best on training and the program as given on the valset, and returns the best validation mean
only if it beats the program as given by more than ``min_delta``; otherwise the program comes back unchanged. If
the validation scoring cannot be completed (the budget ran out, or LM failures), the gate cannot pass anything.
"""

from __future__ import annotations

from dspy_opro.core.selection import best_on_validation, start_of
from dspy_opro.state import START_ID, Candidate, RunState, Selection, ranked_candidates


class ValGatePolicy:
    """The selection policy of ``val_gate``: the ``top_k`` best on training are scored on the valset, and the
    winner must beat the program as given by more than ``min_delta``, in [0, 1]."""

    uses_valset = True

    def __init__(self, *, top_k: int, min_delta: float):
        self.top_k, self.min_delta = top_k, min_delta

    def planned_evaluations(self, n_val: int) -> int:
        return (self.top_k + 1) * n_val

    def _contenders(self, state: RunState) -> list[Candidate]:
        """The ``top_k`` best on training (earliest first among ties), plus the program as given."""
        contenders = ranked_candidates(state.candidates)[: self.top_k]
        start = start_of(state)
        if start not in contenders:
            contenders.append(start)
        return contenders

    def validation_phases(self, state: RunState, *, has_valset: bool) -> list[list[Candidate]]:
        return [self._contenders(state)]

    def decide(self, state: RunState, *, has_valset: bool) -> Selection:
        contenders = self._contenders(state)
        start = start_of(state)
        if any(c.val_score is None for c in contenders):
            return Selection(candidate_id=START_ID, selected_by="start",
                             reason="validation could not be completed (budget or LM failures), so the gate could not "
                                    "pass a candidate; returning the program unchanged")
        winner = best_on_validation(contenders[: self.top_k])
        won, lost = 100 * (winner.val_score or 0.0), 100 * (start.val_score or 0.0)
        if winner.id != START_ID and (winner.val_score or 0.0) > (start.val_score or 0.0) + self.min_delta:
            return Selection(candidate_id=winner.id, selected_by="val_gate",
                             reason=f"validation {won:.1f} beats the starting program's {lost:.1f} by more than "
                                    f"min_delta={self.min_delta}")
        return Selection(candidate_id=START_ID, selected_by="start",
                         reason=f"the best candidate's validation {won:.1f} does not beat the starting program's "
                                f"{lost:.1f} by more than min_delta={self.min_delta}; returning the program unchanged")
