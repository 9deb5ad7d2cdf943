"""SIGKILL at chosen points of a run against the simulated endpoint, then resume: the endpoint's request log shows
that nothing paid runs twice but the evaluation in flight, that the result equals an uninterrupted run's, and that
the recorded cost equals what the endpoint served (less the lost in-flight answer)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import litellm
import pytest

from dspy_opro.record.files import load_state
from dspy_opro.testing import SimulatedEndpoint
from tests.kill_job import JUDGE, OPTIMIZER, TASK, build, datasets

pytestmark = [pytest.mark.slow, pytest.mark.compat]  # each test SIGKILLs a child process running a compile

ROOT = Path(__file__).resolve().parent.parent
PAID_KINDS = ("task", "judge")


def price(record) -> float:
    name = {m.split("/", 1)[1]: m.split("/", 1)[1] for m in (TASK, OPTIMIZER, JUDGE)}[record.model]
    prices = litellm.model_cost[name]
    return record.prompt_tokens * prices["input_cost_per_token"] + record.completion_tokens * prices[
        "output_cost_per_token"]


def key(record) -> str:
    return json.dumps(record.messages, sort_keys=True)


def outcome(compiled):
    run = compiled.opro_run
    return (compiled.signature.instructions, run.selection.candidate_id,
            [(c.instruction, c.status, c.scores, c.val_scores) for c in run.candidates])


def compile_in_process(endpoint, log_dir, scenario):
    teleprompter, program = build(endpoint.base_url, str(log_dir), scenario)
    trainset, valset = datasets()
    return teleprompter.compile(program, trainset=trainset, valset=valset)


def kill_child(endpoint, log_dir, scenario, model, split, kill_at) -> None:
    child = subprocess.run([sys.executable, "-m", "tests.kill_job", endpoint.base_url, str(log_dir), scenario, model,
                            split, str(kill_at)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert child.returncode == -9, child.stderr[-3000:]


@pytest.mark.parametrize(
    ("scenario", "model", "split", "kill_at"),
    [
        ("train", TASK, "train", 3),  # step -1
        ("train", TASK, "train", 9),  # step 0
        ("validation", TASK, "val", 6),  # validation of the top 2
        ("val_gate", TASK, "val", 6),  # the val gate: the program as given, then the best
        ("label_free", JUDGE, "train", 3),  # label-free judging during step 0
    ],
)
def test_sigkill_repeats_at_most_the_evaluation_in_flight(tmp_path, scenario, model, split, kill_at):
    with SimulatedEndpoint() as reference:
        expected = outcome(compile_in_process(reference, tmp_path / "reference", scenario))
        uninterrupted = Counter(key(r) for r in reference.requests if r.status == 200 and r.kind in PAID_KINDS)
    with SimulatedEndpoint() as endpoint:
        kill_child(endpoint, tmp_path / "run", scenario, model, split, kill_at)
        before = [r for r in endpoint.requests if r.status == 200]
        assert load_state(tmp_path / "run") is not None  # the first snapshot precedes the first evaluation
        resumed = compile_in_process(endpoint, tmp_path / "run", scenario)
        after = [r for r in endpoint.requests if r.status == 200][len(before):]
    assert outcome(resumed) == expected
    paid_before = [r for r in before if r.kind in PAID_KINDS]
    # What the killed and the resumed run paid beyond an uninterrupted run's requests (as a multiset: two
    # evaluations may send the same judge request) was paid twice.
    repeated = Counter(key(r) for r in paid_before + [r for r in after if r.kind in PAID_KINDS]) - uninterrupted
    in_flight = paid_before[-2:] if scenario == "label_free" else paid_before[-1:]  # one evaluation: task (+ judge)
    assert repeated and set(repeated) <= {key(r) for r in in_flight}, f"{sum(repeated.values())} paid requests " \
        "were run again"
    assert sum(repeated.values()) <= len(in_flight)
    lost = sum(price(r) for r in in_flight if key(r) in repeated)  # the answers cut off by the kill
    served = sum(price(r) for r in before + after)
    assert resumed.opro_run.usage.total_cost == pytest.approx(served - lost, rel=1e-9)


def test_max_cost_holds_across_a_kill(tmp_path):
    with SimulatedEndpoint() as endpoint:
        kill_child(endpoint, tmp_path / "run", "budget", TASK, "train", 9)
        before = [r for r in endpoint.requests if r.status == 200]
        resumed = compile_in_process(endpoint, tmp_path / "run", "budget").opro_run
        after = [r for r in endpoint.requests if r.status == 200][len(before):]
    lost = {key(r) for r in before if r.kind in PAID_KINDS} & {key(r) for r in after if r.kind in PAID_KINDS}
    assert len(lost) == 1  # the evaluation in flight at the kill
    spent, crossed, billed = 0.0, None, [r for r in before if key(r) not in lost] + after
    for position, record in enumerate(billed):
        spent += price(record)
        if crossed is None and spent >= 0.0004:
            crossed = position
    assert resumed.status == "stopped" and resumed.stop_reason.startswith("max_cost=$0.0004 reached")
    assert crossed is not None and crossed >= len(before) and len(billed) - 1 - crossed == 0
    assert resumed.usage.total_cost == pytest.approx(spent, rel=1e-9)
