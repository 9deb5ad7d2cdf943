"""``initial_instructions``: extra starting instructions scored at step -1 with the program's own, as the authors'
list of initial instructions is.

The task model is the simulated OpenAI-compatible endpoint (:class:`dspy_opro.testing.SimulatedEndpoint`) reached
through LiteLLM, so request counts are taken from its request log and expected scores from the simulated task
model's own rule (:func:`dspy_opro.testing.answers_correctly`), not from the run's counters. Where a test needs
scripted optimizer replies or a two-predictor program, the models are DSPy custom engines (``tests/fakes.py``).
The byte-for-byte check against the authors' meta-prompt uses their golden output (``tests/golden``).
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import re
import threading
from collections import Counter
from pathlib import Path

import dspy
import pytest

from dspy_opro import OPROTeleprompter, PairwisePreference
from dspy_opro.core.exemplars import draw_exemplar_indices, predictor_history
from dspy_opro.core.meta_prompt import gen_meta_prompt
from dspy_opro.core.settings import Models, recorded_settings
from dspy_opro.errors import StateFileError
from dspy_opro.testing import FaultConfig, SimulatedEndpoint, answers_correctly, simulated_dataset, simulated_metric
from tests.fakes import (
    chat_reply,
    field_value,
    instruction_of,
    make_lm,
    scripted_optimizer,
    toy_dataset,
    toy_metric,
    toy_task_reply,
    user_text,
)

START = "Given the fields `question`, produce the fields `answer`."
OBJECTIVE = "your objective is:"
STEP_BY_STEP = "Let's think step by step."
CAREFUL = "Read the problem carefully and check the answer."
STRONG = "Work step by step, read the problem carefully and verify the result."


def _lm(endpoint: SimulatedEndpoint, name: str) -> dspy.LM:
    return dspy.LM(f"openai/{name}", api_base=endpoint.base_url, api_key="x", engine="litellm", cache=False,
                   num_retries=0)


def _compile(endpoint: SimulatedEndpoint, trainset, *, valset=None, program=None, **options) -> dspy.Module:
    optimizer = OPROTeleprompter(simulated_metric, prompt_model=_lm(endpoint, "sim-opt"),
                                 task_model=_lm(endpoint, "sim-task"), **options)
    return optimizer.compile(program or dspy.Predict("question -> answer"), trainset=trainset, valset=valset)


def _normalize(text: str) -> str:
    return " ".join(text.split())


def _pair(record) -> tuple[str, str]:
    """(instruction, question) of one task request, as the task model received them."""
    system = "\n".join(m["content"] for m in record.messages if m.get("role") == "system")
    question = re.search(r"\[\[ ## question ## \]\]\n(.*?)\n\n", record.messages[-1]["content"], re.S)
    return _normalize(system.split(OBJECTIVE, 1)[1]), question.group(1).strip()


def _task(endpoint: SimulatedEndpoint) -> list:
    return [r for r in endpoint.requests if r.kind == "task"]


def _expected_score(instruction: str, examples) -> float:
    """The training score the simulated task model gives ``instruction``: its own rule, not the run's record."""
    return sum(answers_correctly(instruction, ex.question) for ex in examples) / len(examples)


@pytest.fixture
def endpoint():
    with SimulatedEndpoint() as ep:
        yield ep


# ---------------------------------------------------------------------------------------------- step -1 scoring


def test_each_initial_instruction_runs_once_per_example_with_the_start(endpoint) -> None:
    """Start + 2 initial instructions on 6 examples = 18 task requests at step -1, one per (instruction, question),
    in one phase (with one thread: the start's 6, then each instruction's 6); each is a step -1 candidate."""
    train = simulated_dataset(6)
    compiled = _compile(endpoint, train, initial_instructions=[STEP_BY_STEP, CAREFUL], num_steps=0, num_threads=1)
    run = compiled.opro_run
    task = _task(endpoint)
    assert len(task) == (1 + 2) * 6 == len(endpoint.requests)
    questions = [ex.question for ex in train]
    assert [_pair(r) for r in task] == [(ins, q) for ins in (START, STEP_BY_STEP, CAREFUL) for q in questions]

    assert [(c.id, c.step, c.predictor, c.instruction, c.status) for c in run.candidates] == [
        (0, -1, None, "", "scored"),
        (1, -1, "self", STEP_BY_STEP, "scored"),
        (2, -1, "self", CAREFUL, "scored"),
    ]
    assert run.candidates[1].instructions == {"self": STEP_BY_STEP}
    assert [c.score for c in run.candidates] == [_expected_score(ins, train) for ins in (START, STEP_BY_STEP, CAREFUL)]
    assert run.metric_calls == 18


