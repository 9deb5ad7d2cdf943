"""The selection policies' decisions, on hand-made run records."""

from dspy_opro.core import selection
from dspy_opro.extensions.label_free import LabelFreeGate, label_free_gate
from dspy_opro.extensions.val_gate import ValGatePolicy
from dspy_opro.state import Candidate, Fingerprint, RunState


def record(train: list[float], val: list[float | None]) -> RunState:
    state = RunState(fingerprint=Fingerprint(config="c", trainset="t", valset="v", program="p"), config={},
                     predictors=["p"], train_size=1, val_size=1)
    for i, (score, val_score) in enumerate(zip(train, val, strict=True)):
        state.candidates.append(Candidate(id=i, step=i - 1, predictor=None if i == 0 else "p", instruction=f"i{i}",
                                          instructions={"p": f"i{i}"}, md5=str(i), status="scored", score=score,
                                          val_score=val_score))
    return state


def test_validation_phases_are_the_top_k_on_training_plus_the_start_for_the_gate():
    state = record([0.2, 0.9, 0.5, 0.9], [None] * 4)
    validation = selection.OnValidation(top_k=2)
    assert [[c.id for c in group] for group in validation.validation_phases(state, has_valset=True)] == [[1, 3]]
    gate = ValGatePolicy(top_k=2, min_delta=0.0)
    assert [[c.id for c in group] for group in gate.validation_phases(state, has_valset=True)] == [[1, 3, 0]]
    assert selection.OnTraining().validation_phases(state, has_valset=True) == []
    assert (validation.planned_evaluations(10), gate.planned_evaluations(10)) == (20, 30)


def test_validation_ties_go_to_the_better_on_training():
    state = record([0.2, 0.9, 0.5, 0.8], [0.1, 0.6, 0.7, 0.7])
    chosen = selection.OnValidation(top_k=3).decide(state, has_valset=True)
    assert (chosen.candidate_id, chosen.selected_by) == (3, "validation")
    assert chosen.reason == "best validation score 70.0 of the top 3 on training"


def test_validation_that_could_not_finish_falls_back_to_training():
    state = record([0.2, 0.9, 0.5], [0.1, None, 0.7])
    chosen = selection.OnValidation(top_k=2).decide(state, has_valset=True)
    assert (chosen.candidate_id, chosen.selected_by) == (1, "train")
    assert chosen.reason.startswith("validation could not be completed")


def test_gate_needs_more_than_min_delta():
    state = record([0.2, 0.9], [0.5, 0.6])
    assert ValGatePolicy(top_k=1, min_delta=0.1).decide(state, has_valset=True).candidate_id == 0
    assert ValGatePolicy(top_k=1, min_delta=0.05).decide(state, has_valset=True).candidate_id == 1


def test_label_free_gate_is_strictly_above_zero():
    state = record([0.5, 0.6], [None, None])
    assert label_free_gate(state.candidates[1], 0.5, "validation").candidate_id == 0
    accepted = label_free_gate(state.candidates[1], 0.55, "validation")
    assert (accepted.candidate_id, accepted.reason) == (1, "mean validation preference +1.00 over the starting "
                                                           "program is above 0")
    phases = LabelFreeGate().validation_phases(state, has_valset=True)
    assert [[c.id for c in group] for group in phases] == [[0], [1]]  # the anchors first
