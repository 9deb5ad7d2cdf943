"""Usage and cost with fake LMs: judges inside the metric, cache hits, the max_cost stop, calls left in flight.

Token totals under threads are checked against the simulated endpoint's request log in ``tests/test_accounting.py``.
"""

import threading
import uuid

import dspy
import pytest

from dspy_opro import OPROTeleprompter
from tests.fakes import FakeEngine, chat_reply, field_value, make_lm, toy_dataset, toy_metric, toy_task_reply, user_text

REPLIES = ["<INS>Better.</INS>", "<INS>Better better.</INS>", "<INS>Better better better.</INS>"]


def compile_with(task_lm, opt_lm, **kwargs):
    settings = {"num_steps": 2, "num_candidates": 3, "num_threads": 1, **kwargs}
    metric = settings.pop("metric", toy_metric)
    optimizer = OPROTeleprompter(metric, prompt_model=opt_lm, task_model=task_lm, **settings)
    return optimizer.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(6))


def test_a_judge_inside_the_metric_counts_as_task_usage():
    judge_lm, judge_engine = make_lm(lambda request: chat_reply(verdict="yes"), model="openai/judge",
                                     input_tokens=3, output_tokens=1)
    judge = dspy.Predict("answer, reference -> verdict")

    def metric(example, prediction, trace=None):
        with dspy.context(lm=judge_lm):
            judge(answer=prediction.answer, reference=example.answer)
        return toy_metric(example, prediction)

    task_lm, task_engine = make_lm(toy_task_reply)
    opt_lm, _ = make_lm(lambda request, n: REPLIES[(n - 1) % 3], model="openai/opt")
    usage = compile_with(task_lm, opt_lm, metric=metric, num_threads=4).opro_run.usage
    assert usage.by_model["openai/judge"].calls == len(judge_engine.requests) == 24
    assert usage.by_model["openai/judge"].prompt_tokens == 72
    assert usage.task.calls == len(task_engine.requests) + len(judge_engine.requests)


def test_cache_hits_cost_nothing_and_are_counted_separately():
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=True)
    try:
        name = f"openai/cached-{uuid.uuid4().hex[:8]}"
        engine = FakeEngine(toy_task_reply)
        task_lm = dspy.LM(name, engine=engine, cache=True, num_retries=0)
        opt_lm, _ = make_lm(lambda request, n: REPLIES[(n - 1) % 3], model="openai/opt")
        first = compile_with(task_lm, opt_lm, num_steps=1).opro_run.usage.task
        opt_lm, _ = make_lm(lambda request, n: REPLIES[(n - 1) % 3], model="openai/opt")
        second = compile_with(task_lm, opt_lm, num_steps=1).opro_run.usage.task
    finally:
        dspy.configure_cache()
    assert (first.calls, first.cache_hits, first.prompt_tokens) == (24, 0, 240)
    assert (second.calls, second.cache_hits, second.prompt_tokens) == (24, 24, 0)
    assert len(engine.requests) == 24


def test_max_cost_stops_once_the_recorded_cost_reaches_it():
    # gpt-4o-mini is priced in LiteLLM's bundled map at $0.15 per million prompt tokens.
    task_lm, task_engine = make_lm(toy_task_reply, model="openai/gpt-4o-mini", input_tokens=100_000,
                                   output_tokens=0)
    opt_lm, _ = make_lm(lambda request, n: REPLIES[(n - 1) % 3], model="openai/opt")
    with pytest.warns(UserWarning, match="the optimizer model 'openai/opt' has no known price"):
        compiled = compile_with(task_lm, opt_lm, max_cost=0.1)
    run = compiled.opro_run
    # Each evaluation costs $0.015: the seventh brings the total to $0.105 >= $0.10.
    assert len(task_engine.requests) == 7
    assert run.usage.task.cost == pytest.approx(0.105)
    assert run.status == "stopped" and run.stop_reason.startswith("max_cost=$0.1 reached")
    assert run.candidates[1].status == "cut_short"


def callback_names() -> list[str]:
    return [type(callback).__name__ for callback in dspy.settings.callbacks]