def test_the_start_and_the_initial_instructions_are_scored_in_one_phase_one_evaluate_call_each() -> None:
    """Step -1 is one scoring phase: a ``dspy.Evaluate`` call per candidate, the start's first, each on every thread."""
    order: list[str] = []
    evaluations: list[str] = []

    class Evaluations(dspy.utils.callback.BaseCallback):
        def on_evaluate_start(self, call_id, instance, inputs):
            evaluations.append(inputs["program"].signature.instructions)

    def task(request) -> str:
        order.append(instruction_of(request))
        return toy_task_reply(request)

    task_lm, engine = make_lm(task)
    optimizer = OPROTeleprompter(toy_metric, prompt_model=task_lm, task_model=task_lm, num_steps=0, num_threads=4,
                                 initial_instructions=["Better."])
    with dspy.context(callbacks=[Evaluations()]):
        run = optimizer.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(4)).opro_run
    start = "Given the fields `question`, produce the fields `answer`."
    assert evaluations == [start, "Better."]
    assert order == [start] * 4 + ["Better."] * 4
    assert [c.score for c in run.candidates] == [0.0, 0.25] and len(engine.requests) == 8
    assert [phase.name for phase in run.phases] == ["step -1 scoring", "selection"]


def test_the_meta_prompt_shows_each_initial_instruction_with_its_score(endpoint) -> None:
    train = simulated_dataset(10)
    compiled = _compile(endpoint, train, initial_instructions=[STEP_BY_STEP, CAREFUL], num_steps=1,
                        num_candidates=2, num_exemplars=0)
    run = compiled.opro_run
    opro = [r for r in endpoint.requests if r.kind == "opro"]
    assert len(opro) == 1 and opro[0].messages[-1]["content"] == run.steps[0].meta_prompt
    meta_prompt = run.steps[0].meta_prompt
    for instruction in (START, STEP_BY_STEP, CAREFUL):
        score = round(100 * _expected_score(instruction, train))
        assert f"\ntext:\n{instruction}\nscore:\n{score}\n" in meta_prompt
    assert predictor_history(run, "self")[:3] == [
        (START, run.candidates[0].score, -1), (STEP_BY_STEP, run.candidates[1].score, -1),
        (CAREFUL, run.candidates[2].score, -1)]
    # Step -1: 3 x 10; step 0: the new instructions, 10 each.
    new = [c for c in run.candidates if c.step == 0 and c.status == "scored"]
    assert len(_task(endpoint)) == 30 + 10 * len(new)


def test_a_duplicate_initial_instruction_is_recorded_and_not_scored(endpoint) -> None:
    train = simulated_dataset(5)
    compiled = _compile(endpoint, train, initial_instructions=[START, STEP_BY_STEP, CAREFUL, STEP_BY_STEP],
                        num_steps=0)
    run = compiled.opro_run
    assert [(c.id, c.status, c.reason) for c in run.candidates] == [
        (0, "scored", None),
        (1, "skipped", "duplicate of the program's own instruction"),
        (2, "scored", None),
        (3, "scored", None),
        (4, "skipped", "duplicate of candidate 2, an earlier initial instruction"),
    ]
    assert run.candidates[1].scores == [] and run.candidates[4].scores == []
    assert Counter(_pair(r)[0] for r in _task(endpoint)) == {START: 5, STEP_BY_STEP: 5, CAREFUL: 5}
    # The history shows each instruction once.
    assert [entry[0] for entry in predictor_history(run, "self")] == [START, STEP_BY_STEP, CAREFUL]


