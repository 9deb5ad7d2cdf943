"""Beyond the authors: hard-and-diverse exemplars, the validation gate, and label-free OPRO (fakes only)."""

import dspy
import pytest

from dspy_opro import OPROTeleprompter, PairwisePreference, ValGate
from tests.fakes import chat_reply, make_lm, scripted_optimizer, toy_dataset, toy_metric, toy_task_reply, user_text


def program(instruction: str = "Better.") -> dspy.Predict:
    return dspy.Predict(dspy.Signature("question -> answer", instruction))


# ------------------------------------------------------------------------------------------------------------------
# hard_diverse exemplars


def test_hard_diverse_shows_the_always_failed_example():
    task_lm, _ = make_lm(toy_task_reply)
    opt_lm, opt_engine = make_lm(scripted_optimizer(["<INS>Better better better better.</INS>"] * 2
                                                    + ["<INS>Better better better better better.</INS>"] * 2))
    optimizer = OPROTeleprompter(toy_metric, prompt_model=opt_lm, task_model=task_lm, num_steps=2, num_candidates=2,
                                 num_exemplars=2, exemplar_selection="hard_diverse", num_threads=1)
    compiled = optimizer.compile(program(), trainset=toy_dataset(5))
    # Item 4 is answered wrong by every instruction scored before step 1 (skills 1 and 4): the hardest of all.
    step1 = user_text(opt_engine.requests[2])
    assert "\nitem 4\n" in step1
    assert 4 in compiled.opro_run.steps[1].exemplar_indices
    assert len(opt_engine.requests) == 4  # no extra LM calls for the selection


# ------------------------------------------------------------------------------------------------------------------
# val_gate


def gated(replies, valset, *, start="Better.", **kwargs):
    task_lm, task_engine = make_lm(toy_task_reply)
    opt_lm, _ = make_lm(scripted_optimizer(replies))
    kwargs.setdefault("val_gate", True)
    optimizer = OPROTeleprompter(toy_metric, prompt_model=opt_lm, task_model=task_lm, num_steps=1,
                                 num_candidates=len(replies), num_threads=1, **kwargs)
    return optimizer.compile(program(start), trainset=toy_dataset(6), valset=valset), task_engine


def test_val_gate_accepts_a_candidate_that_beats_the_start():
    compiled, engine = gated(["<INS>Better better better.</INS>"], toy_dataset(4, prefix="val"), top_k=1)
    assert compiled.signature.instructions == "Better better better."
    run = compiled.opro_run
    assert run.selection.selected_by == "val_gate"
    assert run.start_val_score == 0.25 and run.candidates[1].val_score == 0.75
    assert len(engine.requests) == 6 * 2 + 4 * 2  # training, then the top-1 and the start once on the valset


def test_val_gate_rejects_better_on_training_but_worse_on_validation():
    compiled, engine = gated(["<INS>Overfit.</INS>", "<INS>Better better.</INS>"], toy_dataset(4, prefix="val"),
                             top_k=2)
    run = compiled.opro_run
    # Training: Overfit 1.0, Better better 2/6, start 1/6; validation: 0.0, 0.5 and 0.25.
    assert compiled.signature.instructions == "Better better."
    assert len(engine.requests) == 6 * 3 + 4 * 3  # top_k=2 plus the start, each once
    compiled, _ = gated(["<INS>Overfit.</INS>"], toy_dataset(4, prefix="val"), top_k=1)
    assert compiled.signature.instructions == "Better."
    assert compiled.opro_run.selection.selected_by == "start"
    assert "does not beat the starting program's 25.0" in compiled.opro_run.selection.reason
    assert run.selection.selected_by == "val_gate"


def test_val_gate_tie_returns_the_start_unchanged():
    # Validation items 0..1: both the start (skill 2) and the candidate (skill 4) answer them all.
    compiled, engine = gated(["<INS>Better better better better.</INS>"], toy_dataset(2, prefix="val"),
                             start="Better better.", top_k=1)
    assert compiled.signature.instructions == "Better better."
    assert compiled.opro_run.selection.selected_by == "start"
    assert compiled.opro_run.candidates[1].val_score == compiled.opro_run.start_val_score == 1.0
    assert len(engine.requests) == 6 * 2 + 2 * 2


def test_val_gate_min_delta():
    compiled, _ = gated(["<INS>Better better.</INS>"], toy_dataset(4, prefix="val"), top_k=1,
                        val_gate=ValGate(min_delta=0.25))
    assert compiled.signature.instructions == "Better."  # 0.5 does not beat 0.25 by more than 0.25


# ------------------------------------------------------------------------------------------------------------------
# label-free OPRO


def trajectories(request) -> tuple[str, str]:
    text = user_text(request)
    a = text.split("[[ ## trajectory_a ## ]]\n", 1)[1].split("[[ ## trajectory_b ## ]]", 1)[0]
    b = text.split("[[ ## trajectory_b ## ]]\n", 1)[1].split("\n\nRespond with", 1)[0]
    return a, b


def content_judge(request) -> str:
    """Prefers the trajectory that did not answer 'wrong'."""
    a, b = trajectories(request)
    preference = 6 if ("wrong" in a and "wrong" not in b) else -6 if ("wrong" in b and "wrong" not in a) else 0
    return chat_reply(rationale="Compared the answers.", preference=preference)


def labelled(n: int, prefix: str = "item") -> list[dspy.Example]:
    return [dspy.Example(question=f"{prefix} {i}", answer=f"LABEL-SECRET-{i}").with_inputs("question")
            for i in range(n)]