def branches(side: dspy.Module, seen: list[tuple[str, list[str]]]) -> dspy.Module:
    """A program that runs a predictor and ``side`` on DSPy's parallel executor; ``seen`` gets the DSPy callbacks
    in force before, in and after the fork (a closure: OPRO runs deep copies of the program)."""

    class Branches(dspy.Module):
        def __init__(self):
            super().__init__()
            self.answer = dspy.Predict("question -> answer")
            self.side = side

        def forward(self, question):
            seen.append(("forward", callback_names()))
            parallel = dspy.Parallel(num_threads=2, max_errors=1, disable_progress_bar=True)
            first, _ = parallel([(self.answer, {"question": question}), (self.side, {"question": question})])
            seen.append(("after", callback_names()))
            return first

    return Branches()


def test_no_callback_joins_the_settings_of_an_evaluation_even_where_the_program_forks():
    """The meter sits in the task LM's own callbacks, so every module, adapter and tool call of an evaluation keeps
    DSPy's fast path (no callback in ``dspy.settings``), on the evaluation's thread and on the program's own."""
    task_lm, _ = make_lm(toy_task_reply)
    opt_lm, _ = make_lm(lambda request, n: REPLIES[(n - 1) % 3], model="openai/opt")
    seen: list[tuple[str, list[str]]] = []

    class Side(dspy.Module):
        def forward(self, question):
            seen.append(("branch", callback_names()))
            return dspy.Prediction(answer="side")

    optimizer = OPROTeleprompter(toy_metric, prompt_model=opt_lm, task_model=task_lm, num_steps=0,
                                 num_exemplars=1, num_threads=1)
    run = optimizer.compile(branches(Side(), seen), trainset=toy_dataset(2)).opro_run
    assert seen == [("forward", []), ("branch", []), ("after", [])] * 2
    assert run.usage.task.calls == 2 and task_lm.callbacks == []  # counted; the LM is left as it was


def test_usage_of_calls_a_failed_program_left_running_on_its_threads_is_counted():
    """The program fails while its other branch still calls the LM; that call ends later (here, once the next
    evaluation has begun) and is counted all the same: the meter counts a call when it ends, wherever it ran."""
    started, next_evaluation = threading.Event(), threading.Event()

    def reply(request):
        question = field_value(user_text(request), "question") or ""
        if question == "item 0":
            started.set()
            assert next_evaluation.wait(30), "the next evaluation never began"
        return toy_task_reply(request)

    class FailsOnceTheOtherBranchCalls(dspy.Module):
        def forward(self, question):
            if question != "item 0":
                next_evaluation.set()
                return dspy.Prediction(answer="side")
            assert started.wait(10)
            raise ValueError("the side branch failed")

    task_lm, task_engine = make_lm(reply, input_tokens=11, output_tokens=7)
    opt_lm, _ = make_lm(lambda request, n: REPLIES[(n - 1) % 3], model="openai/opt")
    optimizer = OPROTeleprompter(toy_metric, prompt_model=opt_lm, task_model=task_lm, num_steps=0,
                                 num_exemplars=1, num_threads=1)
    run = optimizer.compile(branches(FailsOnceTheOtherBranchCalls(), []), trainset=toy_dataset(2)).opro_run
    start = run.candidates[0]
    assert start.failed == [0] and start.errors[0].error == "Exception: Execution cancelled due to errors or " \
                                                            "interruption."
    assert len(task_engine.requests) == 2
    usage = run.usage.task
    assert (usage.calls, usage.prompt_tokens, usage.completion_tokens) == (2, 22, 14)


def test_calls_and_cache_hits_are_exact_with_dspy_history_disabled():
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=True)
    try:
        engine = FakeEngine(toy_task_reply)
        task_lm = dspy.LM(f"openai/cached-{uuid.uuid4().hex[:8]}", engine=engine, cache=True, num_retries=0)
        with dspy.context(disable_history=True):
            usage = []
            for _ in range(2):
                opt_lm, _ = make_lm(lambda request, n: REPLIES[(n - 1) % 3], model="openai/opt")
                usage.append(compile_with(task_lm, opt_lm, num_steps=1).opro_run.usage.task)
    finally:
        dspy.configure_cache()
    assert [(u.calls, u.cache_hits, u.prompt_tokens) for u in usage] == [(24, 0, 240), (24, 24, 0)]
    assert len(engine.requests) == 24