def test_a_proposal_equal_to_an_initial_instruction_is_a_duplicate() -> None:
    task_lm, task_engine = make_lm(toy_task_reply)
    opt_lm, _ = make_lm(scripted_optimizer([f"<INS>{STEP_BY_STEP}</INS>", "<INS>Better better.</INS>"]))
    optimizer = OPROTeleprompter(toy_metric, prompt_model=opt_lm, task_model=task_lm, num_steps=1, num_candidates=2,
                                 num_exemplars=0, num_threads=1, initial_instructions=[STEP_BY_STEP])
    run = optimizer.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(4)).opro_run
    assert [(r.instruction, r.fate, r.candidate_id) for r in run.steps[0].replies] == [
        (STEP_BY_STEP, "duplicate", 1), ("Better better.", "new", 2)]
    assert len(task_engine.requests) == 4 * 3  # start, the initial instruction, "Better better."


# ------------------------------------------------------------------------------------------ several predictors


class _TwoSteps(dspy.Module):
    def __init__(self) -> None:
        super().__init__()
        self.draft = dspy.Predict("question -> draft")
        self.answer = dspy.Predict("question, draft -> answer")

    def forward(self, question: str) -> dspy.Prediction:
        return self.answer(question=question, draft=self.draft(question=question).draft)


def test_a_mapping_gives_each_predictor_its_own_initial_instructions() -> None:
    task_lm, task_engine = make_lm(toy_task_reply)
    opt_lm, opt_engine = make_lm(scripted_optimizer(["<INS>Better.</INS>"]))
    program = _TwoSteps()
    own = {name: p.signature.instructions for name, p in program.named_predictors()}
    initial = {"answer": ["Better better better.", "Better better."], "draft": ["Draft it."]}
    optimizer = OPROTeleprompter(toy_metric, prompt_model=opt_lm, task_model=task_lm, num_steps=2, num_candidates=1,
                                 num_exemplars=0, num_threads=1, initial_instructions=initial)
    run = optimizer.compile(program, trainset=toy_dataset(4)).opro_run
    step_minus_one = [c for c in run.candidates if c.step == -1]
    # In the run's target order (draft, answer), each changing only its own predictor.
    assert [(c.id, c.predictor, c.instructions) for c in step_minus_one] == [
        (0, None, own),
        (1, "draft", {**own, "draft": "Draft it."}),
        (2, "answer", {**own, "answer": "Better better better."}),
        (3, "answer", {**own, "answer": "Better better."}),
    ]
    assert [c.score for c in step_minus_one] == [0.0, 0.0, 0.75, 0.5]
    # Each evaluation runs both predictors: 2 requests x 4 examples x 4 programs at step -1.
    step_minus_one_requests = 2 * 4 * 4
    # Step 0 optimizes draft (round-robin): its history holds its own initial instruction and not answer's.
    meta_prompts = [user_text(r) for r in opt_engine.requests]
    assert [s.predictor for s in run.steps] == ["draft", "answer"]
    assert "text:\nDraft it.\nscore:\n" in meta_prompts[0] and "Better better better." not in meta_prompts[0]
    assert "text:\nBetter better better.\nscore:\n75\n" in meta_prompts[1]
    assert "text:\nBetter better.\nscore:\n50\n" in meta_prompts[1] and "Draft it." not in meta_prompts[1]
    # The best program so far (answer = "Better better better.") is the base of step 0's proposal.
    assert run.candidates[4].instructions == {"draft": "Better.", "answer": "Better better better."}
    # Step 1's "Better." for answer is a new instruction: 4 more evaluations each step.
    assert len(task_engine.requests) == step_minus_one_requests + 2 * 4 * 2


# ----------------------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(("value", "error", "message"), [
    ("Think step by step.", TypeError, r"initial_instructions must be a list of instruction strings; got a single "
                                       r"string .* Wrap it in a list"),
    ({"Think."}, TypeError, "initial_instructions must be a list of instruction strings; got a set"),
    (["Think.", ""], ValueError, r"initial_instructions\[1\] is empty"),
    (["   \n"], ValueError, r"initial_instructions\[0\] is only whitespace"),
    (["Think.", 3], TypeError, r"initial_instructions\[1\] is a int \(3\), not a string"),
    ({"answer": "Think."}, TypeError, r"initial_instructions\['answer'\] must be a list .* single string"),
    ({"answer": [None]}, TypeError, r"initial_instructions\['answer'\]\[0\] is a NoneType"),
    ({1: ["Think."]}, TypeError, "maps predictor names .* got the key 1"),
])
def test_the_constructor_refuses_what_is_not_a_list_of_texts(value, error, message) -> None:
    with pytest.raises(error, match=message):
        OPROTeleprompter(simulated_metric, initial_instructions=value)


