"""No silent failure (issue 11): every error is loud, named and recorded, and a run stops where nothing can be learned.

Each compile drives OPRO through the real DSPy/LiteLLM client stack against :class:`SimulatedEndpoint` (one endpoint
per model where a test needs to tell them apart) and takes its counts from the endpoints' request logs; those
end-to-end runs are marked ``slow``. The numbered
sections follow the issue's requirements; ``docs/failures.md`` names these tests in its table.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import errno
import hashlib
import json
import logging
import re
import signal
from pathlib import Path

import dspy
import pytest

from dspy_opro import (
    FatalLMError,
    LogDirError,
    MetricError,
    OPRORunError,
    OPROTeleprompter,
    PairwisePreference,
    ProgramError,
)
from dspy_opro.core.exemplars import draw_exemplar_indices
from dspy_opro.core.meta_prompt import instruction_md5
from dspy_opro.errors import check_model_ready, classify_exception, clean_text
from dspy_opro.record.files import STATE_FILE, load_state
from dspy_opro.record.report import REPORT_FILE
from dspy_opro.state import ErrorRecord
from dspy_opro.testing import FaultConfig, SimulatedEndpoint, simulated_dataset, simulated_metric

TASK, OPT, JUDGE = "openai/sim-task", "openai/sim-opt", "openai/sim-judge"
START = "Given the fields `question`, produce the fields `answer`."
RESUME_HINT = "compile again with the same log_dir to resume"


def lm(endpoint: SimulatedEndpoint, model: str, **kwargs) -> dspy.LM:
    return endpoint.lm(model, num_retries=0, **kwargs)


def compile_run(task_endpoint, opt_endpoint=None, *, trainset, program=None, metric=simulated_metric,
                opt_model=OPT, valset=None, **options):
    teleprompter = OPROTeleprompter(metric, prompt_model=lm(opt_endpoint or task_endpoint, opt_model),
                                    task_model=lm(task_endpoint, TASK), **options)
    return teleprompter.compile(program or dspy.Predict("question -> answer"), trainset=trainset, valset=valset)


def kinds(endpoint, kind):
    return [r for r in endpoint.requests if r.kind == kind]


class RaisesOn(dspy.Module):
    """``question -> answer``, raising ``error`` on the given training questions (after the LM call)."""

    def __init__(self, questions: set[str], error: Exception, *, before_lm: bool = False):
        super().__init__()
        self.predict = dspy.Predict("question -> answer")
        self.questions, self.error, self.before_lm = questions, error, before_lm

    def forward(self, question):
        if self.before_lm and question in self.questions:
            raise self.error
        prediction = self.predict(question=question)
        if question in self.questions:
            raise self.error
        return prediction


@pytest.fixture
def endpoint():
    with SimulatedEndpoint() as ep:
        yield ep


# ------------------------------------------------------------------------------------- 1. program errors are named


@pytest.mark.slow
def test_program_errors_are_recorded_per_candidate_reported_and_warned_once(endpoint, tmp_path, caplog):
    train = simulated_dataset(4)
    program = RaisesOn({train[1].question, train[3].question}, KeyError("total"))
    with caplog.at_level(logging.WARNING, logger="dspy_opro"):
        compiled = compile_run(endpoint, trainset=train, program=program, num_steps=1, num_candidates=2,
                               num_threads=1, log_dir=tmp_path)
    run = compiled.opro_run
    scored = [c for c in run.candidates if c.status == "scored"]
    assert len(scored) == 3
    for candidate in scored:
        assert candidate.error_count == 2 and candidate.failed == [1, 3]
        assert candidate.errors == [ErrorRecord(error="KeyError: 'total'", example=1, split="train", count=2)]
    warnings = [r.getMessage() for r in caplog.records if "the program raised" in r.getMessage()]
    assert len(warnings) == 3  # one per candidate
    assert all("on 2 training evaluations" in w and "example 1: KeyError: 'total'" in w for w in warnings)
    assert sorted(int(w.split()[1].rstrip(":")) for w in warnings) == [c.id for c in scored]

    saved = load_state(tmp_path)
    assert [c.error_count for c in saved.candidates if c.status == "scored"] == [2, 2, 2]
    report = (tmp_path / REPORT_FILE).read_text()
    assert "## Program errors" in report and report.count("KeyError: 'total'") == 3
    step_report = (tmp_path / "steps" / "000" / "report.md").read_text()
    assert "## Program errors" in step_report and step_report.count("KeyError: 'total'") == 2
    assert len(kinds(endpoint, "task")) == 4 * 3  # the program still called the model on every example


# ---------------------------------------------------------------------------- 2. a program that cannot run stops


@pytest.mark.slow
def test_a_program_that_raises_on_every_example_stops_before_any_optimizer_call(endpoint, tmp_path):
    train = simulated_dataset(4)
    program = RaisesOn({ex.question for ex in train}, NameError("name 'anwser' is not defined"), before_lm=True)
    with pytest.raises(ProgramError) as excinfo:
        compile_run(endpoint, trainset=train, program=program, num_steps=2, num_threads=1, log_dir=tmp_path)
    message = str(excinfo.value)
    assert "raised on all 4 training examples" in message
    assert "example 0: NameError: name 'anwser' is not defined" in message
    assert endpoint.requests == []  # no task call (the program raised first) and no optimizer call
    saved = load_state(tmp_path)
    assert saved.status == "failed" and saved.stop_reason.startswith("ProgramError: ")
    assert saved.candidates[0].error_count == 4 and saved.steps == []


# --------------------------------------------------------------------------- 3. fatal LM errors stop at once


@pytest.mark.slow
@pytest.mark.slow
@pytest.mark.parametrize(("fault", "error_type"), [("auth_error", "LMAuthError"),
                                                    ("permission_denied", "LMAuthError"),
                                                    ("model_not_found", "LMUnsupportedModelError")])
@pytest.mark.parametrize("role", ["optimizer", "task", "judge"])
def test_a_fatal_answer_stops_the_run_at_once_naming_the_model(endpoint, tmp_path, fault, error_type, role):
    refusing = SimulatedEndpoint(faults=FaultConfig(fail_requests=set(range(1000)), fail_kind=fault)).start()
    try:
        train = simulated_dataset(3)
        models = {"optimizer": lm(endpoint, OPT), "task": lm(endpoint, TASK), "judge": lm(endpoint, JUDGE)}
        # DSPy's default num_retries=3: a fatal answer is still asked only once.
        models[role] = refusing.lm({"optimizer": OPT, "task": TASK, "judge": JUDGE}[role])
        teleprompter = OPROTeleprompter(PairwisePreference(judge_model=models["judge"]),
                                        prompt_model=models["optimizer"], task_model=models["task"], num_steps=2,
                                        num_candidates=2, num_threads=1, log_dir=tmp_path)
        with pytest.raises(FatalLMError) as excinfo:
            teleprompter.compile(dspy.Predict("question -> answer"), trainset=train)
        refused = refusing.requests
    finally:
        refusing.stop()
    model = {"optimizer": OPT, "task": TASK, "judge": JUDGE}[role]
    assert f"{role} model {model!r}" in str(excinfo.value) and error_type in str(excinfo.value)
    assert len(refused) == 1 and refused[0].status in (401, 403, 404)  # one request: no retry of a fatal error
    saved = load_state(tmp_path)
    assert saved.status == "failed" and "FatalLMError" in saved.stop_reason
    assert (tmp_path / REPORT_FILE).is_file()
    if role == "optimizer":  # refused at step 0's call: the start was scored first, and saved
        assert (saved.steps, saved.selection, [c.status for c in saved.candidates]) == ([], None, ["scored"])
        assert [r.status for r in kinds(endpoint, "task")] == [200] * len(train)


@pytest.mark.slow
@pytest.mark.parametrize("role", ["prompt_model", "task_model", "judge_model"])
@pytest.mark.parametrize(("model", "message"), [("openai/gpt-4o", "has no API key: set OPENAI_API_KEY"),
                                                ("not-a-real-model", "names no provider LiteLLM knows")])
def test_a_missing_key_or_unknown_provider_stops_before_any_call(endpoint, monkeypatch, role, model, message):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    models = {"prompt_model": lm(endpoint, OPT), "task_model": lm(endpoint, TASK), "judge_model": lm(endpoint, JUDGE)}
    models[role] = model  # a LiteLLM model string, as a user writes it
    metric = PairwisePreference(judge_model=models.pop("judge_model"))
    teleprompter = OPROTeleprompter(metric, num_steps=1, num_candidates=2, **models)
    with pytest.raises(FatalLMError, match=message) as excinfo:
        teleprompter.compile(dspy.Predict("question -> answer"), trainset=simulated_dataset(3))
    assert repr(model) in str(excinfo.value)
    assert endpoint.requests == []


@pytest.mark.slow
def test_the_real_missing_key_and_unknown_provider_exceptions_are_classified_fatal(monkeypatch):
    # What LiteLLM and DSPy 3.4.1 really raise (probed): a missing OpenAI key arrives as the retryable
    # LMServerError around openai.OpenAIError, an unknown provider as LMInvalidRequestError.
    from dspy.utils.exceptions import LMInvalidRequestError, LMServerError

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    raised = []
    for model in ("openai/gpt-4o", "not-a-real-model"):
        with pytest.raises(Exception) as excinfo:
            dspy.LM(model, engine="litellm", num_retries=0, cache=False)("hi")
        raised.append(excinfo.value)
    assert [type(e) for e in raised] == [LMServerError, LMInvalidRequestError]
    assert [classify_exception(e) for e in raised] == ["fatal", "fatal"]
    with pytest.raises(FatalLMError, match="OPENAI_API_KEY"):
        check_model_ready(dspy.LM("openai/gpt-4o", engine="litellm"), "optimizer")
    check_model_ready(dspy.LM("openai/gpt-4o", engine="litellm", api_key="k"), "optimizer")  # a key: no error


def test_the_up_front_key_check_accepts_every_way_of_passing_credentials(monkeypatch):
    for name in ("GEMINI_API_KEY", "GOOGLE_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(FatalLMError, match="'gemini/gemini-pro' has no API key: set .*GEMINI_API_KEY"):
        check_model_ready(dspy.LM("gemini/gemini-pro", engine="litellm"), "task")
    monkeypatch.setenv("GEMINI_API_KEY", "k")
    check_model_ready(dspy.LM("gemini/gemini-pro", engine="litellm"), "task")  # either of its variables will do
    # A self-hosted server needs no key; the OpenAI client does, even with an api_base.
    check_model_ready(dspy.LM("hosted_vllm/m", engine="litellm", api_base="http://127.0.0.1:1/v1"), "task")
    with pytest.raises(FatalLMError, match="OPENAI_API_KEY"):
        check_model_ready(dspy.LM("openai/m", engine="litellm", api_base="http://127.0.0.1:1/v1"), "task")
    check_model_ready(dspy.LM("openai/m", api_base="http://127.0.0.1:1/v1"), "task")  # native engine: its own check


# ---------------------------------------------------------------------------- 4. optimizer failures are visible


@pytest.mark.slow
def test_empty_choices_from_the_optimizer_are_a_failed_call_retried_and_logged(endpoint, caplog):
    # Requests 0-3 score the start; step 0's n=3 request answers no choices twice (4, 5); step 1's once (6), then
    # its retry (7) brings 3 replies.
    endpoint.faults = FaultConfig(fail_requests={4, 5, 6}, fail_kind="empty_choices", only_kinds={"opro"})
    with caplog.at_level(logging.WARNING, logger="dspy_opro"):
        compiled = compile_run(endpoint, trainset=simulated_dataset(4), num_steps=2, num_candidates=3, num_threads=1)
    first, second = compiled.opro_run.steps
    empty = "EmptyResponseError: the optimizer model answered with no choices"
    assert (first.failed_calls, first.errors, first.replies) == (1, [empty], [])
    assert (second.failed_calls, second.errors, len(second.replies)) == (0, [], 3)
    warned = [r.getMessage() for r in caplog.records if r.name == "dspy_opro.core.proposals"]
    assert len(warned) == 3 and all(empty in w for w in warned)
    assert [(r.n, r.status) for r in kinds(endpoint, "opro")] == [(3, 200)] * 4


# --------------------------------------------------------------------------------------- 5. providers without n


@pytest.mark.slow
def test_a_provider_ignoring_n_gets_the_missing_choices_as_single_requests(endpoint, caplog):
    # Request 4 (step 0's n=3 request) is answered with one choice: the other two are asked one by one, and
    # step 1 asks three single-choice requests from the start.
    endpoint.faults = FaultConfig(fail_requests={4}, fail_kind="one_choice", only_kinds={"opro"})
    with caplog.at_level(logging.WARNING, logger="dspy_opro"):
        compiled = compile_run(endpoint, trainset=simulated_dataset(4), num_steps=2, num_candidates=3, num_threads=1)
    run = compiled.opro_run
    assert [len(s.replies) for s in run.steps] == [3, 3]
    assert [s.failed_calls for s in run.steps] == [0, 0]
    assert [(r.n, r.status) for r in kinds(endpoint, "opro")] == [(3, 200)] + [(1, 200)] * 5
    step0 = [r for r in kinds(endpoint, "opro")][:3]
    assert len({r.messages[-1]["content"] for r in step0}) == 1  # the same meta-prompt
    assert len({reply.text for reply in run.steps[0].replies}) == 3  # three distinct samples
    notices = [r.getMessage() for r in caplog.records if "does not honour n" in r.getMessage()]
    assert len(notices) == 1 and "answered a request for 3 choices with 1" in notices[0]


def test_a_reply_with_null_content_is_an_empty_reply_not_the_instruction_none(endpoint):
    # Request 4 (step 0's n=3 request) comes back 200 with "content": null in each choice: an empty reply and two
    # repeats of it, none scored (no task request for them), and step 1 proposes as usual.
    endpoint.faults = FaultConfig(fail_requests={4}, fail_kind="null_content", only_kinds={"opro"})
    compiled = compile_run(endpoint, trainset=simulated_dataset(4), num_steps=2, num_candidates=3, num_threads=1)
    run = compiled.opro_run
    first, second = run.steps
    assert [(r.text, r.fate) for r in first.replies] == [("", "empty"), ("", "duplicate"), ("", "duplicate")]
    assert {str(run.candidates[r.candidate_id].status) for r in first.replies} == {"skipped"}
    assert "None" not in [c.instruction for c in run.candidates]
    new = sum(r.fate == "new" for r in second.replies)
    assert new > 0 and len(kinds(endpoint, "task")) == 4 * (1 + new)


# ------------------------------------------------------------------------------------------ 6. baseline is scored


@pytest.mark.slow
def test_start_examples_an_outage_left_unscored_are_retried_before_step_0(endpoint):
    # Example 0 of the start fails twice (request 0 and its retry 1): the start is scored again on example 0 only.
    endpoint.faults = FaultConfig(fail_requests={0, 1}, fail_kind="server_error", only_kinds={"task"})
    train = simulated_dataset(4)
    compiled = compile_run(endpoint, trainset=train, num_steps=1, num_candidates=2, num_threads=1)
    run = compiled.opro_run
    start_requests = [(r.status) for r in kinds(endpoint, "task")[:6]]
    assert start_requests == [500, 500, 200, 200, 200, 200]
    assert run.candidates[0].status == "scored" and None not in run.candidates[0].scores
    assert f"text:\n{START}\nscore:" in run.steps[0].meta_prompt


@pytest.mark.slow
def test_a_start_that_cannot_be_scored_stops_before_any_optimizer_call(endpoint, tmp_path):
    endpoint.faults = FaultConfig(server_error=1.0, only_kinds={"task"})
    with pytest.raises(OPRORunError, match="the program as given could not be scored") as excinfo:
        compile_run(endpoint, trainset=simulated_dataset(3), num_steps=2, num_threads=1, log_dir=tmp_path)
    assert "LMServerError" in str(excinfo.value)
    assert len(kinds(endpoint, "opro")) == 0
    assert len(kinds(endpoint, "task")) == 3 * 2 * 2  # 3 examples x (try + retry) x (first pass + second pass)
    assert load_state(tmp_path).status == "failed"


# ------------------------------------------------------------------------------------ 7. LM errors in the metric


def judged_metric(judge: dspy.LM):
    def metric(example, prediction, trace=None):
        judge(f"Is {prediction.answer!r} right?")
        return simulated_metric(example, prediction)

    return metric


@pytest.mark.slow
def test_a_fatal_error_of_an_lm_inside_the_metric_stops_the_run():
    with SimulatedEndpoint() as endpoint, SimulatedEndpoint(faults=FaultConfig(auth_error=True)) as judge:
        with pytest.raises(FatalLMError, match="model inside the metric") as excinfo:
            compile_run(endpoint, trainset=simulated_dataset(3), metric=judged_metric(lm(judge, JUDGE)),
                        num_steps=1, num_threads=1)
        assert "LMAuthError" in str(excinfo.value) and "sim-judge" in str(excinfo.value)
        assert len(judge.requests) == 1 and len(kinds(endpoint, "opro")) == 0


@pytest.mark.slow
def test_a_transport_error_inside_the_metric_is_retried_once():
    # The judge's first answer (request 0) is a 500: the metric runs again and the example is scored.
    faults = FaultConfig(fail_requests={0}, fail_kind="server_error")
    with SimulatedEndpoint() as endpoint, SimulatedEndpoint(faults=faults) as judge:
        compiled = compile_run(endpoint, trainset=simulated_dataset(3), metric=judged_metric(lm(judge, JUDGE)),
                               num_steps=1, num_candidates=1, num_threads=1)
        statuses = [r.status for r in judge.requests]
    start = compiled.opro_run.candidates[0]
    assert start.status == "scored" and start.error_count == 0
    assert statuses[:4] == [500, 200, 200, 200]


@pytest.mark.slow
def test_label_free_anchor_broken_by_an_outage_is_retried_and_failing_candidates_are_judged(tmp_path):
    # The start's first example fails twice (task requests 0, 1): no anchor is stored from the outage; the start is
    # run again on it. Candidates raise on every example (their instruction differs from the start's) and are still
    # judged against the anchors.
    train = simulated_dataset(3)

    class FailsWhenChanged(dspy.Module):
        def __init__(self):
            super().__init__()
            self.predict = dspy.Predict("question -> answer")

        def forward(self, question):
            prediction = self.predict(question=question)
            if self.predict.signature.instructions != START:
                raise ValueError("the output has no number")
            return prediction

    faults = FaultConfig(fail_requests={0, 1}, fail_kind="server_error", only_kinds={"task"})
    with SimulatedEndpoint(faults=faults) as endpoint:
        teleprompter = OPROTeleprompter(PairwisePreference(judge_model=lm(endpoint, JUDGE)),
                                        prompt_model=lm(endpoint, OPT), task_model=lm(endpoint, TASK), num_steps=1,
                                        num_candidates=2, num_threads=1, log_dir=tmp_path)
        compiled = teleprompter.compile(FailsWhenChanged(), trainset=train)
        judge_requests = [r for r in endpoint.requests if r.model == "sim-judge"]
    run = compiled.opro_run
    assert sorted(run.anchors) == ["train:0", "train:1", "train:2"]
    assert all("LMServerError" not in text and "failed" not in text for text in run.anchors.values())
    candidates = [c for c in run.candidates if c.step == 0 and c.status == "scored"]
    assert len(candidates) == 2
    assert all(c.error_count == 3 and c.errors[0].error == "ValueError: the output has no number" for c in candidates)
    assert len(judge_requests) == 3 * len(candidates)  # every failing run was judged
    assert all(judge.kind == "judge" for judge in judge_requests)
    trajectories = [r.messages[-1]["content"] for r in judge_requests]
    assert all("The program failed: ValueError: the output has no number" in text for text in trajectories)


# ------------------------------------------------------------------------------ 8. interrupted and failed runs


@pytest.fixture
def ctrl_c_raises():
    """SIGINT raises KeyboardInterrupt in the main thread, as in a terminal (a suite started in the background has
    it ignored)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.mark.slow
