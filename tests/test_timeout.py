"""Nothing hangs (issue 20, item 4): ``timeout`` abandons an evaluation that overruns, and Ctrl-C ends a run at once.

A hung request (the endpoint's ``hang`` fault) or a program that never returns is abandoned after ``timeout``
seconds, retried once, then left unscored as an infrastructure failure; the run ends without waiting for the
thread. Counts come from the simulated endpoint's request log.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import dspy
import pytest

from dspy_opro import OPROTeleprompter
from dspy_opro.record.files import load_state
from dspy_opro.testing import FaultConfig, SimulatedEndpoint, simulated_dataset, simulated_metric
from tests.kill_job import TASK

pytestmark = pytest.mark.slow  # end to end against the simulated endpoint, with runs that wait out a timeout

ROOT = Path(__file__).resolve().parent.parent
START = "Given the fields `question`, produce the fields `answer`."


def journaled_count(log_dir: Path) -> int:
    """The run's evaluation count on the last whole line of its journal (0 before the first)."""
    journal = log_dir / "progress.jsonl"
    if not journal.exists():
        return 0
    counts = [0]
    for line in journal.read_text(encoding="utf-8").splitlines():
        try:
            counts.append(int(json.loads(line).get("m", 0)))
        except (ValueError, AttributeError):
            continue  # a line being written
    return max(counts)


def warm(endpoint) -> None:
    """One call before the run, so LiteLLM's first-call set-up is not timed as an evaluation."""
    endpoint.lm("openai/sim-task", num_retries=0)("Warm up.")
    endpoint.reset_log()


def teleprompter(endpoint, **options) -> OPROTeleprompter:
    return OPROTeleprompter(simulated_metric, prompt_model=endpoint.lm("openai/sim-opt", num_retries=0),
                            task_model=endpoint.lm("openai/sim-task", num_retries=0), **options)


def test_a_hung_request_is_abandoned_after_the_timeout_and_retried():
    hang = FaultConfig(fail_requests={2}, fail_kind="hang", hang_seconds=120, only_kinds={"task"})
    with SimulatedEndpoint() as endpoint:
        warm(endpoint)
        endpoint.faults = hang
        began = time.monotonic()
        compiled = teleprompter(endpoint, num_steps=1, num_candidates=1, num_threads=1, timeout=1.0).compile(
            dspy.Predict("question -> answer"), trainset=simulated_dataset(4))
        elapsed = time.monotonic() - began
        tasks = [r for r in endpoint.requests if r.kind == "task"]
        hung = [r for r in tasks if r.fault == "hang"]
        # The hung request was never answered while the run went on and ended: it did not wait for it.
        assert len(hung) == 1 and hung[0].status == 0
        print(f"a hung request with timeout=1 s: the run ended {elapsed:.1f} s after it started")
    run = compiled.opro_run
    assert run.status == "finished" and run.candidates[0].status == "scored"
    assert None not in run.candidates[0].scores
    assert len(tasks) == 4 + 1 + 4  # the start (its example 2 twice: the hung try and the retry), one candidate
    assert run.metric_calls == 8 and run.usage.task.calls == 8
    assert elapsed < 60  # far below the hang's 120 s


RELEASE = threading.Event()  # module-level: a program's attributes are deep-copied, an Event cannot be


class Stuck(dspy.Module):
    """A program that never returns on one question (until released) once its instruction is not the start's."""

    def __init__(self, question: str):
        super().__init__()
        self.predict = dspy.Predict("question -> answer")
        self.question = question

    def forward(self, question):
        if self.predict.signature.instructions != START and question == self.question:
            RELEASE.wait()
        return self.predict(question=question)


def test_a_program_that_never_returns_is_unscored_then_scored_by_the_next_compile(tmp_path):
    train, release = simulated_dataset(4), RELEASE
    release.clear()
    try:
        with SimulatedEndpoint() as endpoint:
            warm(endpoint)
            compiled = teleprompter(endpoint, num_steps=1, num_candidates=1, num_threads=1, timeout=0.5,
                                    log_dir=tmp_path).compile(Stuck(train[0].question), trainset=train)
            run = compiled.opro_run
            stuck = run.candidates[1]
            assert run.status == "finished" and stuck.status == "unscored"
            assert "TimeoutError" in stuck.reason and "timeout=0.5 s" in stuck.reason
            assert stuck.scores[0] is None and None not in stuck.scores[1:]
            assert compiled.predict.signature.instructions == START
            # The stuck example never reached the LM: the candidate paid for examples 1 to 3 only.
            assert endpoint.count("task") == 4 + 3
            release.set()  # the program returns now: compiling again scores exactly the stuck example
            # The two abandoned runs (the try and its retry) go on in their threads and call the LM late: the
            # provider bills them, the run never reads them.
            deadline = time.monotonic() + 30
            while endpoint.count("task") < 4 + 3 + 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert endpoint.count("task") == 4 + 3 + 2
            assert run.usage.task.calls == 4 + 3
            endpoint.reset_log()
            again = teleprompter(endpoint, num_steps=1, num_candidates=1, num_threads=1, timeout=0.5,
                                 log_dir=tmp_path).compile(Stuck(train[0].question), trainset=train)
            assert endpoint.count("task") == 1 and endpoint.count("opro") == 0
            assert again.opro_run.candidates[1].status == "scored"
    finally:
        release.set()