def test_the_setting_is_frozen_and_fingerprinted() -> None:
    texts = [STEP_BY_STEP]
    optimizer = OPROTeleprompter(simulated_metric, initial_instructions=texts)
    texts.append("changed later")
    assert optimizer.initial_instructions == (STEP_BY_STEP,)
    mapping = OPROTeleprompter(simulated_metric, initial_instructions={"answer": [CAREFUL]})
    assert mapping.initial_instructions == {"answer": (CAREFUL,)}
    lm = dspy.LM("openai/x", api_key="x")
    models = Models(prompt=lm, task=lm, judge=None)

    def recorded(opt: OPROTeleprompter, targets: list[str]) -> dict:
        return recorded_settings(opt, opt.setting_names(), num_steps=10, num_candidates=8, models=models,
                                 targets=targets, has_valset=False)

    assert recorded(optimizer, ["self"])["initial_instructions"] == [STEP_BY_STEP]
    assert recorded(mapping, ["answer"])["initial_instructions"] == {"answer": [CAREFUL]}
    unset = recorded(OPROTeleprompter(simulated_metric), ["self"])
    assert unset["initial_instructions"] is None


@pytest.mark.parametrize(("options", "message"), [
    ({"initial_instructions": {"anser": ["Think."]}},
     r"initial_instructions names unknown predictors \['anser'\]; the program's predictors are \['draft', 'answer'\]"),
    ({"initial_instructions": ["Think."]},
     r"initial_instructions is a list, but the run optimizes 2 predictors \['draft', 'answer'\]; say which "
     r"predictor .* with a mapping"),
    ({"initial_instructions": {"draft": ["Think."]}, "predictors": ["answer"]},
     r"initial_instructions names predictors \['draft'\] that the run does not optimize"),
])
def test_compile_refuses_predictors_it_cannot_place_before_any_lm_call(endpoint, options, message) -> None:
    with pytest.raises(ValueError, match=message):
        _compile(endpoint, simulated_dataset(4), program=_TwoSteps(), **options)
    assert endpoint.requests == []


def test_a_list_applies_to_the_single_target_of_a_multi_predictor_program(endpoint) -> None:
    """With predictors=["answer"], the run optimizes one predictor, so a list is for it."""
    task_lm, task_engine = make_lm(toy_task_reply)
    optimizer = OPROTeleprompter(toy_metric, prompt_model=task_lm, task_model=task_lm, num_steps=0,
                                 predictors=["answer"], initial_instructions=["Better."], num_threads=1)
    run = optimizer.compile(_TwoSteps(), trainset=toy_dataset(3)).opro_run
    assert [(c.predictor, c.instruction, c.score) for c in run.candidates[1:]] == [("answer", "Better.", 1 / 3)]
    assert len(task_engine.requests) == 2 * 3 * 2


# ---------------------------------------------------------------------------------------------------- selection


def test_an_initial_instruction_that_scores_best_is_selected(endpoint) -> None:
    train = simulated_dataset(20)
    scores = [_expected_score(ins, train) for ins in (START, CAREFUL, STRONG)]
    assert scores == [0.25, 0.55, 0.7]  # the simulated task model's verdicts: STRONG is best
    compiled = _compile(endpoint, train, initial_instructions=[CAREFUL, STRONG], num_steps=0)
    run = compiled.opro_run
    assert [c.score for c in run.candidates] == scores
    assert (run.selection.candidate_id, run.selection.selected_by) == (2, "train")
    assert compiled.signature.instructions == STRONG
    assert [p["instructions"]["self"] for p in compiled.candidate_programs] == [STRONG, CAREFUL, START]
    assert [p["step"] for p in compiled.candidate_programs] == [-1, -1, -1]
    assert len(_task(endpoint)) == 60


