"""An outage never silently discards work (issue 20, item 3): candidates an outage left unscored are warned about and
named in the run's status and ``report.md``, and a run in which no optimizer call ever succeeded raises, whatever
``num_steps``. Counts come from the simulated endpoint's request log.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import logging

import dspy
import pytest

from dspy_opro import CandidateStatus, OPRORunError, OPROTeleprompter
from dspy_opro.errors import OptimizerUnavailableError
from dspy_opro.record.files import load_state
from dspy_opro.record.report import REPORT_FILE
from dspy_opro.testing import FaultConfig, SimulatedEndpoint, simulated_dataset, simulated_metric

TASK, OPT = "openai/sim-task", "openai/sim-opt"


@pytest.fixture
def endpoint():
    with SimulatedEndpoint() as ep:
        yield ep


def compile_run(endpoint, *, trainset, **options):
    teleprompter = OPROTeleprompter(simulated_metric, prompt_model=endpoint.lm(OPT, num_retries=0),
                                    task_model=endpoint.lm(TASK, num_retries=0), **options)
    return teleprompter.compile(dspy.Predict("question -> answer"), trainset=trainset)


@pytest.mark.slow
def test_candidates_an_outage_left_unscored_are_warned_and_named_in_the_status_and_report(endpoint, tmp_path, caplog):
    train = simulated_dataset(4)
    # Requests 0-3 score the start, 4 is step 0's optimizer request; every task request after it fails (500).
    endpoint.faults = FaultConfig(fail_requests=set(range(5, 200)), fail_kind="server_error", only_kinds={"task"})
    with caplog.at_level(logging.WARNING, logger="dspy_opro"):
        run = compile_run(endpoint, trainset=train, num_steps=1, num_candidates=2, num_threads=1,
                          log_dir=tmp_path).opro_run
    new = [c for c in run.candidates if c.step == 0]
    assert [c.status for c in new] == [CandidateStatus.UNSCORED] * 2
    failed = [r for r in endpoint.requests if r.kind == "task" and r.status == 500]
    assert len(failed) == 2 * len(train) * 2  # two candidates, every example, one retry each
    assert run.status == "finished" and run.stop_reason == "finished with 2 candidates unscored (infrastructure)"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "unscored" in r.getMessage()]
    assert any(w.startswith("Step 0: 2 candidates left unscored by infrastructure failures after a retry (1, 2; "
                            "last: LM failures on 4 examples after a retry") for w in warnings)
    assert any("finished with 2 candidates unscored (infrastructure)" in w for w in warnings)
    assert load_state(tmp_path).stop_reason == run.stop_reason
    report = (tmp_path / REPORT_FILE).read_text()
    assert "- Status: finished with 2 candidates unscored (infrastructure)\n" in report


@pytest.mark.slow
@pytest.mark.parametrize("num_steps", [1, 2])
def test_a_run_in_which_no_optimizer_call_succeeded_raises_naming_the_model_and_the_last_error(endpoint, tmp_path,
                                                                                               num_steps):
    endpoint.faults = FaultConfig(server_error=1.0, only_kinds={"opro"})
    train = simulated_dataset(4)
    with pytest.raises(OptimizerUnavailableError) as info:
        compile_run(endpoint, trainset=train, num_steps=num_steps, num_candidates=2, num_threads=1, log_dir=tmp_path)
    message = str(info.value)
    assert message.startswith(f"no call to the optimizer model {OPT!r} succeeded in {num_steps} step")
    assert f"({num_steps} failed after a retry); last error: LMServerError" in message
    assert isinstance(info.value, OPRORunError)
    opro = [r for r in endpoint.requests if r.kind == "opro"]
    assert [(r.n, r.status) for r in opro] == [(2, 500)] * (2 * num_steps)
    saved = load_state(tmp_path)
    assert saved.status == "failed" and saved.stop_reason.startswith("OptimizerUnavailableError: no call")
    assert saved.selection is None and saved.candidates[0].status == CandidateStatus.SCORED  # the start is kept


@pytest.mark.slow
def test_a_run_whose_optimizer_answered_once_finishes(endpoint):
    train = simulated_dataset(4)
    # Step 0's request and its retry fail (4, 5); step 1's request (after step 0 scored nothing) answers.
    endpoint.faults = FaultConfig(fail_requests={4, 5}, fail_kind="server_error", only_kinds={"opro"})
    run = compile_run(endpoint, trainset=train, num_steps=2, num_candidates=2, num_threads=1).opro_run
    assert run.status == "finished" and [len(s.replies) for s in run.steps] == [0, 2]


@pytest.mark.slow
def test_an_outage_during_validation_is_warned_named_in_the_status_and_scored_on_compile_again(tmp_path, caplog):
    train, val = simulated_dataset(4), simulated_dataset(3, seed=7)
    val_questions = {example.question for example in val}

    def compile_with_valset(endpoint, log_dir):
        teleprompter = OPROTeleprompter(simulated_metric, prompt_model=endpoint.lm(OPT, num_retries=0),
                                        task_model=endpoint.lm(TASK, num_retries=0), num_steps=1, num_candidates=2,
                                        num_threads=1, log_dir=log_dir, select="validation")
        return teleprompter.compile(dspy.Predict("question -> answer"), trainset=train, valset=val).opro_run

    def validation(endpoint):
        return [r for r in endpoint.requests
                if r.kind == "task" and any(q in r.messages[-1]["content"] for q in val_questions)]

    with SimulatedEndpoint() as endpoint:
        compile_with_valset(endpoint, tmp_path / "rehearsal")  # where validation starts (deterministic requests)
        first_val = validation(endpoint)[0].index
        endpoint.reset_log()
        endpoint.faults = FaultConfig(fail_requests=set(range(first_val, first_val + 1000)), fail_kind="server_error",
                                      only_kinds={"task"})
        with caplog.at_level(logging.WARNING, logger="dspy_opro"):
            run = compile_with_valset(endpoint, tmp_path / "run")
        assert run.status == "finished" and run.selection.selected_by == "train"
        assert run.stop_reason == "finished with its validation incomplete (infrastructure): selected on training"
        assert any(m.startswith("OPRO finished with its validation incomplete (infrastructure): selected on "
                                "training, not on the valset as select='validation' asks: compiling again with the "
                                "same log_dir scores the rest of the validation") for m in caplog.messages)
        assert validation(endpoint) and all(r.status == 500 for r in validation(endpoint))
        endpoint.faults = FaultConfig()
        endpoint.reset_log()
        again = compile_with_valset(endpoint, tmp_path / "run")
        assert again.selection.selected_by == "validation" and again.stop_reason is None
        assert endpoint.count("opro") == 0 and endpoint.count("task") == len(validation(endpoint)) > 0