def label_free(replies, *, judge=content_judge, valset=None, start="Better better better.", both_orders=False,
               **kwargs):
    task_lm, task_engine = make_lm(toy_task_reply)
    judge_lm, judge_engine = make_lm(judge, model="openai/judge")
    opt_lm, opt_engine = make_lm(scripted_optimizer(replies))
    optimizer = OPROTeleprompter(PairwisePreference(judge_model=judge_lm, both_orders=both_orders),
                                 prompt_model=opt_lm, task_model=task_lm, num_steps=1, num_candidates=len(replies),
                                 num_threads=1, **kwargs)
    compiled = optimizer.compile(program(start), trainset=labelled(6), valset=valset)
    return compiled, task_engine, judge_engine, opt_engine


def test_label_free_accepts_a_good_candidate_with_the_documented_call_counts():
    good = "Better better better better better better."
    compiled, task, judge, _ = label_free([f"<INS>{good}</INS>"], valset=labelled(4, prefix="val"))
    assert compiled.signature.instructions == good
    run = compiled.opro_run
    assert run.candidates[0].score == 0.5
    assert run.candidates[1].score == pytest.approx((3 * 16 + 3 * 10) / 6 / 20)  # +6 on items 3-5, 0 elsewhere
    assert run.selection.selected_by == "val_gate"
    # Task: start and candidate on 6 training items, then start and best on 4 validation items.
    assert len(task.requests) == 6 + 6 + 4 + 4
    # Judge: one call per candidate run: 6 on training, 4 on validation.
    assert len(judge.requests) == 6 + 4


def test_label_free_never_shows_a_label_to_the_judge_and_needs_no_metric():
    compiled, task, judge, opt = label_free(["<INS>Better better better better better better.</INS>"],
                                            valset=labelled(2, prefix="val"))
    assert (len(task.requests), len(judge.requests), len(opt.requests)) == (6 + 6 + 2 + 2, 6 + 2, 1)
    assert not any("LABEL-SECRET" in user_text(r) for r in judge.requests + opt.requests)
    assert compiled.opro_run.candidates[1].score == pytest.approx((3 * 16 + 3 * 10) / 6 / 20)  # judged, not labelled


def test_label_free_rejects_a_harmful_candidate_on_the_gate():
    compiled, *_ = label_free(["<INS>Overfit.</INS>"], valset=labelled(4, prefix="val"))
    run = compiled.opro_run
    assert run.candidates[1].score > 0.5  # better on training ...
    assert compiled.signature.instructions == "Better better better."  # ... but worse on validation
    assert run.selection.selected_by == "start" and "not above 0" in run.selection.reason


def test_label_free_mean_of_exactly_zero_is_rejected():
    # On validation items 0..2 the start (skill 3) and the candidate (skill 6) answer alike: preference 0.
    compiled, *_ = label_free(["<INS>Better better better better better better.</INS>"],
                              valset=labelled(3, prefix="val"))
    assert compiled.signature.instructions == "Better better better."
    assert "preference +0.00" in compiled.opro_run.selection.reason


def test_label_free_both_orders_cancels_a_position_biased_judge():
    def biased(request):  # always says B is worse, whatever is in it
        return chat_reply(rationale="A looks better.", preference=-5)

    compiled, _, judge, _ = label_free(["<INS>Better.</INS>", "<INS>Better better better better.</INS>"],
                                       judge=biased, both_orders=True)
    assert [c.score for c in compiled.opro_run.candidates] == [0.5, 0.5, 0.5]
    assert len(judge.requests) == 2 * 2 * 6  # two candidates, two orders, six examples
    assert compiled.signature.instructions == "Better better better."


def test_label_free_no_op_candidate_is_never_run():
    compiled, task, judge, _ = label_free(["<INS>Better better better.</INS>"])
    assert len(task.requests) == 6  # the start only
    assert judge.requests == []
    assert compiled.opro_run.steps[0].replies[0].fate == "duplicate"


def test_label_free_without_valset_gates_on_training_with_a_warning():
    with pytest.warns(UserWarning, match="gates on the training examples"):
        compiled, *_ = label_free(["<INS>Better better better better better better.</INS>"])
    assert compiled.signature.instructions == "Better better better better better better."


def test_val_gate_that_cannot_finish_validation_returns_the_start():
    compiled, engine = gated(["<INS>Better better better.</INS>"], toy_dataset(4, prefix="val"), top_k=1,
                             max_metric_calls=14)
    assert len(engine.requests) == 14
    assert compiled.signature.instructions == "Better."
    assert compiled.opro_run.selection.selected_by == "start"
    assert "gate could not pass a candidate" in compiled.opro_run.selection.reason


def test_label_free_refuses_select_and_val_gate():
    judge_lm, _ = make_lm(content_judge)
    for option in ({"select": "validation"}, {"val_gate": True}):
        with pytest.raises(ValueError, match="label-free OPRO .* selects by its own gate"):
            OPROTeleprompter(PairwisePreference(judge_model=judge_lm), **option)


def test_label_free_judge_sees_both_trajectories_step_by_step():
    _, _, judge, _ = label_free(["<INS>Better better better better better better.</INS>"],
                                valset=labelled(2, prefix="val"))
    assert len(judge.requests) == 6 + 2
    for request in judge.requests:
        anchor, candidate = trajectories(request)
        assert anchor.startswith("Step 1") and candidate.startswith("Step 1")
        assert "question" in anchor and "question" in candidate
