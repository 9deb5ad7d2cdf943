"""The final-selection decisions, on hand-made run records."""

from dspy_opro import selection
from dspy_opro.record.state import Candidate, Fingerprint, RunState


def record(train: list[float], val: list[float | None]) -> RunState:
    state = RunState(fingerprint=Fingerprint(config="c", trainset="t", valset="v", program="p"), config={},
                     predictors=["p"], train_size=1, val_size=1)
    for i, (score, val_score) in enumerate(zip(train, val, strict=True)):
        state.candidates.append(Candidate(id=i, step=i - 1, predictor=None if i == 0 else "p", instruction=f"i{i}",
                                          instructions={"p": f"i{i}"}, md5=str(i), status="scored", score=score,
                                          val_score=val_score))
    return state


def test_contenders_are_the_top_k_on_training_plus_the_start_for_the_gate():
    state = record([0.2, 0.9, 0.5, 0.9], [None] * 4)
    assert [c.id for c in selection.validation_contenders(state, top_k=2, val_gate=False)] == [1, 3]
    assert [c.id for c in selection.validation_contenders(state, top_k=2, val_gate=True)] == [1, 3, 0]


def test_validation_ties_go_to_the_better_on_training():
    state = record([0.2, 0.9, 0.5, 0.8], [0.1, 0.6, 0.7, 0.7])
    chosen = selection.on_validation(state, state.best(), top_k=3, val_gate=False, min_delta=0.0)
    assert (chosen.candidate_id, chosen.selected_by) == (3, "validation")
    assert chosen.reason == "best validation score 70.0 of the top 3 on training"


def test_gate_needs_more_than_min_delta():
    state = record([0.2, 0.9], [0.5, 0.6])
    assert selection.on_validation(state, state.best(), top_k=1, val_gate=True, min_delta=0.1).candidate_id == 0
    assert selection.on_validation(state, state.best(), top_k=1, val_gate=True, min_delta=0.05).candidate_id == 1


def test_label_free_gate_is_strictly_above_zero():
    state = record([0.5, 0.6], [None, None])
    assert selection.label_free_gate(state.candidates[1], 0.5, "validation").candidate_id == 0
    accepted = selection.label_free_gate(state.candidates[1], 0.55, "validation")
    assert (accepted.candidate_id, accepted.reason) == (1, "mean validation preference +1.00 over the starting "
                                                           "program is above 0")