def test_val_gate_passes_an_initial_instruction_that_beats_the_start_on_validation(endpoint) -> None:
    data = simulated_dataset(30, seed=16)
    train, val = data[:20], data[20:]
    assert [_expected_score(ins, train) for ins in (START, CAREFUL, STRONG)] == [0.15, 0.55, 0.8]
    val_scores = [_expected_score(ins, val) for ins in (START, CAREFUL, STRONG)]
    assert val_scores == [0.1, 0.6, 0.5]
    compiled = _compile(endpoint, train, valset=val, initial_instructions=[CAREFUL, STRONG], num_steps=0,
                        val_gate=True, top_k=2)
    run = compiled.opro_run
    # The top 2 on training (STRONG, CAREFUL) and the start are scored on the valset; CAREFUL is best there.
    assert [c.val_score for c in run.candidates] == val_scores
    assert (run.selection.candidate_id, run.selection.selected_by) == (1, "val_gate")
    assert compiled.signature.instructions == CAREFUL
    assert len(_task(endpoint)) == 3 * 20 + 3 * 10


# ------------------------------------------------------------------------------------------ outages and resume


def test_an_outage_on_an_initial_instruction_is_retried_like_the_start(endpoint) -> None:
    """Requests 6 and 7 (the initial instruction's example 0 and its immediate retry) fail: the step -1 retry phase
    scores it (request 13)."""
    train = simulated_dataset(6)
    endpoint.faults = FaultConfig(fail_requests={6, 7}, fail_kind="server_error")
    run = _compile(endpoint, train, initial_instructions=[STEP_BY_STEP], num_steps=0, num_threads=1).opro_run
    records = endpoint.requests
    assert [i for i, r in enumerate(records) if r.fault] == [6, 7]
    assert _pair(records[13]) == _pair(records[6]) == (STEP_BY_STEP, train[0].question)
    assert len(records) == 14
    assert run.candidates[1].status == "scored" and run.candidates[1].score == _expected_score(STEP_BY_STEP, train)


def test_only_the_start_must_be_scored_and_a_resume_scores_the_rest(endpoint, tmp_path) -> None:
    train = simulated_dataset(6)
    endpoint.faults = FaultConfig(fail_requests={6, 7, 13, 14}, fail_kind="server_error")
    first = _compile(endpoint, train, initial_instructions=[STEP_BY_STEP], num_steps=0, num_candidates=2,
                     num_exemplars=0, num_threads=1, log_dir=tmp_path).opro_run
    assert len(endpoint.requests) == 15
    assert first.status == "finished" and first.selection.candidate_id == 0
    lost = first.candidates[1]
    assert lost.status == "unscored" and lost.reason.startswith("LM failures on 1 examples after a retry")
    assert lost.scores[0] is None and all(s is not None for s in lost.scores[1:])
    assert predictor_history(first, "self") == [(START, first.candidates[0].score, -1)]

    endpoint.faults = FaultConfig()
    endpoint.reset_log()
    second = _compile(endpoint, train, initial_instructions=[STEP_BY_STEP], num_steps=1, num_candidates=2,
                      num_exemplars=0, num_threads=1, log_dir=tmp_path).opro_run
    task = _task(endpoint)
    # The resumed run scores the missing example of the initial instruction first, then step 0's new instructions.
    assert _pair(task[0]) == (STEP_BY_STEP, train[0].question)
    new = [c for c in second.candidates if c.step == 0 and c.status == "scored"]
    assert len(task) == 1 + 6 * len(new)
    assert second.candidates[1].status == "scored"
    assert second.candidates[1].score == _expected_score(STEP_BY_STEP, train)
    assert f"text:\n{STEP_BY_STEP}\nscore:\n" in second.steps[0].meta_prompt


