"""A first run that cannot go quietly wrong: garbage refused before any LM call with a message that names the fix,
the valset used by default, errors tolerated up to ``max_errors``, the record's timeline, a killed run reported as
such. Every count is the fake engines' request log."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import dspy
import pytest

from dspy_opro import OPROTeleprompter
from dspy_opro.__main__ import main
from dspy_opro.errors import MetricError, ProgramError
from dspy_opro.record.files import LogDirLock, load_state, save_state
from tests.fakes import make_lm, scripted_optimizer, toy_dataset, toy_metric, toy_task_reply, user_text

ROOT = Path(__file__).resolve().parent.parent
REPLIES = ["<INS>Better better better better.</INS>", "<INS>Better better.</INS>"]


def make(**kwargs):
    task_lm, task_engine = make_lm(toy_task_reply)
    opt_lm, opt_engine = make_lm(scripted_optimizer(REPLIES))
    settings = {"num_steps": 1, "num_candidates": 2, "num_threads": 1, **kwargs}
    metric = settings.pop("metric", toy_metric)
    return OPROTeleprompter(metric, prompt_model=opt_lm, task_model=task_lm, **settings), task_engine, opt_engine


class AsyncOnly(dspy.Module):
    def __init__(self):
        super().__init__()
        self.predict = dspy.Predict("question -> answer")

    async def aforward(self, question):
        return await self.predict.acall(question=question)


class ReturnsNone(dspy.Module):
    def __init__(self):
        super().__init__()
        self.predict = dspy.Predict("question -> answer")

    def forward(self, question):
        self.predict(question=question)  # the missing ``return``


class ReturnsText(ReturnsNone):
    def forward(self, question):
        return self.predict(question=question).answer


class TakesQuestion(ReturnsNone):
    def forward(self, question):
        return self.predict(question=question)


# ---------------------------------------------------------------------------------------------------------------
# Garbage refused


@pytest.mark.parametrize(
    ("program", "returned"),
    [(ReturnsNone, "returned None"), (ReturnsText, "returned a str ('wrong')")],
)
def test_a_program_that_returns_no_prediction_stops_before_any_optimizer_call(program, returned):
    optimizer, task_engine, opt_engine = make()
    name = program.__name__
    expected = (
        f"the program {name} {returned} on training example 0 ({{'question': 'item 0'}}), not a dspy.Prediction: no "
        f"instruction can fix that. Make {name}.forward return the prediction of its last predictor (e.g. `return "
        "self.predict(question=question)`) or dspy.Prediction(answer=...)."
    )
    with pytest.raises(ProgramError) as raised:
        optimizer.compile(program(), trainset=toy_dataset(4))
    assert str(raised.value) == expected
    assert "Fix the metric" not in str(raised.value)
    assert len(opt_engine.requests) == 0 and len(task_engine.requests) == 1  # the first evaluation stopped it


@pytest.mark.parametrize(
    ("program", "expected"),
    [
        (TakesQuestion(), "trainset[0]'s input keys ['query'] do not match the inputs of the program TakesQuestion, "
                          "['question']: it would be called as TakesQuestion(**example.inputs()) and fail on every "
                          "example. Build the examples with .with_inputs('question') or rename the program's inputs"),
        (dspy.ChainOfThought("question -> answer"),
         "trainset[0]'s input keys ['query'] do not match the inputs of the program ChainOfThought, ['question']: it "
         "would be called as ChainOfThought(**example.inputs()) and fail on every example. Build the examples with "
         ".with_inputs('question') or rename the program's inputs"),
    ],
)
def test_input_keys_the_program_does_not_take_are_refused_before_any_lm_call(program, expected):
    optimizer, task_engine, opt_engine = make()
    trainset = [dspy.Example(query=f"item {i}", answer=f"a{i}").with_inputs("query") for i in range(4)]
    with pytest.raises(ValueError) as raised:
        optimizer.compile(program, trainset=trainset)
    assert str(raised.value) == expected
    assert len(task_engine.requests) == 0 and len(opt_engine.requests) == 0


def test_a_valset_with_other_keys_is_refused_too_and_a_matching_one_passes():
    optimizer, task_engine, _ = make(max_metric_calls=4, num_steps=0)
    valset = [dspy.Example(q="item 0", answer="a0").with_inputs("q")]
    with pytest.raises(ValueError, match=re.escape("valset[0]'s input keys ['q'] do not match")):
        optimizer.compile(TakesQuestion(), trainset=toy_dataset(4), valset=valset)
    assert len(task_engine.requests) == 0
    # A forward with an optional input takes examples with or without it.

    class Optional(TakesQuestion):
        def forward(self, question, hint=""):
            return self.predict(question=question)

    extra = [dspy.Example(question=f"item {i}", hint="h", answer=f"a{i}").with_inputs("question", "hint")
             for i in range(4)]
    compiled = optimizer.compile(Optional(), trainset=extra)
    assert compiled.opro_run.metric_calls == 4 and len(task_engine.requests) == 4


@pytest.mark.parametrize(
    ("call", "error", "expected"),
    [
        (lambda o: o.compile(dspy.Predict("question -> answer"), trainset=None), TypeError,
         "trainset is None; pass trainset=[dspy.Example(question=..., answer=...).with_inputs('question'), ...] (a "
         "list of dspy.Example with their inputs set)"),
        (lambda o: o.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(2)[0]), TypeError,
         "trainset must be a list of dspy.Example; got a Example: pass trainset=[dspy.Example(...).with_inputs(...), "
         "...]"),
        (lambda o: o.compile(dspy.Predict("question -> answer"), trainset=[{"question": "q", "answer": "a"}]),
         TypeError, "trainset[0] is a dict, not a dspy.Example; convert each row with dspy.Example(**row)."
                    "with_inputs(...), naming its input keys among 'question', 'answer'"),
        (lambda o: o.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(2), valset=["q"]), TypeError,
         "valset[0] is a str, not a dspy.Example; build it with dspy.Example(question=..., answer=...)."
         "with_inputs('question')"),
        (lambda o: o.compile(TakesQuestion, trainset=toy_dataset(2)), TypeError,
         "compile() got the class TakesQuestion, not a program; pass an instance: compile(TakesQuestion(...), "
         "trainset=...)"),
        (lambda o: o.compile(AsyncOnly(), trainset=toy_dataset(2)), TypeError,
         "the program AsyncOnly defines aforward but no forward: OPRO runs a program as dspy.Evaluate does, "
         "AsyncOnly(**example.inputs()) on worker threads, which calls forward. Give AsyncOnly a forward (for example "
         "one that calls its predictors directly, or `return asyncio.run(self.aforward(**kwargs))`)"),
        (lambda o: o.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(2), val_set=[]), TypeError,
         "compile() got an unexpected keyword argument 'val_set'; did you mean 'valset'?"),
    ],
)
def test_bad_arguments_name_the_argument_and_the_fix(call, error, expected):
    optimizer, task_engine, opt_engine = make(num_exemplars=1)
    with pytest.raises(error) as raised:
        call(optimizer)
    assert str(raised.value) == expected
    assert len(task_engine.requests) == 0 and len(opt_engine.requests) == 0


def test_a_mistyped_keyword_suggests_the_setting():
    with pytest.raises(TypeError) as raised:
        OPROTeleprompter(toy_metric, num_step=3)
    assert str(raised.value) == "OPROTeleprompter() got an unexpected keyword argument 'num_step'; did you mean " \
                                "'num_steps'?"
    with pytest.raises(TypeError, match=r"'bogus'; the known arguments are \['auto', 'display_progress', "):
        OPROTeleprompter(toy_metric, bogus=1)


# ---------------------------------------------------------------------------------------------------------------
# The valset is used by default


def test_a_valset_given_with_the_default_settings_selects_and_says_so(caplog):
    optimizer, task_engine, _ = make()
    with caplog.at_level(logging.INFO, logger="dspy_opro"):
        compiled = optimizer.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(4),
                                     valset=toy_dataset(3, prefix="val"))
    run = compiled.opro_run
    assert run.selection.selected_by == "validation" and run.config["select"] == "validation"
    assert "OPRO selects on the valset (3 examples) (select='auto' with a valset; select='train' is the paper's " \
           "setting)" in caplog.messages
    # 4 x (1 start + 2 candidates) on training, then the top 3 on the 3 validation examples.
    assert len(task_engine.requests) == 12 + 9 == run.metric_calls


def test_without_a_valset_the_default_selects_on_training_and_says_so(caplog):
    optimizer, task_engine, _ = make()
    with caplog.at_level(logging.INFO, logger="dspy_opro"):
        compiled = optimizer.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(4))
    assert compiled.opro_run.selection.selected_by == "train" and compiled.opro_run.config["select"] == "train"
    assert "OPRO selects on training (the paper's setting): no valset was given" in caplog.messages
    assert len(task_engine.requests) == 12


# ---------------------------------------------------------------------------------------------------------------
# max_errors


def flaky_metric(example, prediction, trace=None):
    if example.question == "item 1":
        raise KeyError("label")
    return toy_metric(example, prediction)


def test_tolerated_metric_errors_are_counted_logged_and_recorded(caplog):
    optimizer, task_engine, _ = make(metric=flaky_metric)
    with caplog.at_level(logging.WARNING, logger="dspy_opro"):
        compiled = optimizer.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(4))
    run = compiled.opro_run
    assert run.status == "finished" and run.tolerated_errors == 3  # item 1 for the start and the 2 candidates
    assert len(task_engine.requests) == 12 == run.metric_calls
    start = run.candidates[0]
    assert start.scores[1] == 0.0 and start.failed == [1]
    assert [(e.error, e.example, e.count) for e in start.errors] == [("metric: KeyError: 'label'", 1, 1)]
    tolerated = [m for m in caplog.messages if m.startswith("Tolerated metric error")]
    # max_errors counts per evaluation of one candidate: each of the three has its error 1.
    assert sorted(tolerated) == [f"Tolerated metric error 1 of max_errors=10 for candidate {cid} (scored "
                                 "failure_score=0) on training example 1 ({'question': 'item 1'}): KeyError: 'label'"
                                 for cid in (0, 1, 2)]
    raised = sorted(m for m in caplog.messages if m.startswith("Candidate ") and " raised on " in m)
    assert raised == [f"Candidate {cid}: the metric raised on 1 training evaluations (1 distinct errors); first, on "
                      "example 1: metric: KeyError: 'label'" for cid in (0, 1, 2)]


def test_max_errors_counts_per_evaluation_of_one_candidate_not_per_compile():
    optimizer, task_engine, opt_engine = make(metric=flaky_metric, max_errors=1)
    compiled = optimizer.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(4))
    run = compiled.opro_run
    # 3 errors in the compile, more than max_errors=1, but one per candidate's evaluation: the run finishes.
    assert run.status == "finished" and run.tolerated_errors == 3
    assert len(task_engine.requests) == 12 == run.metric_calls and len(opt_engine.requests) == 2
    assert [c.failed for c in run.candidates] == [[1], [1], [1]]


def test_past_max_errors_the_run_stops_naming_the_example_and_the_limit(tmp_path):
    optimizer, task_engine, opt_engine = make(metric=flaky_metric, max_errors=1, log_dir=tmp_path)
    trainset = [dspy.Example(question="item 1", answer="a1").with_inputs("question")] * 3
    with pytest.raises(MetricError) as raised:
        optimizer.compile(dspy.Predict("question -> answer"), trainset=trainset)
    assert str(raised.value) == (
        "the metric failed on training example 1 ({'question': 'item 1'}): KeyError: 'label', error 2 of candidate 0's "
        "evaluation on training, more than max_errors=1. Fix the metric: it must return a float in [0, 1], a bool, or "
        "dspy.Prediction(score=..., feedback=...); then compile again with the same log_dir to resume.")
    assert len(task_engine.requests) == 2 and len(opt_engine.requests) == 0
    saved = load_state(tmp_path)
    assert saved.status == "failed" and saved.tolerated_errors == 1


def test_an_unparseable_answer_is_scored_not_counted():
    task_lm, task_engine = make_lm(lambda request: "no fields at all" if "item 2" in str(request) else
                                   toy_task_reply(request))
    opt_lm, _ = make_lm(scripted_optimizer(REPLIES))
    optimizer = OPROTeleprompter(toy_metric, prompt_model=opt_lm, task_model=task_lm, num_steps=1, num_candidates=2,
                                 num_threads=1, max_errors=0)
    compiled = optimizer.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(4))
    run = compiled.opro_run
    assert run.status == "finished" and run.tolerated_errors == 0
    assert run.candidates[0].failed == [2] and "AdapterParseError" in run.candidates[0].errors[0].error


def test_max_errors_is_checked():
    with pytest.raises(ValueError, match=re.escape("max_errors must be an int >= 0 (0 stops at the first) or None; "
                                                   "got -1")):
        OPROTeleprompter(toy_metric, max_errors=-1)


# ---------------------------------------------------------------------------------------------------------------
# The record a user reads


def test_the_record_and_report_carry_each_compile_step_and_phase(tmp_path):
    optimizer, _, _ = make(log_dir=tmp_path, num_steps=2)
    compiled = optimizer.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(4))
    run = compiled.opro_run
    assert len(run.sessions) == 1 and run.sessions[0].end == "finished"
    assert run.sessions[0].started_at <= run.sessions[0].ended_at
    assert [p.name for p in run.phases] == ["step -1 scoring", "step 0 proposals", "step 0 scoring",
                                            "step 1 proposals", "step 1 scoring", "selection"]
    assert all(p.ended_at is not None and p.started_at <= p.ended_at for p in run.phases)
    assert all(s.started_at is not None and s.started_at <= s.ended_at for s in run.steps)
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "## Timeline" in report and "| 1 | start |" in report and "| finished |" in report
    assert "| step 0 proposals |" in report and "| step 1 scoring |" in report
    # A second compile (the finished run returns at once) and a resumption with more steps: a new session.
    more, _, _ = make(log_dir=tmp_path, num_steps=3)
    resumed = more.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(4)).opro_run
    assert [s.end for s in resumed.sessions] == ["finished", "finished"]
    assert "| 2 | resume |" in (tmp_path / "report.md").read_text(encoding="utf-8")


def test_the_report_of_a_killed_run_says_it_stopped_and_how_to_resume(tmp_path, capsys):
    optimizer, _, _ = make(log_dir=tmp_path)
    run = optimizer.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(4)).opro_run
    # What a kill -9 leaves: the record says running, its compile has no end, and the OS released the lock.
    run.status, run.selection = "running", None
    run.sessions[-1].ended_at = run.sessions[-1].end = None
    save_state(run, tmp_path)
    lock = LogDirLock(tmp_path)
    lock.acquire()  # a live run holds the lock: the report says running
    try:
        assert main(["report", str(tmp_path), "--no-plot"]) == 0
    finally:
        lock.release()
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "- Status: running" in report
    assert main(["report", str(tmp_path), "--no-plot"]) == 0
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "- Status: running" not in report
    assert "- Status: interrupted" in report
    assert "- Stop reason: the process stopped without finishing (killed or crashed: no process holds run.lock)" \
        in report
    assert "- Resume: compile again with the same `log_dir`; nothing already scored runs again." in report
    assert f"note: the run in {tmp_path} stopped without finishing; compile again with the same log_dir to resume" \
        in capsys.readouterr().err
    assert load_state(tmp_path).status == "running"  # the report never rewrites the record


# ---------------------------------------------------------------------------------------------------------------
# Offline runs are quiet


def test_the_local_price_maps_are_used_only_when_every_model_is_local(monkeypatch):
    from dspy_opro.core.plan import use_local_price_maps_offline

    local = dspy.LM("openai/x", api_base="http://127.0.0.1:8000/v1", api_key="k")
    remote = dspy.LM("openai/gpt-4o-mini")
    monkeypatch.delenv("LITELLM_LOCAL_MODEL_COST_MAP", raising=False)
    assert not use_local_price_maps_offline([local, remote, None])
    assert "LITELLM_LOCAL_MODEL_COST_MAP" not in os.environ
    assert use_local_price_maps_offline([local, None])
    assert os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "False")  # the user's choice stands
    assert not use_local_price_maps_offline([local])
    assert os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] == "False"


@pytest.mark.parametrize("before", [None, "False"])
def test_estimate_and_compile_leave_the_environment_as_they_found_it(monkeypatch, before):
    from dspy_opro.testing import SimulatedEndpoint, simulated_dataset, simulated_metric

    monkeypatch.delenv("LITELLM_LOCAL_MODEL_COST_MAP", raising=False)
    if before is not None:
        monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", before)
    with SimulatedEndpoint() as endpoint:
        optimizer = OPROTeleprompter(simulated_metric, prompt_model=endpoint.lm("openai/sim-opt"),
                                     task_model=endpoint.lm("openai/sim-task"), num_steps=1, num_candidates=1)
        optimizer.estimate(dspy.Predict("question -> answer"), simulated_dataset(3))
        assert os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP") == before
        optimizer.compile(dspy.Predict("question -> answer"), trainset=simulated_dataset(3))
        assert os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP") == before
        assert endpoint.count("task") == 6


OFFLINE_SCRIPT = """
import dspy
from dspy_opro import OPROTeleprompter
from dspy_opro.testing import SimulatedEndpoint, simulated_dataset, simulated_metric

