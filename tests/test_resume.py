"""Crash-safe runs: SIGKILL and resume, refusal of a different run, corrupt state, Ctrl-C."""

import subprocess
import sys
from pathlib import Path

import dspy
import pytest

from dspy_opro import OPROTeleprompter
from dspy_opro.errors import StateFileError
from dspy_opro.record.files import load_state
from tests.fakes import make_lm, toy_dataset, toy_metric, toy_task_reply
from tests.resume_job import build

ROOT = Path(__file__).resolve().parent.parent


def outcome(compiled):
    run = compiled.opro_run
    return (compiled.signature.instructions,
            [(c.instruction, c.status, c.score, c.scores) for c in run.candidates],
            [(s.predictor, s.exemplar_indices, s.meta_prompt, [r.fate for r in s.replies]) for s in run.steps])


def read_pairs(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


@pytest.mark.slow  # SIGKILLs a child process running a compile
@pytest.mark.parametrize("kill_at", [12, 33])
def test_sigkill_mid_step_then_resume_matches_an_uninterrupted_run(tmp_path, kill_at):
    teleprompter, program, trainset, full_engine, _ = build(str(tmp_path / "full"))
    expected = outcome(teleprompter.compile(program, trainset=trainset))

    crash_dir, before = tmp_path / "crash", tmp_path / "before.log"
    child = subprocess.run([sys.executable, "-m", "tests.resume_job", str(crash_dir), str(before), str(kill_at)],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert child.returncode == -9, child.stderr
    assert load_state(crash_dir).status == "running"  # the last good snapshot is readable

    after = tmp_path / "after.log"
    teleprompter, program, trainset, task_engine, _ = build(str(crash_dir), str(after))
    assert outcome(teleprompter.compile(program, trainset=trainset)) == expected

    scored_before, in_flight = read_pairs(before)[:-1], read_pairs(before)[-1]
    rerun = set(scored_before) & set(read_pairs(after))
    assert rerun == set(), f"evaluations scored before the kill were run again: {sorted(rerun)}"
    assert in_flight in read_pairs(after)  # the evaluation cut off by the kill is the only one repeated
    assert len(read_pairs(before)) + len(read_pairs(after)) == len(full_engine.requests) + 1


def test_a_finished_run_returns_its_result_without_lm_calls(finished_job_template, finished_job):
    teleprompter, program, trainset, task_engine, opt_engine = build(str(finished_job))
    again = teleprompter.compile(program, trainset=trainset)
    assert task_engine.requests == [] and opt_engine.requests == []
    assert outcome(again) == outcome(finished_job_template[1])


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"num_candidates": 2}, "the optimizer configuration"),
        ({"metric": lambda example, prediction, trace=None: 1.0}, "the optimizer configuration"),
        ({"trainset": toy_dataset(4)}, "the trainset"),
        ({"program": dspy.Predict(dspy.Signature("question -> answer", "Other."))},
         "the program's structure, instructions or demos"),
    ],
)
def test_a_different_run_under_the_same_log_dir_is_refused(finished_job, change, named):
    task_lm, task_engine = make_lm(toy_task_reply)
    options = {"num_steps": 4, "num_candidates": 3, "num_threads": 1, "log_dir": str(finished_job)}
    options.update({k: v for k, v in change.items() if k == "num_candidates"})
    other = OPROTeleprompter(change.get("metric", toy_metric), prompt_model=task_lm, task_model=task_lm, **options)
    with pytest.raises(StateFileError, match=f"belongs to a different run: {named}"):
        other.compile(change.get("program", dspy.Predict("question -> answer")),
                      trainset=change.get("trainset", toy_dataset(5)), valset=change.get("valset"))
    assert task_engine.requests == []


def test_a_truncated_state_file_is_a_clear_error(finished_job):
    state_file = finished_job / "state.json"
    state_file.write_text(state_file.read_text()[:500])
    teleprompter, program, trainset, task_engine, _ = build(str(finished_job))
    with pytest.raises(StateFileError, match="is corrupt"):
        teleprompter.compile(program, trainset=trainset)
    assert task_engine.requests == []