@pytest.mark.usefixtures("ctrl_c_raises")
def test_ctrl_c_marks_the_run_interrupted_writes_the_report_and_says_how_to_resume(endpoint, tmp_path, caplog):
    calls = [0]

    def interrupting_metric(example, prediction, trace=None):
        calls[0] += 1
        if calls[0] == 6:
            signal.raise_signal(signal.SIGINT)  # Ctrl-C: Python raises KeyboardInterrupt in the main thread
        return simulated_metric(example, prediction)

    with caplog.at_level(logging.ERROR, logger="dspy_opro"), pytest.raises(KeyboardInterrupt):
        compile_run(endpoint, trainset=simulated_dataset(4), metric=interrupting_metric, num_steps=2,
                    num_candidates=2, num_threads=1, log_dir=tmp_path)
    saved = load_state(tmp_path)
    assert saved.status == "interrupted" and saved.stop_reason == "interrupted by the user (KeyboardInterrupt)"
    report = (tmp_path / REPORT_FILE).read_text()
    assert "- Status: interrupted" in report and "- Resume: compile again with the same `log_dir`" in report
    lines = [r.getMessage() for r in caplog.records if RESUME_HINT in r.getMessage()]
    assert len(lines) == 1 and str(tmp_path) in lines[0] and lines[0].startswith("OPRO run interrupted")

    resumed = compile_run(endpoint, trainset=simulated_dataset(4), metric=interrupting_metric, num_steps=2,
                          num_candidates=2, num_threads=1, log_dir=tmp_path)
    assert resumed.opro_run.status == "finished" and resumed.opro_run.stop_reason is None