with SimulatedEndpoint() as endpoint:
    optimizer = OPROTeleprompter(simulated_metric, prompt_model=endpoint.lm("openai/simulated-optimizer"),
                                 task_model=endpoint.lm("openai/simulated-task"), num_steps=1, num_candidates=2,
                                 display_progress=False)
    optimizer.compile(dspy.Predict("question -> answer"), trainset=simulated_dataset(6))
    print("served", endpoint.count("opro"), endpoint.count("task"))
"""


@pytest.mark.slow
def test_an_offline_run_prints_no_cost_map_warning(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "LITELLM_LOCAL_MODEL_COST_MAP"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-c", OFFLINE_SCRIPT], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "served 1 18"
    noise = [line for line in proc.stderr.splitlines() if "INFO dspy_opro" not in line]
    assert noise == []


def test_a_metric_that_fails_on_every_example_of_the_start_stops_before_any_optimizer_call():
    optimizer, task_engine, opt_engine = make(metric=lambda example, prediction, trace=None: None)
    with pytest.raises(MetricError) as raised:
        optimizer.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(4))
    assert str(raised.value) == (
        "the metric failed on all 4 training examples of the program as given; first, on example 0: ValueError: the "
        "metric returned None. Fix the metric: it must return a float in [0, 1], a bool, or "
        "dspy.Prediction(score=..., feedback=...); then compile again (pass log_dir=... to keep what was scored and "
        "resume instead).")
    assert len(task_engine.requests) == 4 and len(opt_engine.requests) == 0


# ---------------------------------------------------------------------------------------------------------------
# Data that is accepted but probably not what was meant is said once, before the first LM call


def notes_of(caplog):
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and r.getMessage().startswith("OPRO: ")]


@pytest.mark.parametrize(("valset", "expected"), [
    ([], "OPRO: valset=[] is empty, so OPRO selects on training (the paper's setting); pass held-out examples to "
         "select on them, or leave valset out"),
    (toy_dataset(4), "OPRO: every one of the valset's 4 examples is also in the trainset: its scores are not held "
                     "out, so selecting on it cannot catch an instruction that overfits; pass examples the trainset "
                     "does not hold"),
    (toy_dataset(4)[2:] + toy_dataset(3, prefix="val"),
     "OPRO: 2 of the valset's 5 examples are also in the trainset: their validation scores are not held out"),
])
def test_an_empty_or_overlapping_valset_is_said_once(caplog, valset, expected):
    optimizer, task_engine, _ = make()
    with caplog.at_level(logging.INFO, logger="dspy_opro"):
        optimizer.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(4), valset=valset)
    assert notes_of(caplog) == [expected]
    assert ("OPRO selects on training (the paper's setting): no valset was given" in caplog.messages) is False
    assert caplog.messages.index(expected) < caplog.messages.index(next(m for m in caplog.messages
                                                                        if m.startswith("OPRO plan:")))


def test_examples_without_a_label_for_the_output_field_are_said_once(caplog):
    train = toy_dataset(4)
    train[1] = dspy.Example(question="item 1", label="a1").with_inputs("question")
    train[3] = dspy.Example(question="item 3").with_inputs("question")
    optimizer, task_engine, _ = make(metric=lambda example, prediction, trace=None: 1.0)
    with caplog.at_level(logging.INFO, logger="dspy_opro"):
        optimizer.compile(dspy.Predict("question -> answer"), trainset=train)
    assert notes_of(caplog) == [
        "OPRO: 2 of 4 training examples have no label for any output field of predictor 'self' (answer): the "
        "meta-prompt shows the program's own answer for them where the metric scored it 1, else '(no reference "
        "answer available)'"]
    assert len(task_engine.requests) == 12


class CustomStop(BaseException):
    pass


@pytest.mark.parametrize(("raised", "shown"), [(SystemExit(3), "SystemExit: 3"), (GeneratorExit(), "GeneratorExit: "),
                                               (CustomStop("halt"), "CustomStop: halt")])
def test_a_base_exception_of_the_metric_is_a_metric_error_and_its_paid_run_is_kept(tmp_path, raised, shown):
    def metric(example, prediction, trace=None):
        if example.question == "item 1":
            raise raised
        return toy_metric(example, prediction)

    optimizer, task_engine, _ = make(metric=metric, log_dir=str(tmp_path))
    run = optimizer.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(4)).opro_run
    assert run.status == "finished" and run.tolerated_errors == 3
    assert [(e.error, e.example) for e in run.candidates[0].errors] == [(f"metric: {shown}", 1)]
    assert len(task_engine.requests) == 12 == run.metric_calls
    again, engine_again, _ = make(metric=metric, log_dir=str(tmp_path))
    assert again.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(4)).opro_run.metric_calls == 12
    assert len(engine_again.requests) == 0  # nothing is bought again


def test_a_base_exception_of_the_program_is_a_program_error():
    class Exits(dspy.Module):
        def __init__(self):
            super().__init__()
            self.predict = dspy.Predict("question -> answer")

        def forward(self, question):
            prediction = self.predict(question=question)
            if question == "item 2":
                raise SystemExit("bye")
            return prediction

    optimizer, task_engine, _ = make()
    run = optimizer.compile(Exits(), trainset=toy_dataset(4)).opro_run
    assert run.status == "finished" and [c.failed for c in run.candidates] == [[2], [2], [2]]
    assert [(e.error, e.example) for e in run.candidates[0].errors] == [("SystemExit: bye", 2)]
    assert len(task_engine.requests) == 12 == run.metric_calls


# ---------------------------------------------------------------------------------------------------------------
# A fixed metric resumes a paid run


def grading(broken_on: tuple[str, ...]):
    """The same metric (one qualified name) before and after a fix: ``broken_on`` are the questions it fails."""

    def grade(example, prediction, trace=None):
        if example.question in broken_on:
            raise KeyError("refund")
        return toy_metric(example, prediction)

    return grade


def test_a_fixed_metric_resumes_and_runs_again_only_what_it_failed(tmp_path, caplog):
    optimizer, task_engine, opt_engine = make(metric=grading(("item 1", "item 3")), max_errors=1,
                                              log_dir=str(tmp_path))
    with pytest.raises(MetricError) as raised:
        optimizer.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(4))
    assert str(raised.value).endswith("then compile again with the same log_dir to resume.")
    assert (len(task_engine.requests), len(opt_engine.requests)) == (4, 0)  # stopped at step -1
    saved = load_state(tmp_path).candidates[0]  # the error past max_errors stopped the run before it was recorded
    assert (saved.metric_errors, saved.scores) == (["train:1"], [0.0, 0.0, 0.0, None])

    fixed, task_engine, opt_engine = make(metric=grading(()), max_errors=1, log_dir=str(tmp_path))
    with caplog.at_level(logging.INFO, logger="dspy_opro"):
        run = fixed.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(4)).opro_run
    # Items 1 and 3 of the start run again; items 0 and 2 are kept; then step 0 as usual.
    asked = [user_text(request) for request in task_engine.requests]
    assert len(asked) == 2 + 2 * 4 and "item 1" in asked[0] and "item 3" in asked[1]
    assert len(opt_engine.requests) == 2 and run.status == "finished" and run.metric_calls == 4 + 2 + 8
    clean, _, _ = make()
    expected = clean.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(4)).opro_run
    assert [c.scores for c in run.candidates] == [c.scores for c in expected.candidates]
    start = run.candidates[0]
    assert (start.failed, start.errors, start.error_count, start.metric_errors) == ([], [], 0, [])
    assert any(m.startswith("The metric changed since the saved run (tests.test_first_run.grading.<locals>.grade#")
               and m.endswith(": its 1 evaluations that raised in the metric are run again with it; the 2 other "
                              "scores are kept, as the old metric gave them (a new log_dir scores everything with the "
                              "new one)") for m in caplog.messages)  # item 3 stopped the run unrecorded
    from dspy_opro.task.programs import callable_fingerprint

    record = load_state(tmp_path)  # the record names the fixed metric from now on
    assert record.config["metric"] == record.fingerprint.settings["metric"] == callable_fingerprint(fixed.metric)


def test_a_fixed_metric_reopens_a_finished_run_and_selects_anew(tmp_path):
    flaky, task_engine, _ = make(metric=grading(("item 1",)), log_dir=str(tmp_path))
    first = flaky.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(4)).opro_run
    assert first.status == "finished" and first.tolerated_errors == 3 and len(task_engine.requests) == 12
    fixed, task_engine, opt_engine = make(metric=grading(()), log_dir=str(tmp_path))
    run = fixed.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(4)).opro_run
    assert (len(task_engine.requests), len(opt_engine.requests)) == (3, 0)  # item 1 of each of the 3 candidates
    assert run.status == "finished" and run.tolerated_errors == 0 and [c.failed for c in run.candidates] == [[]] * 3
    again, task_engine, _ = make(metric=grading(()), log_dir=str(tmp_path))
    again.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(4))
    assert len(task_engine.requests) == 0  # the fixed record is the record now


def test_a_metric_of_another_name_is_refused_with_advice_that_works(tmp_path):
    optimizer, _, _ = make(metric=grading(("item 1", "item 3")), max_errors=1, log_dir=str(tmp_path))
    with pytest.raises(MetricError):
        optimizer.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(4))
    other, task_engine, opt_engine = make(metric=toy_metric, log_dir=str(tmp_path))
    with pytest.raises(Exception) as raised:
        other.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(4))
    message = str(raised.value)
    assert type(raised.value).__name__ == "StateFileError" and "metric: " in message
    assert message.endswith("A metric of another name is another metric: resume with "
                            "tests.test_first_run.grading.<locals>.grade (a fix of its body resumes, and what it "
                            "failed is run again), or choose a new log_dir for the new one.")
    assert len(task_engine.requests) == len(opt_engine.requests) == 0