def test_a_resumed_run_keeps_its_initial_instructions_and_refuses_other_ones(endpoint, tmp_path) -> None:
    train = simulated_dataset(5)
    first = _compile(endpoint, train, initial_instructions=[STEP_BY_STEP, CAREFUL], num_steps=1, num_candidates=2,
                     num_exemplars=0, log_dir=tmp_path).opro_run
    saved = json.loads((tmp_path / "state.json").read_text())
    assert saved["config"]["initial_instructions"] == [STEP_BY_STEP, CAREFUL]
    assert [(c["step"], c["predictor"], c["instruction"]) for c in saved["candidates"][:3]] == [
        (-1, None, ""), (-1, "self", STEP_BY_STEP), (-1, "self", CAREFUL)]

    endpoint.reset_log()
    second = _compile(endpoint, train, initial_instructions=[STEP_BY_STEP, CAREFUL], num_steps=2, num_candidates=2,
                      num_exemplars=0, log_dir=tmp_path).opro_run
    # Nothing of step -1 runs again; its candidates and scores are the saved ones.
    assert {_pair(r)[0] for r in _task(endpoint)}.isdisjoint({START, STEP_BY_STEP, CAREFUL})
    assert [c.model_dump() for c in second.candidates[:3]] == [c.model_dump() for c in first.candidates[:3]]
    assert [entry[2] for entry in predictor_history(second, "self")][:3] == [-1, -1, -1]

    endpoint.reset_log()
    with pytest.raises(StateFileError, match=r"initial_instructions: .*Let's think step by step.* -> "):
        _compile(endpoint, train, initial_instructions=[STEP_BY_STEP], num_steps=2, num_candidates=2,
                 num_exemplars=0, log_dir=tmp_path)
    assert endpoint.requests == []


# ----------------------------------------------------------------------------------------------------- reports


