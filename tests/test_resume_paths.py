"""Nothing recorded is bought twice on any resume path (issue 20, items 1 to 3).

Each test runs a sequence of compiles on one ``log_dir`` against the simulated endpoint: a first compile that
leaves candidates to finish (a budget stopped it, an outage left them unscored, or ``num_steps`` grows), a second
that is SIGKILLed in a child process while it scores them, and a third that resumes. The truth is the endpoint's
request log: every paid task request of the killed sequence beyond those of the same sequence run without the kill
was paid twice, and at most the evaluation in flight at the kill may be; the budget holds at the endpoint too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from dspy_opro.record.files import load_state
from dspy_opro.testing import FaultConfig, SimulatedEndpoint
from tests.kill_job import TASK, build, datasets

ROOT = Path(__file__).resolve().parent.parent
OUTAGE = FaultConfig(fail_requests=set(range(7, 400)), fail_kind="server_error", only_kinds={"task"})


def key(record) -> str:
    return json.dumps(record.messages, sort_keys=True)


def paid_tasks(endpoint) -> list[str]:
    return [key(r) for r in endpoint.requests if r.status == 200 and r.kind == "task"]


def compile_in_process(endpoint, log_dir, **options: Any):
    teleprompter, program = build(endpoint.base_url, str(log_dir), "train", **options)
    trainset, valset = datasets()
    return teleprompter.compile(program, trainset=trainset, valset=valset)


def kill_child(endpoint, log_dir, kill_at: int, **options: Any) -> None:
    child = subprocess.run([sys.executable, "-m", "tests.kill_job", endpoint.base_url, str(log_dir), "train", TASK,
                            "train", str(kill_at), json.dumps(options)], cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
    assert child.returncode == -9, child.stderr[-3000:]


def first_compile(endpoint, log_dir, path: str):
    """The compile that leaves work for the next: stopped by a budget, finished after an outage, or shorter."""
    if path == "budget_continued":
        run = compile_in_process(endpoint, log_dir, max_metric_calls=9).opro_run
        assert run.status == "stopped" and [c.status for c in run.candidates[1:3]] == ["cut_short", "cut_short"]
    elif path == "outage_retried":
        endpoint.faults = OUTAGE  # every task request after the start's and the first optimizer call fails
        run = compile_in_process(endpoint, log_dir, num_steps=1).opro_run
        endpoint.faults = FaultConfig()
        assert run.status == "finished" and [c.status for c in run.candidates[1:3]] == ["unscored", "unscored"]
    else:
        run = compile_in_process(endpoint, log_dir, num_steps=1).opro_run
        assert run.status == "finished" and len(run.steps) == 1


PATHS = {  # the settings of the compiles after the first
    "budget_continued": {"max_metric_calls": 30},
    "outage_retried": {"num_steps": 1},
    "num_steps_raised": {"num_steps": 2},
}


@pytest.mark.slow  # SIGKILLs a child process running a compile
@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_kill_on_a_resume_path_rebuys_only_the_evaluation_in_flight(tmp_path, path):
    options = PATHS[path]
    with SimulatedEndpoint() as reference:
        first_compile(reference, tmp_path / "reference", path)
        expected = compile_in_process(reference, tmp_path / "reference", **options).opro_run
        uninterrupted = Counter(paid_tasks(reference))
    with SimulatedEndpoint() as endpoint:
        first_compile(endpoint, tmp_path / "run", path)
        kill_child(endpoint, tmp_path / "run", 5, **options)
        assert load_state(tmp_path / "run") is not None
        resumed = compile_in_process(endpoint, tmp_path / "run", **options).opro_run
        served = paid_tasks(endpoint)
    repeated = Counter(served) - uninterrupted
    print(f"{path}: {sum(repeated.values())} paid task requests repeated after the kill")
    assert sum(repeated.values()) <= 1, f"{sum(repeated.values())} paid evaluations were bought again"
    assert [(c.instruction, c.status, c.scores) for c in resumed.candidates] == [
        (c.instruction, c.status, c.scores) for c in expected.candidates]
    if path == "budget_continued":  # the budget holds at the endpoint: its limit plus the one in flight at the kill
        assert len(served) <= options["max_metric_calls"] + 1
        assert resumed.metric_calls <= options["max_metric_calls"]


@pytest.mark.slow  # end to end against the simulated endpoint
def test_compiling_again_after_an_outage_scores_exactly_the_candidates_it_left_unscored(tmp_path):
    with SimulatedEndpoint() as endpoint:
        endpoint.faults = OUTAGE
        first = compile_in_process(endpoint, tmp_path, num_steps=1).opro_run
        unscored = [c for c in first.candidates if c.status == "unscored"]
        assert [c.id for c in unscored] == [1, 2] and first.status == "finished"
        assert all("LM failures on 6 examples" in (c.reason or "") for c in unscored)
        endpoint.faults = FaultConfig()  # the provider is back
        endpoint.reset_log()
        again = compile_in_process(endpoint, tmp_path, num_steps=1)
        run = again.opro_run
        tasks = [r for r in endpoint.requests if r.kind == "task"]
        assert len(tasks) == 12 and all(r.status == 200 for r in tasks)  # 2 candidates x 6 examples, nothing else
        assert endpoint.count("opro") == 0
        instructions = Counter(json.dumps(r.messages) for r in tasks)
        assert sorted(instructions.values()) == [1] * 12
        assert [c.status for c in run.candidates[:3]] == ["scored", "scored", "scored"]
        assert run.status == "finished" and run.metric_calls == first.metric_calls + 12
        # A third compile has nothing left to do: no request at all.
        endpoint.reset_log()
        compile_in_process(endpoint, tmp_path, num_steps=1)
        assert endpoint.requests == []


@pytest.mark.slow  # SIGKILLs child processes running a compile
def test_max_metric_calls_holds_at_the_endpoint_across_repeated_kills(tmp_path):
    """Three kills, each after seven answered task requests, then a resume: the endpoint served at most the budget
    plus the one evaluation in flight at each kill, and the record counts exactly the budget."""
    limit, kills = 20, 3
    with SimulatedEndpoint() as endpoint:
        for _ in range(kills):
            kill_child(endpoint, tmp_path, 7, max_metric_calls=limit)
        resumed = compile_in_process(endpoint, tmp_path, max_metric_calls=limit).opro_run
        served = paid_tasks(endpoint)
    print(f"max_metric_calls={limit}, {kills} kills: the endpoint served {len(served)} task requests")
    assert resumed.status == "stopped" and resumed.metric_calls == limit
    assert len(served) <= limit + kills
    assert sum((Counter(served) - Counter(set(served))).values()) <= kills  # repeats: the ones in flight at kills