def test_ctrl_c_saves_state_before_propagating_and_the_run_resumes(tmp_path, monkeypatch):
    from dspy_opro.core.run import OPRORun

    calls, results = [0], [0]
    record_result = OPRORun.record_result

    def task(request):
        calls[0] += 1
        return toy_task_reply(request)

    def ctrl_c_at_the_ninth_result(self, result):
        # Ctrl-C reaches the main thread while the 9th evaluation's result comes in: it was paid, not recorded.
        results[0] += 1
        if results[0] == 9:
            raise KeyboardInterrupt
        return record_result(self, result)

    monkeypatch.setattr(OPRORun, "record_result", ctrl_c_at_the_ninth_result)
    task_lm, _ = make_lm(task)
    opt_lm, _ = make_lm(lambda request: "<INS>Better.</INS>")
    teleprompter = OPROTeleprompter(toy_metric, prompt_model=opt_lm, task_model=task_lm, num_steps=1,
                                    num_candidates=1, num_threads=1, log_dir=str(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        teleprompter.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(5))
    saved = load_state(tmp_path)
    assert saved.status == "interrupted" and saved.candidates[0].status == "scored"
    assert calls[0] == 9
    monkeypatch.setattr(OPRORun, "record_result", record_result)
    resumed = teleprompter.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(5))
    assert resumed.signature.instructions == "Better."
    assert resumed.opro_run.candidates[1].score == 1 / 5
    assert calls[0] == 11  # 5 + 5 evaluations, plus the one in flight when Ctrl-C came, run once more


def test_a_budget_below_the_trainset_is_refused_up_front():
    task_lm, engine = make_lm(toy_task_reply)
    optimizer = OPROTeleprompter(toy_metric, prompt_model=task_lm, task_model=task_lm, max_metric_calls=4)
    with pytest.raises(ValueError, match="max_metric_calls=4 cannot even score the program as given"):
        optimizer.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(5))
    assert engine.requests == []


def test_resuming_an_unfinished_run_scores_again_what_an_outage_left_unscored(tmp_path):
    from dspy.lm15 import AuthError, ServerError

    from tests.fakes import instruction_of, scripted_optimizer

    healthy = [False]

    def task(request):
        instruction = instruction_of(request)
        if not healthy[0] and "Flaky" in instruction:
            return ServerError("outage")
        if not healthy[0] and "Revoked" in instruction:
            return AuthError("key revoked")
        return toy_task_reply(request)

    def compile_run():
        task_lm, task_engine = make_lm(task)
        opt_lm, _ = make_lm(scripted_optimizer(["<INS>Flaky better better.</INS>", "<INS>Revoked better.</INS>"]))
        optimizer = OPROTeleprompter(toy_metric, prompt_model=opt_lm, task_model=task_lm, num_steps=2,
                                     num_candidates=1, num_threads=1, log_dir=str(tmp_path))
        return optimizer.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(5)), task_engine

    with pytest.raises(Exception, match="API key"):
        compile_run()
    assert load_state(tmp_path).candidates[1].status == "unscored"
    healthy[0] = True
    compiled, task_engine = compile_run()
    flaky = compiled.opro_run.candidates[1]
    assert (flaky.instruction, flaky.status, flaky.score) == ("Flaky better better.", "scored", 2 / 5)
    assert compiled.signature.instructions == "Flaky better better."
    calls = [instruction_of(request) for request in task_engine.requests]
    assert calls.count("Flaky better better.") == 5 and calls.count("Revoked better.") == 5


def test_a_resumed_run_logs_what_is_left_not_the_whole_plan(tmp_path, caplog):
    import logging

    from dspy_opro.testing import SimulatedEndpoint, simulated_dataset, simulated_metric

    with SimulatedEndpoint() as endpoint:
        def compile_run(num_steps):
            optimizer = OPROTeleprompter(simulated_metric, prompt_model=endpoint.lm("openai/sim-opt"),
                                         task_model=endpoint.lm("openai/sim-task"), num_steps=num_steps,
                                         num_candidates=2, num_threads=2, log_dir=str(tmp_path))
            return optimizer.compile(dspy.Predict("question -> answer"), trainset=simulated_dataset(4))

        first = compile_run(1).opro_run
        done = first.metric_calls
        endpoint.reset_log()
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="dspy_opro"):
            second = compile_run(2).opro_run
        plan_lines = [m for m in caplog.messages if m.startswith("OPRO plan:")]
        resumed = [m for m in caplog.messages if m.startswith("OPRO resumes:")]
        assert plan_lines == [] and resumed == [
            f"OPRO resumes: {done} evaluations and 1 of 2 steps are already in the record; left: at most "
            f"{4 * (1 + 2 * 2) - done} program runs with the metric and 1 optimizer requests"]
        new = sum(reply.fate == "new" for reply in second.steps[1].replies)
        assert (endpoint.count("opro"), endpoint.count("task")) == (1, 4 * new)
        assert second.metric_calls == done + 4 * new
