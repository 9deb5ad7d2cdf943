"""Racing inside real compiles: which candidates stop, what they cost, and that the decisions are reproducible.

The decision logic itself (the sequential sign test, its level) is tested in ``tests/test_racing.py``; here it runs
inside ``OPROTeleprompter.compile``. The toy task of :mod:`tests.fakes` gives an exact landscape: an instruction
with ``k`` times "better" answers training items ``0..k-1`` right, so the best, the equal and the worse candidates
are known, and the requests are counted at the fake task engine. The simulated endpoint
(:mod:`dspy_opro.testing`) runs racing through the real LiteLLM/DSPy stack; requests are counted at its log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import dspy
import pytest

from dspy_opro import OPROTeleprompter, Racing
from dspy_opro.core.exemplars import predictor_history
from dspy_opro.core.settings import racing_options
from dspy_opro.extensions.racing import RacingSchedule, example_order, threshold_table
from dspy_opro.record.files import load_state
from dspy_opro.record.report import render_run_report, render_step_report
from dspy_opro.testing import SimulatedEndpoint
from tests.fakes import make_lm, scripted_optimizer, toy_dataset, toy_metric, toy_task_reply
from tests.racing_kill_job import TRAIN_SIZE, build, trainset

ROOT = Path(__file__).resolve().parent.parent
N = 100


def better(k: int, lead: str = "Answer.") -> str:
    return f"{lead} " + " ".join(["better"] * k)


STEP0 = [better(80), better(30, "Think."), better(50, "Go.")]
STEP1 = [better(10), better(80, "Answer, exactly."), better(90)]  # worse, equal and better than the best (80)


def toy_run(replies: list[str], *, num_steps: int = 2, **options):
    task_lm, task_engine = make_lm(toy_task_reply)
    opt_lm, _ = make_lm(scripted_optimizer([f"<INS>{r}</INS>" for r in replies]))
    teleprompter = OPROTeleprompter(toy_metric, prompt_model=opt_lm, task_model=task_lm, num_steps=num_steps,
                                    num_candidates=3, num_exemplars=0, num_threads=1, racing=True, **options)
    compiled = teleprompter.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(N))
    return compiled, task_engine


def right_in_first(skill: int, k: int) -> int:
    """Right answers of a toy instruction with ``skill`` times "better" among the first ``k`` examples of the order."""
    return sum(i < skill for i in example_order(N, seed=0)[:k])


def test_a_clearly_worse_candidate_stops_and_the_rest_run_in_full():
    compiled, task_engine = toy_run(STEP0 + STEP1 + [better(95, "More.")] * 3, num_steps=3)
    run = compiled.opro_run
    by_text = {c.instruction: c for c in run.candidates}
    first = by_text[better(80)]
    worse, equal, best = by_text[better(10)], by_text[better(80, "Answer, exactly.")], by_text[better(90)]
    looks = RacingSchedule.build(N).looks
    table = threshold_table(N, looks, 0.05, 0.5)
    # Step 0 races the start (0 right: no bar). After the third look (15 examples) the candidate with the most right
    # answers, "Answer." x 80, leads and runs in full while the others wait; its 80 becomes the bar, and the 30 and
    # the 50 are tested again at once, below it at 15 examples.
    assert max(range(3), key=lambda i: right_in_first([80, 30, 50][i], 15)) == 0
    assert all(right_in_first(skill, 15) <= table[80][2] for skill in (30, 50))
    assert first.status == "scored" and first.race.looks[-1].examples == 15
    for text in (better(30, "Think."), better(50, "Go.")):
        candidate = by_text[text]
        assert candidate.status == "raced_out" and candidate.reason == "raced out after 15 of 100"
        assert candidate.race.stopped_by == first.id and candidate.race.looks[-1].against == first.id
    # Step 1 races the 80: the 10 is below it at the first look (1 right of the first 5, at most table[80][0] = 1).
    assert (right_in_first(10, 5), table[80][0]) == (1, 1)
    assert worse.status == "raced_out" and worse.reason == "raced out after 5 of 100"
    assert worse.score == pytest.approx(0.2) and sum(s is not None for s in worse.scores) == 5
    assert worse.race.against == first.id and worse.race.stopped_by == first.id and worse.race.stopped_at == 5
    assert [look.stop for look in worse.race.looks] == [True]
    # The 90 leads after 15 examples; the 80 that equals the incumbent is below the leader's 90 at those 15.
    assert best.status == "scored" and best.race.stopped_at is None
    assert (right_in_first(80, 15), table[90][2]) == (9, 10)
    assert equal.status == "raced_out" and equal.race.stopped_by == best.id and equal.race.stopped_at == 15
    assert (equal.race.looks[-1].examples, equal.race.looks[-1].better) == (15, 9)
    # Requests at the task engine: start 100; step 0 100 + 15 + 15; step 1 5 + 15 + 100; step 2 one new x 100.
    assert len(task_engine.requests) == run.metric_calls == 100 + 130 + 120 + 100
    assert [s.race_against for s in run.steps] == [0, first.id, best.id]
    # The raced-out candidate is in later meta-prompts with its partial mean, never returned.
    assert (better(10), 0.2, 1) in predictor_history(run, "self")
    assert f"text:\n{better(10)}\nscore:\n20" in run.steps[2].meta_prompt
    assert compiled.signature.instructions == better(95, "More.")
    assert all(c["instructions"]["self"] != better(10) for c in compiled.candidate_programs)
    assert "| 20.0 (raced out after 5 of 100) |" in render_step_report(run, 1)
    assert "Candidates: 8 (scored 4, raced_out 4)" in render_run_report(run)


def test_a_raced_out_candidate_is_never_best_even_with_a_higher_partial_mean():
    # A partial mean can exceed the best's full mean only on a lucky prefix; set one on the record to check the rule.
    compiled, _ = toy_run(STEP0 + STEP1)
    run = compiled.opro_run
    raced = next(c for c in run.candidates if c.status == "raced_out")
    raced.score = 0.99  # even so, best() and the ranking only see fully scored candidates
    assert run.best().instruction == better(90)
    assert raced.id not in {c.id for c in run.scored()}


@pytest.mark.parametrize(("options", "message"), [
    ({"racing": "yes"}, "racing"),
    ({"racing": Racing(alpha=0.05)}, None),
])
def test_bad_racing_options_are_refused_before_any_call(options, message):
    if message is None:
        assert racing_options(OPROTeleprompter(toy_metric, **options).racing) == Racing(alpha=0.05)
        return
    with pytest.raises((TypeError, ValueError), match=message):
        OPROTeleprompter(toy_metric, **options)


@pytest.mark.parametrize("alpha", [1.5, 0])
def test_a_racing_level_outside_zero_one_is_refused(alpha):
    with pytest.raises(ValueError, match=rf"Racing\(alpha=\.\.\.\) must be a number in \(0.0, 1.0\), for example 0.05; "
                                         rf"got {alpha}"):
        Racing(alpha=alpha)


def test_racing_is_in_the_fingerprint(tmp_path):
    toy_run(STEP0 + STEP1, num_steps=1, log_dir=str(tmp_path))
    task_lm, _ = make_lm(toy_task_reply)
    opt_lm, _ = make_lm(scripted_optimizer(["<INS>x</INS>"]))
    teleprompter = OPROTeleprompter(toy_metric, prompt_model=opt_lm, task_model=task_lm, num_steps=1,
                                    num_candidates=3, num_exemplars=0, num_threads=1, racing=Racing(alpha=0.1),
                                    log_dir=str(tmp_path))
    with pytest.raises(Exception, match=r'racing: \{"alpha": 0\.05\} -> \{"alpha": 0\.1\}'):
        teleprompter.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(N))


# ------------------------------------------------------------------------------------------- simulated endpoint


def request_key(record) -> str:
    return json.dumps([record.model, record.messages, record.n], sort_keys=True)


def outcome(compiled):
    run = compiled.opro_run
    return (compiled.signature.instructions, run.selection.candidate_id, run.metric_calls,
            [(c.instruction, c.status, c.reason, c.score, c.scores) for c in run.candidates])


def sim_compile(endpoint, log_dir=None, **options):
    return build(endpoint.base_url, None if log_dir is None else str(log_dir), **options).compile(
        dspy.Predict("question -> answer"), trainset=trainset())


def served(endpoint, kind=None):
    return [r for r in endpoint.requests if r.status == 200 and (kind is None or r.kind == kind)]


@pytest.mark.slow
def test_the_same_result_and_requests_at_1_and_8_threads():
    results, requests = [], []
    for threads in (1, 8):
        with SimulatedEndpoint() as endpoint:
            results.append(outcome(sim_compile(endpoint, num_threads=threads)))
            requests.append(Counter(request_key(r) for r in served(endpoint)))
    assert results[0] == results[1]
    assert requests[0] == requests[1]
    statuses = Counter(status for _, status, *_ in results[0][3])
    assert statuses["raced_out"] >= 1 and statuses["scored"] >= 2
    raced = [(reason, scores) for _, status, reason, _, scores in results[0][3] if status == "raced_out"]
    for reason, scores in raced:  # "raced out after k of 60": exactly its first k examples of the order ran
        k = int(reason.split()[3])
        assert k in RacingSchedule.build(TRAIN_SIZE).looks
        assert {i for i, s in enumerate(scores) if s is not None} == set(example_order(TRAIN_SIZE, seed=0)[:k])
    # Task requests served = the run's metric calls = the examples each candidate ran.
    ran = sum(sum(s is not None for s in scores) for *_, scores in results[0][3])
    assert sum(requests[0][k] for k in requests[0] if json.loads(k)[0] == "sim-task") == ran == results[0][2]


@pytest.mark.slow
def test_max_metric_calls_is_exact_and_a_larger_budget_resumes_the_race(tmp_path):
    with SimulatedEndpoint() as reference:
        expected = outcome(sim_compile(reference))
        uninterrupted = Counter(request_key(r) for r in served(reference))
    budget = TRAIN_SIZE + 45  # the start, then mid-way through step 0's first rounds
    with SimulatedEndpoint() as endpoint:
        stopped = sim_compile(endpoint, tmp_path, max_metric_calls=budget).opro_run
        assert stopped.status == "stopped" and stopped.metric_calls == budget
        assert len(served(endpoint, "task")) == budget
        assert any((c.reason or "").startswith("cut short") for c in stopped.candidates)
        resumed = sim_compile(endpoint, tmp_path, max_metric_calls=10_000)
        total = Counter(request_key(r) for r in served(endpoint))
    assert outcome(resumed)[:2] == expected[:2] and outcome(resumed)[3] == expected[3]
    assert total == uninterrupted  # nothing ran twice, nothing was skipped


@pytest.mark.slow
def test_a_kill_mid_race_repeats_nothing_but_the_evaluation_in_flight(tmp_path):
    with SimulatedEndpoint() as reference:
        expected = outcome(sim_compile(reference))
        uninterrupted = Counter(request_key(r) for r in served(reference) if r.kind == "task")
    kill_at = TRAIN_SIZE + 37  # step 0, in a race's second block
    with SimulatedEndpoint() as endpoint:
        child = subprocess.run([sys.executable, "-m", "tests.racing_kill_job", endpoint.base_url,
                                str(tmp_path / "run"), str(kill_at)], cwd=ROOT, capture_output=True, text=True,
                               timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert child.returncode == -9, child.stderr[-3000:]
        before = served(endpoint, "task")
        assert len(before) == kill_at
        assert load_state(tmp_path / "run") is not None
        resumed = sim_compile(endpoint, tmp_path / "run")
        after = served(endpoint, "task")[len(before):]
    assert outcome(resumed)[:2] == expected[:2] and outcome(resumed)[3] == expected[3]
    repeated = Counter(request_key(r) for r in before + after) - uninterrupted
    assert sum(repeated.values()) <= 1 and set(repeated) <= {request_key(before[-1])}


def test_an_lm_failure_in_a_block_leaves_the_racing_candidate_unscored_after_that_block():
    from dspy.lm15 import ServerError

    from tests.fakes import field_value, instruction_of, user_text

    failing = f"item {example_order(N, seed=0)[3]}"  # in the first block of the shared order
    calls = Counter()

    def task(request):
        instruction = instruction_of(request)
        calls[instruction] += 1
        if instruction.startswith("Flaky.") and field_value(user_text(request), "question") == failing:
            return ServerError("upstream exploded")
        return toy_task_reply(request)

    task_lm, _ = make_lm(task)
    opt_lm, _ = make_lm(scripted_optimizer([f"<INS>{better(80)}</INS>", f"<INS>{better(85, 'Flaky.')}</INS>"]))
    teleprompter = OPROTeleprompter(toy_metric, prompt_model=opt_lm, task_model=task_lm, num_steps=2,
                                    num_candidates=1, num_exemplars=0, num_threads=1, racing=True)
    run = teleprompter.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(N)).opro_run
    flaky = run.candidates[2]
    assert flaky.status == "unscored" and flaky.reason.startswith("LM failures on 1 examples")
    assert calls[better(85, "Flaky.")] == 5 + 1  # the first block, the failing example tried once more, no more
    assert sum(s is not None for s in flaky.scores) == 4
    assert run.best().instruction == better(80)