@pytest.mark.slow
def test_a_broken_metric_marks_the_run_failed_with_the_reason(endpoint, tmp_path, caplog):
    def broken_metric(example, prediction, trace=None):
        return None

    with caplog.at_level(logging.ERROR, logger="dspy_opro"), pytest.raises(MetricError):
        compile_run(endpoint, trainset=simulated_dataset(3), metric=broken_metric, num_steps=1, num_threads=1,
                    log_dir=tmp_path)
    saved = load_state(tmp_path)
    assert saved.status == "failed" and saved.stop_reason.startswith("MetricError: the metric failed on")
    assert "- Status: failed" in (tmp_path / REPORT_FILE).read_text()
    lines = [r.getMessage() for r in caplog.records if RESUME_HINT in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("OPRO run failed: MetricError")


def test_a_keyboard_interrupt_raised_by_the_metric_is_named_as_code_not_as_the_user(endpoint, tmp_path):
    def stopping_metric(example, prediction, trace=None):
        if example.question == simulated_dataset(3)[1].question:
            raise KeyboardInterrupt("stop")
        return simulated_metric(example, prediction)

    with pytest.raises(ProgramError) as raised:
        compile_run(endpoint, trainset=simulated_dataset(3), metric=stopping_metric, num_steps=1, num_threads=1,
                    log_dir=tmp_path)
    assert str(raised.value).startswith("the metric raised KeyboardInterrupt itself on training example 1 (")
    assert "(code asking the run to stop, not Ctrl-C, which never lands on an evaluation's thread). Remove that " \
           "raise; then compile again with the same log_dir to resume." in str(raised.value)
    saved = load_state(tmp_path)
    assert saved.status == "failed" and saved.stop_reason.startswith("ProgramError: the metric raised KeyboardInter")
    assert saved.usage.task.calls == endpoint.count("task") == 2  # the paid evaluation's usage is kept


@pytest.mark.usefixtures("ctrl_c_raises")
def test_a_second_ctrl_c_while_the_record_is_written_leaves_it_written(endpoint, tmp_path, monkeypatch):
    from dspy_opro.record.recorder import RunRecorder

    calls, real_save = [0], RunRecorder.save

    def interrupting_metric(example, prediction, trace=None):
        calls[0] += 1
        if calls[0] == 2:
            signal.raise_signal(signal.SIGINT)
        return simulated_metric(example, prediction)

    def save_with_a_second_ctrl_c(self, state, *, final=False):
        if final:
            signal.raise_signal(signal.SIGINT)  # the user presses Ctrl-C again as the record is written
        return real_save(self, state, final=final)

    monkeypatch.setattr(RunRecorder, "save", save_with_a_second_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        compile_run(endpoint, trainset=simulated_dataset(3), metric=interrupting_metric, num_steps=1,
                    num_threads=1, log_dir=tmp_path)
    saved = load_state(tmp_path)
    assert saved.status == "interrupted" and saved.stop_reason == "interrupted by the user (KeyboardInterrupt)"
    assert "- Status: interrupted" in (tmp_path / REPORT_FILE).read_text()


# ------------------------------------------------------------------------------------------------ 9. bad log_dir


def test_a_log_dir_that_is_a_file_is_refused_before_any_call(endpoint, tmp_path):
    path = tmp_path / "record.json"
    path.write_text("{}")
    with pytest.raises(LogDirError, match="is a file, not a folder") as excinfo:
        compile_run(endpoint, trainset=simulated_dataset(3), num_steps=1, log_dir=path)
    assert str(path) in str(excinfo.value) and endpoint.requests == []


def test_an_unwritable_log_dir_is_refused_before_any_call(endpoint, tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr("dspy_opro.record.files.tempfile.mkstemp", refuse)
    with pytest.raises(LogDirError, match="cannot hold the run record: Permission denied") as excinfo:
        compile_run(endpoint, trainset=simulated_dataset(3), num_steps=1, log_dir=tmp_path / "run")
    assert str(tmp_path / "run") in str(excinfo.value) and endpoint.requests == []


@pytest.mark.slow
def test_a_full_disk_mid_run_keeps_what_was_saved(endpoint, tmp_path, monkeypatch):
    import dspy_opro.record.recorder as run_module  # the module that writes state.json

    real_save, saves = run_module.save_state, [0]

    def save_until_full(state, log_dir):
        saves[0] += 1
        if saves[0] > 2:  # the snapshots before step -1 and after step 0's optimizer call fit; then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(state, log_dir)

    monkeypatch.setattr(run_module, "save_state", save_until_full)
    with pytest.raises(LogDirError, match="No space left on device. What was saved before is kept; free disk space"):
        compile_run(endpoint, trainset=simulated_dataset(3), num_steps=2, num_candidates=2, num_threads=1,
                    log_dir=tmp_path)
    saved = load_state(tmp_path)
    assert saved.status == "running" and [c.status for c in saved.candidates] == ["scored", "pending", "pending"]
    assert None not in saved.candidates[0].scores
    assert len(kinds(endpoint, "opro")) == 1  # the write after step 0's scoring was the one that failed

    monkeypatch.setattr(run_module, "save_state", real_save)  # space freed: the resume starts from the snapshot
    tasks_before = len(kinds(endpoint, "task"))
    resumed = compile_run(endpoint, trainset=simulated_dataset(3), num_steps=2, num_candidates=2, num_threads=1,
                          log_dir=tmp_path)
    run = resumed.opro_run
    assert run.status == "finished"
    attempted = [c for c in run.candidates if c.status == "scored" and c.step >= 1]
    # Neither the start nor step 0's candidates ran again: the failed write never cleared the journal, whose
    # entries for step 0 were replayed into the snapshot.
    assert [c.status for c in run.candidates[:3]] == ["scored"] * 3
    assert len(kinds(endpoint, "task")) - tasks_before == 3 * len(attempted)


# ------------------------------------------------------------------------------ 10. metrics and models as users


@pytest.mark.slow
def test_a_two_argument_metric_scores_like_the_three_argument_one(endpoint):
    seen = []

    def two_args(example, prediction):
        seen.append(example.question)
        return simulated_metric(example, prediction)

    train = simulated_dataset(4)
    compiled = compile_run(endpoint, trainset=train, metric=two_args, num_steps=1, num_candidates=2, num_threads=1)
    with SimulatedEndpoint() as other:
        reference = compile_run(other, trainset=train, num_steps=1, num_candidates=2, num_threads=1)
    assert [c.scores for c in compiled.opro_run.candidates] == [c.scores for c in reference.opro_run.candidates]
    assert len(seen) == 4 * len([c for c in compiled.opro_run.candidates if c.status == "scored"])


def test_a_metric_without_two_parameters_is_refused_naming_its_signature():
    def one_arg(example):
        return 1.0

    with pytest.raises(TypeError, match=r"one_arg\(example\) cannot be called as metric\(example, prediction\)"):
        OPROTeleprompter(one_arg)


@pytest.mark.slow
def test_task_and_judge_models_accept_litellm_model_strings(endpoint, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "offline")
    monkeypatch.setenv("OPENAI_BASE_URL", endpoint.base_url)
    monkeypatch.setenv("OPENAI_API_BASE", endpoint.base_url)
    from dspy.clients.cache import Cache

    # A string becomes dspy.LM(model, engine="litellm") with DSPy's default cache on: keep it off the disk cache.
    monkeypatch.setattr(dspy, "cache", Cache(enable_disk_cache=False, enable_memory_cache=False, disk_cache_dir=""))
    teleprompter = OPROTeleprompter(PairwisePreference(judge_model=JUDGE), prompt_model=lm(endpoint, OPT),
                                    task_model=TASK, num_steps=1, num_candidates=1, num_threads=1)
    compiled = teleprompter.compile(dspy.Predict("question -> answer"), trainset=simulated_dataset(3))
    models = {r.model for r in endpoint.requests}
    assert models == {"sim-task", "sim-opt", "sim-judge"}
    assert compiled.opro_run.config["task_model"] == TASK and compiled.opro_run.config["judge_model"] == JUDGE


# ---------------------------------------------------------------------------------- 11. exemplars keep the draw


@pytest.mark.slow
def test_failed_labelled_examples_stay_in_the_exemplar_pool(endpoint):
    train = simulated_dataset(6)
    program = RaisesOn({train[2].question, train[4].question}, ValueError("no number"))
    compiled = compile_run(endpoint, trainset=train, program=program, num_steps=2, num_candidates=1,
                           num_threads=1)
    drawn = [s.exemplar_indices for s in compiled.opro_run.steps]
    assert drawn == [draw_exemplar_indices(list(range(6)), 3, step, seed=0) for step in range(2)]
    assert any(2 in indices or 4 in indices for indices in drawn)


@pytest.mark.slow
def test_only_examples_without_label_or_answer_leave_the_pool(endpoint):
    labelled = simulated_dataset(6)
    # Odd examples carry no label; the program raises on them, so they have no usable answer either.
    train = [ex if i % 2 == 0 else dspy.Example(question=ex.question).with_inputs("question")
             for i, ex in enumerate(labelled)]
    program = RaisesOn({train[i].question for i in (1, 2, 3, 5)}, ValueError("no number"))

    def metric(example, prediction, trace=None):
        return simulated_metric(example, prediction) if "answer" in example else 1.0

    compiled = compile_run(endpoint, trainset=train, program=program, metric=metric, num_steps=1,
                           num_candidates=1, num_threads=1)
    assert compiled.opro_run.steps[0].exemplar_indices == [0, 2, 4]  # 2 failed but is labelled: it stays


# ------------------------------------------------------------------------------------------ 12. odd text


@pytest.mark.slow
def test_lone_surrogates_nul_and_invalid_utf8_never_crash_a_run_or_its_resume(endpoint, tmp_path):
    # Optimizer replies end in a lone surrogate and a NUL; one task reply is not UTF-8 (a transport error, retried).
    endpoint.faults = FaultConfig(fail_requests={0}, fail_kind="invalid_utf8", only_kinds={"task"})
    train = simulated_dataset(3)
    with SimulatedEndpoint(faults=FaultConfig(fail_requests=set(range(100)), fail_kind="odd_text")) as optimizer:
        compiled = compile_run(endpoint, optimizer, trainset=train, num_steps=2, num_candidates=2, num_threads=1,
                               log_dir=tmp_path)
    run = compiled.opro_run
    texts = [reply.text for step in run.steps for reply in step.replies]
    assert len(texts) == 4 and all(text.endswith(" \ufffd \x00") for text in texts)
    saved = load_state(tmp_path)
    assert [r.text for s in saved.steps for r in s.replies] == texts
    assert json.loads((tmp_path / STATE_FILE).read_text(encoding="utf-8"))["status"] == "finished"
    assert "- Status: finished" in (tmp_path / REPORT_FILE).read_text(encoding="utf-8")
    for number, step in enumerate(saved.steps):
        folder = tmp_path / "steps" / f"{number:03d}"
        shown = json.loads((folder / "replies.json").read_text(encoding="utf-8"))
        assert [reply["text"] for reply in shown] == [reply.text for reply in step.replies]
        assert (folder / "report.md").read_text(encoding="utf-8").startswith(f"# OPRO step {number}")
    assert [r.status for r in kinds(endpoint, "task")][:2] == [200, 200]
    assert endpoint.requests[0].fault == "invalid_utf8"

    resumed = compile_run(endpoint, trainset=train, num_steps=2, num_candidates=2, num_threads=1, log_dir=tmp_path,
                          opt_model=OPT)
    assert resumed.opro_run.model_dump() == saved.model_dump()


def test_md5_and_cleaning_handle_lone_surrogates():
    # The surrogate is hashed as its three surrogatepass bytes ED A0 80; ASCII text keeps the authors' digest.
    digest = "aaa30609243ce2e41d28b6d40e8775d5"
    assert instruction_md5("a\ud800b") == hashlib.md5(b"a\xed\xa0\x80b").hexdigest() == digest
    assert instruction_md5("plain") == hashlib.md5(b"plain").hexdigest()
    assert clean_text("a\ud800b\x00") == "a\ufffdb\x00"
    assert clean_text("ok \U0001f600") == "ok \U0001f600"


# ------------------------------------------------------------------------------------- docs/failures.md is tested


def test_every_row_of_the_failures_table_names_tests_that_exist():
    root = Path(__file__).resolve().parent.parent
    text = (root / "docs" / "failures.md").read_text(encoding="utf-8")
    table = text.split("| What went wrong |", 1)[1].split("\n\n", 1)[0]
    rows = [line for line in table.splitlines()[2:] if line.startswith("|")]
    assert len(rows) == 62  # 33, four rows of issue 21 (no prediction, input keys, bad arguments, a killed run),
    # six of issue 20's optimizer calls, eleven of its resume, hang, signal and record checks and three of its
    # reply journal; five of issue 33 (an edited metric, a BaseException, a null reply, KeyboardInterrupt by code,
    # calls a failed program left running)
    for row in rows:
        named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", row.rsplit("|", 2)[1])
        assert named, row
        for path, test in named:
            assert re.search(rf"^def {test}\(", (root / path).read_text(), re.M), (path, test)
