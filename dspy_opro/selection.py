"""Which candidate a finished OPRO search returns, and why: pure decisions over the run record.

The paper returns the best training score. Training scores are optimistic (the search selected on them), so two
options look at held-out data: ``select="validation"`` returns the best validation mean among the ``top_k`` on
training, and ``val_gate`` returns that candidate only if it beats the starting program on the valset by more than
``min_delta``. Label-free OPRO gates the same way on its preference scale: the best candidate must be preferred
over the starting program, on average, by more than 0. The run scores what these functions ask for on the valset;
they only decide.
"""

from __future__ import annotations

from dspy_opro.record.state import START_ID, Candidate, RunState, Selection, ranked_candidates


def on_training(best: Candidate) -> Selection:
    """The paper's choice: the best training score."""
    return Selection(candidate_id=best.id, selected_by="train", reason=f"best training score {100 * best.score:.1f}")


def validation_contenders(state: RunState, *, top_k: int, val_gate: bool) -> list[Candidate]:
    """The ``top_k`` best on training (earliest first among ties), plus the starting program for the gate."""
    contenders = ranked_candidates(state.candidates)[:top_k]
    start = state.candidates[START_ID]
    if val_gate and start not in contenders:
        contenders.append(start)
    return contenders


def on_validation(state: RunState, best: Candidate, *, top_k: int, val_gate: bool, min_delta: float) -> Selection:
    """Decide after :func:`validation_contenders` were scored on the valset (as far as the budget allowed)."""
    contenders = validation_contenders(state, top_k=top_k, val_gate=val_gate)
    start = state.candidates[START_ID]
    if any(c.val_score is None for c in contenders):
        if val_gate:  # the gate could not check the candidate: keep the program as it was
            return Selection(candidate_id=START_ID, selected_by="start",
                             reason="validation could not be completed (budget or LM failures), so the gate could not "
                                    "pass a candidate; returning the program unchanged")
        return Selection(candidate_id=best.id, selected_by="train",
                         reason="validation could not be completed (budget or LM failures); fell back to the best "
                                f"training score {100 * best.score:.1f}")
    ranked = contenders[:top_k]
    winner = max(ranked, key=lambda c: c.val_score)  # max keeps the first (best on training) among ties
    if not val_gate:
        return Selection(candidate_id=winner.id, selected_by="validation",
                         reason=f"best validation score {100 * winner.val_score:.1f} of the top {len(ranked)} on "
                                "training")
    if winner.id != START_ID and winner.val_score > start.val_score + min_delta:
        return Selection(candidate_id=winner.id, selected_by="val_gate",
                         reason=f"validation {100 * winner.val_score:.1f} beats the starting program's "
                                f"{100 * start.val_score:.1f} by more than min_delta={min_delta}")
    return Selection(candidate_id=START_ID, selected_by="start",
                     reason=f"the best candidate's validation {100 * winner.val_score:.1f} does not beat the starting "
                            f"program's {100 * start.val_score:.1f} by more than min_delta={min_delta}; returning "
                            "the program unchanged")


def label_free_gate(best: Candidate, gate_score: float | None, where: str) -> Selection:
    """Accept ``best`` only if its mean preference over the starting program (``20 * score - 10``) is above 0."""
    if best.id == START_ID:
        return Selection(candidate_id=START_ID, selected_by="start",
                         reason="no candidate was preferred over the starting program on training")
    if gate_score is None:
        return Selection(candidate_id=START_ID, selected_by="start",
                         reason="the gate could not be evaluated (budget or LM failures)")
    mean_preference = 20 * gate_score - 10
    if mean_preference > 0:
        return Selection(candidate_id=best.id, selected_by="val_gate",
                         reason=f"mean {where} preference {mean_preference:+.2f} over the starting program is above 0")
    return Selection(candidate_id=START_ID, selected_by="start",
                     reason=f"mean {where} preference {mean_preference:+.2f} over the starting program is not above "
                            "0; returning the program unchanged")