def test_report_and_plot_show_initial_instructions_at_step_minus_one(endpoint, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    from dspy_opro.record.plot import build_trajectory_figure
    from dspy_opro.record.report import render_run_report, trajectory_rows

    train = simulated_dataset(20)
    run = _compile(endpoint, train, initial_instructions=[CAREFUL, STRONG], num_steps=0, log_dir=tmp_path).opro_run
    assert trajectory_rows(run) == [{"step": -1, "predictor": None, "scored": 3, "best_this_step": 70.0,
                                     "best_so_far": 70.0}]
    report = (tmp_path / "report.md").read_text()
    assert report == render_run_report(run)
    assert "step -1 is the program as given and its initial instructions." in report
    assert "### 1. 70.0 (initial instruction, predictor `self`, candidate 2)" in report
    assert "- Candidate: 2 (initial instruction, predictor `self`)" in report
    figure = build_trajectory_figure(run)
    axes = figure.axes[0]
    points = {tuple(map(tuple, c.get_offsets())): c.get_label() for c in axes.collections}
    assert points[((-1.0, 25.0),)] == "start (the program as given)"
    assert points[((-1.0, 55.0), (-1.0, 70.0))] == "candidate"
    labels = [t.get_text() for t in figure.legends[0].get_texts()]
    assert "returned by compile: candidate 2 (initial instruction), training score 70.0" in labels
    assert "start training score (25.0)" in labels


# --------------------------------------------------------------------------------------------- fidelity (golden)


GOLDEN = Path(__file__).parent / "golden" / "meta_prompts.jsonl"


def _golden_case(name: str) -> dict:
    for line in GOLDEN.read_text().splitlines():
        case = json.loads(line)
        if case["case"] == name:
            return case
    raise KeyError(name)


def test_several_initial_instructions_give_the_authors_meta_prompt() -> None:
    """The authors' paper-default case (``gpt_Q_begin_noqa_paper_default``: 4 instructions with scores 61, 71, 58,
    75 and 3 gsm8k problems) is reproduced byte for byte by a run whose program holds the first instruction and
    whose ``initial_instructions`` are the other three, all scored at step -1 (the step number is not shown).
    The step-0 meta-prompt also equals ``gen_meta_prompt`` of the run's own step -1 history."""
    case = _golden_case("gpt_Q_begin_noqa_paper_default")
    inputs = case["inputs"]
    history = inputs["old_instructions_and_scores"]
    buckets = {ins: round(score * 100) for ins, score, _ in history}
    assert buckets == {"Let's solve the problem.": 61, "Let's think step by step.": 71,
                       "Solve the math word problem carefully.": 58,
                       "Break the problem into smaller steps and compute each one.": 75}

    # 100 training problems, the golden's three where the run's step-0 draw falls; an instruction worth c
    # (of 100) answers the first c problems right.
    n = 100
    drawn = draw_exemplar_indices(range(n), 3, 0)
    questions = [f"Filler problem {i}." for i in range(n)]
    answers = [str(i) for i in range(n)]
    for position, exemplar in zip(drawn, inputs["exemplars"], strict=True):
        questions[position], answers[position] = exemplar["question"], str(exemplar["answer"])
    trainset = [dspy.Example(question=q, answer=a).with_inputs("question") for q, a in zip(questions, answers,
                                                                                           strict=True)]
    index_of = {q: i for i, q in enumerate(questions)}

    def task(request) -> str:
        index = index_of[field_value(user_text(request), "question")]
        return chat_reply(answer=answers[index] if index < buckets.get(instruction_of(request), 0) else "wrong")

    task_lm, task_engine = make_lm(task)
    opt_lm, opt_engine = make_lm(scripted_optimizer(["<INS>Something new.</INS>"]))
    optimizer = OPROTeleprompter(
        lambda example, prediction, trace=None: float(prediction.answer == example.answer),
        prompt_model=opt_lm, task_model=task_lm, num_steps=1, num_candidates=1, num_exemplars=3,
        score_threshold=inputs["old_instruction_score_threshold"], num_score_buckets=inputs["num_score_buckets"],
        max_num_instructions=inputs["max_num_instructions"], instruction_pos=inputs["instruction_pos"],
        include_qa=inputs["include_qa"], num_threads=4,
        initial_instructions=[ins for ins, _, _ in history[1:]])
    program = dspy.Predict(dspy.Signature("question -> answer", history[0][0]))
    run = optimizer.compile(program, trainset=trainset).opro_run

    assert len(task_engine.requests) == 4 * n + n  # step -1: (1 + 3) x 100; step 0: "Something new."
    own_history = predictor_history(run, "self")
    assert [(ins, round(score * 100), step) for ins, score, step in own_history[:4]] == [
        (ins, buckets[ins], -1) for ins, _, _ in history]
    sent = user_text(opt_engine.requests[0])
    assert sent == run.steps[0].meta_prompt == case["output"]
    pairs = [(q["question"], str(q["answer"])) for q in inputs["exemplars"]]
    assert sent == gen_meta_prompt(own_history[:4], pairs, num_score_buckets=100, score_threshold=0.0)


# --------------------------------------------------------------------------------------------------- label-free


def test_label_free_never_judges_an_initial_instruction_before_its_anchor_exists() -> None:
    """Even on 4 threads, label-free step -1 is two phases: the start's runs, which leave the anchors, then the
    initial instruction's, each judged against the anchor of its example. (Without labels, one phase as in
    ``test_the_start_and_the_initial_instructions_are_scored_in_one_parallel_phase`` would judge a run before its
    example's anchor exists.) The start's run on item 0 is held back for 0.5 s: in one phase, the other threads would
    send the initial instruction's runs meanwhile; in two, none is sent before the start's runs are all answered."""
    initial_arrived = threading.Event()
    order: list[str] = []

    def task(request) -> str:
        question = field_value(user_text(request), "question")
        if instruction_of(request) == "Better.":
            order.append(f"initial {question}")
            initial_arrived.set()
        elif question == "item 0":
            initial_arrived.wait(0.5)
            order.append("start item 0 answered")
        return toy_task_reply(request)

    task_lm, task_engine = make_lm(task)
    judge_lm, judge_engine = make_lm(lambda request: chat_reply(rationale="Same.", preference=0), model="openai/judge")
    optimizer = OPROTeleprompter(PairwisePreference(judge_model=judge_lm), prompt_model=task_lm, task_model=task_lm,
                                 num_steps=0, num_threads=4, initial_instructions=["Better."])
    run = optimizer.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(4)).opro_run
    assert order[0] == "start item 0 answered" and sorted(order[1:]) == [f"initial item {i}" for i in range(4)]
    assert [instruction_of(request) for request in task_engine.requests] == [START] * 4 + ["Better."] * 4
    assert len(judge_engine.requests) == 4  # once per run of the initial instruction, none for the start's
    # The judge calls every pair even (preference 0, a score of 0.5, the start's own): on a tie the start is the best,
    # and the gate keeps the program as given.
    assert [(c.status, c.score) for c in run.candidates] == [("scored", 0.5), ("scored", 0.5)]
    assert (run.selection.candidate_id, run.selection.selected_by) == (0, "start")