@pytest.mark.parametrize("background", [False, True], ids=["terminal", "background job"])
def test_ctrl_c_during_a_hung_request_ends_the_run_at_once_and_the_resume_rebuys_nothing(tmp_path, background):
    """From a terminal, SIGINT ends the run at once and saves it. A job a script started in the background has
    SIGINT ignored (the shell starts it so, and Python then raises no KeyboardInterrupt): the run goes on, and
    SIGTERM, as docs/failures.md advises, ends it; either way the resume buys only the evaluation that hung."""
    options = {"num_steps": 1, "num_threads": 2, "timeout": None}
    with SimulatedEndpoint() as reference:
        from tests.kill_job import build, datasets

        trainset, valset = datasets()
        teleprompter_, program = build(reference.base_url, str(tmp_path / "reference"), "train", **options)
        expected = teleprompter_.compile(program, trainset=trainset, valset=valset).opro_run
        uninterrupted = Counter(json.dumps(r.messages, sort_keys=True) for r in reference.requests
                                if r.status == 200 and r.kind == "task")
    hang = FaultConfig(fail_requests={9}, fail_kind="hang", hang_seconds=600, only_kinds={"task"})
    # Set the disposition either way: pytest itself may run with SIGINT ignored (a suite started with ``&``).
    disposition = signal.SIG_IGN if background else signal.SIG_DFL
    with SimulatedEndpoint(faults=hang) as endpoint:
        child = subprocess.Popen([sys.executable, "-m", "tests.kill_job", endpoint.base_url, str(tmp_path / "run"),
                                  "train", TASK, "train", "1000", json.dumps(options)], cwd=ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 preexec_fn=lambda: signal.signal(signal.SIGINT, disposition))
        try:
            deadline = time.monotonic() + 600  # generous: a loaded machine runs the child slowly
            # Every evaluation but the hung one finishes (6 of the start, 12 of step 0, less the hung one); then
            # the run has nothing left but to wait.
            # Served is not yet recorded: wait until the child has journaled its 17th evaluation, so the signal
            # cannot land while the last answer is still on its way through the client.
            while journaled_count(tmp_path / "run") < 17 and time.monotonic() < deadline and child.poll() is None:
                time.sleep(0.05)
            assert endpoint.count("task") == 17 and journaled_count(tmp_path / "run") == 17 and child.poll() is None
            sent = time.monotonic()
            child.send_signal(signal.SIGINT)
            if background:
                with pytest.raises(subprocess.TimeoutExpired):
                    child.wait(timeout=3)  # ignored: the run waits on
                child.send_signal(signal.SIGTERM)
            try:
                _, stderr = child.communicate(timeout=300)
            except subprocess.TimeoutExpired:
                child.send_signal(signal.SIGUSR1)  # the kill job dumps every thread's stack (faulthandler)
                time.sleep(2)
                child.kill()
                _, stuck = child.communicate()
                pytest.fail(f"the run did not end within 300 s of the signal; its stderr ends:\n{stuck[-6000:]}")
            ended = time.monotonic() - sent
        finally:
            if child.poll() is None:
                child.kill()
        print(f"{'SIGINT ignored, then SIGTERM' if background else 'Ctrl-C'} during a hung request: the process ended "
              f"{ended:.2f} s after the SIGINT")
        saved = load_state(tmp_path / "run")
        if background:
            assert child.returncode == -signal.SIGTERM and "KeyboardInterrupt" not in stderr
            assert saved.status == "running"  # nothing saved at the end: the journal holds the 17 evaluations
        else:
            assert child.returncode != 0 and "KeyboardInterrupt" in stderr
            assert saved.status == "interrupted" and saved.metric_calls == 17
        endpoint.faults = FaultConfig()
        before = [json.dumps(r.messages, sort_keys=True) for r in endpoint.requests
                  if r.status == 200 and r.kind == "task"]
        from tests.kill_job import build, datasets

        teleprompter_, program = build(endpoint.base_url, str(tmp_path / "run"), "train", **options)
        resumed = teleprompter_.compile(program, trainset=trainset, valset=valset).opro_run
        after = [json.dumps(r.messages, sort_keys=True) for r in endpoint.requests
                 if r.status == 200 and r.kind == "task"][len(before):]
    assert Counter(before + after) - uninterrupted == Counter()  # nothing paid twice
    assert len(after) == 1  # only the evaluation that hung
    assert [(c.instruction, c.status, c.scores) for c in resumed.candidates] == [
        (c.instruction, c.status, c.scores) for c in expected.candidates]
