"""OPRO end to end through the real DSPy/LiteLLM client stack against the simulated OpenAI-compatible endpoint.

Every test talks HTTP to :class:`dspy_opro.testing.SimulatedEndpoint` on 127.0.0.1 with two ``dspy.LM`` objects
(``openai/sim-task`` runs the program, ``openai/sim-opt`` is the optimizer), so the server's request log tells the
two models apart and also classifies each request ("task" or "opro"). The counts asserted here are exact: they are
computed from the run record (``compiled.opro_run``) and compared with what the server actually received.

The optimizer LM is an OpenAI model on ``engine="litellm"``, which honours OpenAI's ``n``: a step is ONE request
with ``n=num_candidates`` (``RequestRecord.n``), tried once more if it fails. On ``engine="auto"`` (DSPy's native
engine, which fans ``n`` out) a step is ``num_candidates`` parallel one-choice requests instead; the tests that
need per-candidate requests use it.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import re
import threading
from collections import Counter

import dspy
import pytest

from dspy_opro import OPROTeleprompter
from dspy_opro.errors import FatalLMError, OPRORunError
from dspy_opro.record.files import STATE_FILE, load_state
from dspy_opro.testing import FaultConfig, SimulatedEndpoint, simulated_dataset, simulated_metric

pytestmark = pytest.mark.slow

TASK, OPT = "sim-task", "sim-opt"
START = "Given the fields `question`, produce the fields `answer`."
OBJECTIVE = "your objective is:"


# --------------------------------------------------------------------------------------------------------- helpers


def make_lm(endpoint: SimulatedEndpoint, name: str, *, engine: str = "litellm", **kwargs) -> dspy.LM:
    return dspy.LM(f"openai/{name}", api_base=endpoint.base_url, api_key="x", engine=engine, cache=False,
                   num_retries=0, **kwargs)


def optimize(endpoint, trainset, *, program=None, task_endpoint=None, lm_kwargs=None, metric=simulated_metric,
             opt_engine="litellm", **options):
    """Compile ``program`` (default ``dspy.Predict("question -> answer")``) with OPRO over the endpoint(s).

    ``opt_engine`` is the optimizer LM's engine: ``"litellm"`` sends one ``n=num_candidates`` request per step,
    ``"auto"`` (DSPy's native engine) ``num_candidates`` one-choice requests.
    """
    lm_kwargs = lm_kwargs or {}
    teleprompter = OPROTeleprompter(
        metric,
        prompt_model=make_lm(endpoint, OPT, engine=opt_engine, **lm_kwargs),
        task_model=make_lm(task_endpoint or endpoint, TASK, **lm_kwargs),
        **options,
    )
    return teleprompter.compile(program or dspy.Predict("question -> answer"), trainset=trainset)


def normalize(text: str) -> str:
    return " ".join(text.split())


def instruction_of(record) -> str:
    """The predictor instruction: the end of the system message, after "your objective is:"."""
    system = "\n".join(m["content"] for m in record.messages if m.get("role") == "system")
    assert OBJECTIVE in system, system
    return normalize(system.split(OBJECTIVE, 1)[1])


def question_of(record) -> str:
    user = record.messages[-1]["content"]
    match = re.search(r"\[\[ ## question ## \]\]\n(.*?)\n\n", user, re.S)
    assert match, user
    return match.group(1).strip()


def pair_of(record) -> tuple[str, str]:
    return instruction_of(record), question_of(record)


def task_records(records, *, status=None):
    return [r for r in records if r.kind == "task" and (status is None or r.status == status)]


def opro_records(records, *, status=None):
    return [r for r in records if r.kind == "opro" and (status is None or r.status == status)]


def attempted(run) -> list:
    """Candidates that were run on the training set: the start, then every scored or unscored proposal."""
    return [c for c in run.candidates if c.status in ("scored", "unscored")]


def check_record_invariants(run, n_train: int) -> None:
    """Nothing pending, every scored candidate has all its scores, every unscored one says why."""
    assert all(c.status in ("scored", "unscored", "skipped") for c in run.candidates)
    for candidate in run.candidates:
        if candidate.status == "scored":
            assert len(candidate.scores) == n_train and all(s is not None for s in candidate.scores), candidate
            assert candidate.score == pytest.approx(sum(candidate.scores) / n_train)
        elif candidate.status == "unscored":
            assert candidate.reason and candidate.score is None
            assert any(s is None for s in candidate.scores)
        else:
            assert candidate.scores == [] and candidate.reason


def shown_in(meta_prompt: str, instruction: str) -> bool:
    """Whether the meta-prompt lists the instruction among the scored ones."""
    return f"text:\n{instruction}\nscore:" in meta_prompt


@pytest.fixture
def endpoint():
    with SimulatedEndpoint() as ep:
        yield ep


# --------------------------------------------------------------------------------------------------- 1. a full run


def test_compile_improves_and_the_server_log_matches_the_run_record(endpoint):
    train = simulated_dataset(20)
    num_steps, num_candidates = 4, 4
    compiled = optimize(endpoint, train, program=dspy.ChainOfThought("question -> answer"), num_steps=num_steps,
                        num_candidates=num_candidates, num_threads=8)
    run = compiled.opro_run
    start, best = run.candidates[0], run.best()
    check_record_invariants(run, len(train))
    assert run.status == "finished" and len(run.steps) == num_steps
    assert best.score > start.score
    assert compiled.predict.signature.instructions == best.instructions["predict"] != START

    records = endpoint.requests
    assert all(r.status == 200 and r.fault is None for r in records)
    assert {(r.kind, r.model) for r in records} == {("task", TASK), ("opro", OPT)}

    # Exactly one optimizer request per step, asking for n=num_candidates completions of that step's meta-prompt
    # (sent verbatim), and num_candidates replies recorded per step; every task request asks for one completion.
    opro = opro_records(records)
    assert len(opro) == num_steps
    assert [r.n for r in opro] == [num_candidates] * num_steps
    assert [r.messages[-1]["content"] for r in opro] == [step.meta_prompt for step in run.steps]
    assert [(len(step.replies), step.failed_calls) for step in run.steps] == [(num_candidates, 0)] * num_steps
    assert all(r.n == 1 for r in task_records(records))

    # Every attempted candidate (the start included) on every training example, once; skipped ones never.
    tasks = task_records(records)
    assert len(tasks) == len(train) * len(attempted(run))
    by_instruction = Counter(instruction_of(r) for r in tasks)
    assert by_instruction == Counter({normalize(c.instructions["predict"]): len(train) for c in attempted(run)})
    assert Counter(pair_of(r) for r in tasks).most_common(1)[0][1] == 1

    # Usage recorded by the run equals the tokens the server counted, per model: for the optimizer, one call per
    # step with its meta-prompt billed once.
    for model, usage in run.usage.by_model.items():
        served = [r for r in records if f"openai/{r.model}" == model]
        assert usage.calls == len(served) and usage.cache_hits == 0
        assert usage.prompt_tokens == sum(r.prompt_tokens for r in served)
        assert usage.completion_tokens == sum(r.completion_tokens for r in served)
    assert set(run.usage.by_model) == {f"openai/{TASK}", f"openai/{OPT}"}
    assert run.usage.task == run.usage.by_model[f"openai/{TASK}"]
    assert run.usage.optimizer == run.usage.by_model[f"openai/{OPT}"]
    assert run.metric_calls == len(tasks)


# ------------------------------------------------------------------------------------------ 2. task-side faults

ERROR_NAMES = {
    "rate_limit": "LMRateLimitError",
    "server_error": "LMServerError",
    "malformed": "Error",
    "empty_choices": "EmptyResponseError",
    "hang": "LMTimeoutError",
}


@pytest.mark.parametrize("fail_kind", list(ERROR_NAMES))
def test_task_faults_are_retried_once_then_leave_the_candidate_unscored(fail_kind):
    # One thread: requests arrive in a fixed order. 0-5 score the start on 6 examples, the fault at 2 is retried
    # as 3 (so the start takes 0-6); 7 is step 0's optimizer request (n=3); 8 is candidate 1 on example 0, which
    # fails again on its retry (9): candidate 1 is unscored.
    faults = FaultConfig(fail_requests={2, 8, 9}, fail_kind=fail_kind, only_kinds={"task"}, retry_after=0,
                         hang_seconds=2)
    train = simulated_dataset(6)
    with SimulatedEndpoint(faults=faults) as endpoint:
        compiled = optimize(endpoint, train, num_steps=2, num_candidates=3, num_threads=1,
                            lm_kwargs={"timeout": 0.5} if fail_kind == "hang" else {})
        records = endpoint.requests
    run = compiled.opro_run
    assert run.status == "finished" and len(run.steps) == 2
    check_record_invariants(run, len(train))

    assert [i for i, r in enumerate(records) if r.fault is not None] == [2, 8, 9]
    assert all(records[i].fault == fail_kind and records[i].kind == "task" for i in (2, 8, 9))
    assert (records[7].kind, records[7].n, records[7].status) == ("opro", 3, 200)
    assert [r.kind for r in records[:7]] == ["task"] * 7
    # The start's failed example was retried once, by OPRO (num_retries=0 on the LM), and kept.
    assert pair_of(records[3]) == pair_of(records[2]) and records[3].fault is None and records[3].status == 200
    start = run.candidates[0]
    assert start.status == "scored" and instruction_of(records[2]) == START

    # Candidate 1's example 0 failed twice: unscored, with the error named; its other examples were scored.
    assert pair_of(records[9]) == pair_of(records[8]) == (normalize(run.candidates[1].instruction),
                                                            train[0].question)
    lost = run.candidates[1]
    assert lost.status == "unscored" and lost.scores[0] is None and all(s is not None for s in lost.scores[1:])
    assert "after a retry" in lost.reason and ERROR_NAMES[fail_kind] in lost.reason
    assert [c.id for c in run.candidates if c.status == "unscored"] == [1]

    # The unscored instruction never reaches a later meta-prompt; the scored ones of its step do.
    later = [s.meta_prompt for s in run.steps if s.step > lost.step]
    later += [r.messages[-1]["content"] for r in opro_records(records[10:])]
    assert later and not any(lost.instruction in text for text in later)
    for candidate in run.scored():
        if candidate.step == lost.step:
            assert all(shown_in(text, candidate.instruction) for text in later)

    # Exact request counts: each evaluation once, plus one retry per faulted first attempt.
    evaluations = len(train) * len(attempted(run))
    doubly_failed = sum(s is None for c in attempted(run) for s in c.scores)
    assert doubly_failed == 1
    assert len(task_records(records)) == evaluations + 3 - doubly_failed
    assert [r.n for r in opro_records(records)] == [3, 3]  # one request per step
    assert run.metric_calls == evaluations


def test_random_task_faults_under_threads_lose_no_scored_result():
    faults = FaultConfig(rate_limit=0.06, server_error=0.06, malformed=0.03, empty_choices=0.03, retry_after=0,
                         only_kinds={"task"}, fail_requests=set())
    train = simulated_dataset(10)
    num_steps, num_candidates = 3, 4
    with SimulatedEndpoint(faults=faults, seed=7) as endpoint:
        compiled = optimize(endpoint, train, num_steps=num_steps, num_candidates=num_candidates, num_threads=8)
        records = endpoint.requests
    run = compiled.opro_run
    assert run.status == "finished" and len(run.steps) == num_steps
    check_record_invariants(run, len(train))
    assert all(r.fault is None for r in opro_records(records))
    assert [r.n for r in opro_records(records)] == [num_candidates] * num_steps

    tasks = task_records(records)
    faulted = [r for r in tasks if r.fault is not None]
    assert faulted  # the seed does inject faults
    doubly_failed = sum(s is None for c in attempted(run) for s in c.scores)
    assert len(tasks) == len(train) * len(attempted(run)) + len(faulted) - doubly_failed

    # Every successful answer became exactly one recorded score, and no pair was answered twice.
    answered = Counter(pair_of(r) for r in tasks if r.fault is None and r.status == 200)
    assert max(answered.values()) == 1
    recorded = sum(s is not None for c in attempted(run) for s in c.scores)
    assert recorded == len(answered) == len(train) * len(attempted(run)) - doubly_failed

    for lost in (c for c in run.candidates if c.status == "unscored"):
        assert "after a retry" in lost.reason
        assert not any(lost.instruction in s.meta_prompt for s in run.steps if s.step > lost.step)


# ------------------------------------------------------------------------------------- optimizer-side faults


@pytest.mark.parametrize(("engine", "requests_per_step", "n"), [("litellm", 1, 4), ("auto", 4, 1)])
def test_optimizer_requests_per_step_follow_the_engine(endpoint, engine, requests_per_step, n):
    # LiteLLM passes n on to an OpenAI model: one request per step, its prompt billed once. DSPy's native engine
    # fans n out, so OPRO sends num_candidates one-choice requests in parallel, each billed in full.
    train = simulated_dataset(6)
    num_steps, num_candidates = 3, 4
    compiled = optimize(endpoint, train, opt_engine=engine, num_steps=num_steps, num_candidates=num_candidates,
                        num_threads=4)
    run = compiled.opro_run
    records = endpoint.requests
    assert run.status == "finished" and len(run.steps) == num_steps
    check_record_invariants(run, len(train))
    assert all(r.status == 200 and r.fault is None for r in records)

    opro = opro_records(records)
    assert len(opro) == num_steps * requests_per_step and all(r.n == n for r in opro)
    sent = Counter(r.messages[-1]["content"] for r in opro)
    assert sent == Counter({step.meta_prompt: requests_per_step for step in run.steps})
    assert [(len(step.replies), step.failed_calls) for step in run.steps] == [(num_candidates, 0)] * num_steps
    assert all(r.n == 1 for r in task_records(records))

    optimizer = run.usage.optimizer
    assert run.usage.by_model == {f"openai/{TASK}": run.usage.task, f"openai/{OPT}": optimizer}
    assert optimizer.calls == num_steps * requests_per_step and optimizer.cache_hits == 0
    prompt_tokens = {r.messages[-1]["content"]: r.prompt_tokens for r in opro}  # one meta-prompt, one count
    assert optimizer.prompt_tokens == requests_per_step * sum(prompt_tokens[s.meta_prompt] for s in run.steps)
    assert optimizer.completion_tokens == sum(r.completion_tokens for r in opro)


def test_a_failed_n_request_is_tried_once_more_then_the_step_has_no_replies(endpoint):
    # Requests 0-3 score the start. Step 0's one n=3 request fails (4) and fails again on its retry (5): the step
    # has no reply and one failed call. Step 1's request fails once (6) and succeeds on its retry (7): 3 replies.
    endpoint.faults = FaultConfig(fail_requests={4, 5, 6}, fail_kind="server_error", only_kinds={"opro"})
    train = simulated_dataset(4)
    compiled = optimize(endpoint, train, num_steps=2, num_candidates=3, num_threads=1)
    run = compiled.opro_run
    records = endpoint.requests
    assert run.status == "finished" and len(run.steps) == 2
    check_record_invariants(run, len(train))

    assert [(r.kind, r.n, r.status) for r in records[4:8]] == [("opro", 3, 500)] * 3 + [("opro", 3, 200)]
    assert records[4].messages == records[5].messages != records[6].messages == records[7].messages
    first, second = run.steps
    assert first.failed_calls == 1 and first.replies == []
    assert len(first.errors) == 1 and "LMServerError" in first.errors[0]
    assert second.failed_calls == 0 and len(second.replies) == 3 and second.errors == []
    assert [c.step for c in run.candidates] == [-1, 1, 1, 1]
    assert len(opro_records(records)) == 4 and len(opro_records(records, status=200)) == 1
    optimizer = run.usage.optimizer
    assert (optimizer.calls, optimizer.prompt_tokens, optimizer.completion_tokens) == (
        1, records[7].prompt_tokens, records[7].completion_tokens)
    assert len(task_records(records)) == len(train) * len(attempted(run)) == len(train) * 4


def test_failed_one_choice_calls_give_fewer_replies_and_the_run_completes(endpoint):
    # engine="auto": one-choice requests, one thread. Requests 0-3 score the start; step 0's first sample fails
    # twice (4, 5) and is dropped, the second fails once (6) and succeeds on its retry (7), the third succeeds (8).
    endpoint.faults = FaultConfig(fail_requests={4, 5, 6}, fail_kind="server_error", only_kinds={"opro"})
    train = simulated_dataset(4)
    compiled = optimize(endpoint, train, opt_engine="auto", num_steps=2, num_candidates=3, num_threads=1)
    run = compiled.opro_run
    records = endpoint.requests
    assert run.status == "finished" and len(run.steps) == 2
    check_record_invariants(run, len(train))

    assert [(r.kind, r.n, r.status) for r in records[4:9]] == [("opro", 1, 500)] * 3 + [("opro", 1, 200)] * 2
    first, second = run.steps
    assert first.failed_calls == 1 and len(first.replies) == 2
    assert len(first.errors) == 1 and "LMServerError" in first.errors[0]
    assert second.failed_calls == 0 and len(second.replies) == 3 and second.errors == []
    assert len(opro_records(records)) == 2 * 3 + 2
    assert all(r.n == 1 for r in opro_records(records))
    assert len(opro_records(records, status=200)) == 2 * 3 - 1
    assert run.usage.optimizer.calls == 2 * 3 - 1
    assert len(task_records(records)) == len(train) * len(attempted(run))


def test_an_optimizer_that_never_answers_stops_the_run_after_three_empty_steps(endpoint, tmp_path):
    endpoint.faults = FaultConfig(server_error=1.0, only_kinds={"opro"})
    train = simulated_dataset(4)
    with pytest.raises(OPRORunError, match="no reply in 3 steps in a row") as excinfo:
        optimize(endpoint, train, num_steps=6, num_candidates=2, num_threads=2, log_dir=tmp_path)
    assert excinfo.type is OPRORunError
    assert "LMServerError" in str(excinfo.value)

    records = endpoint.requests
    opro = opro_records(records)
    assert len(opro) == 3 * 2  # 3 steps x 1 request (n=2) x 2 tries
    assert all(r.status == 500 and r.n == 2 for r in opro)
    assert len(task_records(records, status=200)) == len(train)

    saved = load_state(tmp_path)
    assert saved is not None and (tmp_path / STATE_FILE).is_file()
    assert saved.status == "failed" and "3 steps in a row" in saved.stop_reason
    assert [(s.step, s.failed_calls, s.replies) for s in saved.steps] == [(0, 1, []), (1, 1, []), (2, 1, [])]
    assert [c.status for c in saved.candidates] == ["scored"]
    assert saved.usage.task.calls == len(train)
    assert saved.usage.optimizer.calls == 0


def test_a_401_task_model_stops_before_any_optimizer_call(endpoint, tmp_path):
    endpoint.faults = FaultConfig(auth_error=True)
    train = simulated_dataset(4)
    with pytest.raises(FatalLMError, match="API key") as excinfo:
        optimize(endpoint, train, num_steps=2, num_candidates=2, num_threads=1, log_dir=tmp_path)
    assert "task model" in str(excinfo.value)
    records = endpoint.requests
    assert endpoint.count(kind="opro", status=None) == 0
    assert [(r.kind, r.model, r.status) for r in records] == [("task", TASK, 401)]  # no retry of a fatal error

    saved = load_state(tmp_path)
    assert saved is not None and saved.steps == [] and saved.selection is None
    assert saved.candidates[0].scores == [None] * len(train)


# ------------------------------------------------------------------------------------------------------- budget


@pytest.mark.parametrize("num_threads", [1, 4])
def test_max_metric_calls_is_the_exact_number_of_task_requests(endpoint, num_threads):
    train, budget = simulated_dataset(6), 20
    compiled = optimize(endpoint, train, num_steps=3, num_candidates=3, num_threads=num_threads,
                        max_metric_calls=budget)
    run = compiled.opro_run
    records = endpoint.requests
    assert len(task_records(records)) == budget == run.metric_calls == run.usage.task.calls
    assert all(r.status == 200 for r in records)
    assert run.status == "stopped" and f"max_metric_calls={budget}" in run.stop_reason
    assert sum(s is not None for c in run.candidates for s in c.scores) == budget
    # The budget ran out in step 0: its one n=3 request is the only optimizer request.
    assert [r.n for r in opro_records(records)] == [3]
    cut = [c for c in run.candidates if c.status == "cut_short"]
    assert cut and all(c.reason.startswith("cut short") for c in cut)
    assert all(all(s is not None for s in c.scores) for c in run.scored())
    # A cut-short candidate is never returned: the program is the best fully scored one.
    chosen = run.candidates[run.selection.candidate_id]
    assert chosen.status == "scored" and chosen.id == run.best().id
    assert compiled.signature.instructions == chosen.instructions["self"]


# ------------------------------------------------------------------------------------------------------- resume


def summary(compiled):
    run = compiled.opro_run
    return compiled.signature.instructions, [(c.instruction, c.status, c.scores) for c in run.candidates]


def test_resume_after_a_fatal_error_repeats_nothing_and_matches_an_uninterrupted_run(tmp_path):
    train = simulated_dataset(6)
    options = {"num_steps": 2, "num_candidates": 3, "num_threads": 1}
    with SimulatedEndpoint() as reference:
        expected = summary(optimize(reference, train, **options))
        expected_tasks = len(task_records(reference.requests))
        expected_opro = len(opro_records(reference.requests))

    with SimulatedEndpoint() as endpoint:
        calls, lock, armed = [0], threading.Lock(), [True]

        def revoking_metric(example, prediction, trace=None):
            # After the 9th evaluation the key is revoked: start (6) and step 0's optimizer request are done,
            # candidate 1 is half way through its examples.
            with lock:
                calls[0] += 1
                if armed[0] and calls[0] == 9:
                    endpoint.faults = FaultConfig(auth_error=True)
            return simulated_metric(example, prediction, trace)

        with pytest.raises(FatalLMError, match="API key"):
            optimize(endpoint, train, metric=revoking_metric, log_dir=tmp_path, **options)
        first = endpoint.requests
        saved = load_state(tmp_path)
        assert saved.status == "failed" and "LMAuthError" in saved.stop_reason
        assert saved.selection is None and len(saved.steps) == 1
        # The refused evaluation did not run: metric_calls counts the 9 that did.
        assert saved.metric_calls == 9 and saved.candidates[1].status == "pending"
        assert sum(s is not None for c in saved.candidates for s in c.scores) == 9

        armed[0] = False
        endpoint.faults = FaultConfig()
        resumed = optimize(endpoint, train, metric=revoking_metric, log_dir=tmp_path, **options)
        second = endpoint.requests[len(first):]

    assert summary(resumed) == expected
    assert resumed.opro_run.status == "finished"
    before = {pair_of(r) for r in task_records(first, status=200)}
    after = [pair_of(r) for r in task_records(second, status=200)]
    assert len(before) == 9 and before.isdisjoint(after) and len(set(after)) == len(after)
    assert len(before) + len(after) == expected_tasks == resumed.opro_run.metric_calls
    assert expected_opro == 2  # one n=3 request per step
    assert len(opro_records(first + second, status=200)) == expected_opro  # step 0 was not asked again


def test_resume_with_a_larger_budget_continues_without_repeating_work(tmp_path):
    train = simulated_dataset(6)
    options = {"num_steps": 3, "num_candidates": 3, "num_threads": 1}
    with SimulatedEndpoint() as reference:
        expected = summary(optimize(reference, train, **options))
        expected_tasks = len(task_records(reference.requests))

    with SimulatedEndpoint() as endpoint:
        # 14 evaluations: the start (6), candidate 1 (6) and 2 of candidate 2's examples, then the budget stops it.
        stopped_program = optimize(endpoint, train, max_metric_calls=14, log_dir=tmp_path, **options)
        stopped = stopped_program.opro_run
        first = endpoint.requests
        assert stopped.status == "stopped" and stopped.metric_calls == 14
        assert len(task_records(first)) == 14 and [r.n for r in opro_records(first)] == [3]
        cut = {c.id: c.scores for c in stopped.candidates if c.status == "cut_short"}
        assert cut and all(c.reason.startswith("cut short") for c in stopped.candidates if c.id in cut)

        # The same budget again: the saved result, without an LM call.
        again = optimize(endpoint, train, max_metric_calls=14, log_dir=tmp_path, **options)
        assert len(endpoint.requests) == len(first) and summary(again) == summary(stopped_program)

        # Budget settings are not part of the fingerprint: a larger one continues the saved run.
        resumed = optimize(endpoint, train, max_metric_calls=200, log_dir=tmp_path, **options)
        second = endpoint.requests[len(first):]

    run = resumed.opro_run
    before = {pair_of(r) for r in task_records(first)}
    after = [pair_of(r) for r in task_records(second)]
    assert after, "the resumed run made no task request: it did not continue"
    assert before.isdisjoint(after) and len(set(after)) == len(after)
    assert run.status == "finished" and len(run.steps) == 3 and all(s.complete for s in run.steps)
    assert [r.n for r in opro_records(first + second)] == [3] * 3  # step 0's proposals are not bought again
    assert run.metric_calls == len(before) + len(after) == expected_tasks
    check_record_invariants(run, len(train))
    for candidate_id, partial in cut.items():  # what the cut-short candidates had is kept, the rest completed
        candidate = run.candidates[candidate_id]
        assert candidate.status == "scored"
        assert all(candidate.scores[i] == value for i, value in enumerate(partial) if value is not None)
    assert summary(resumed) == expected
