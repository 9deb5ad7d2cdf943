"""Usage and cost: exact token totals under threads, judges inside the metric, cache hits, the max_cost stop."""

import uuid

import dspy
import pytest

from dspy_opro import OPROTeleprompter
from tests.fakes import FakeEngine, chat_reply, make_lm, toy_dataset, toy_metric, toy_task_reply

REPLIES = ["<INS>Better.</INS>", "<INS>Better better.</INS>", "<INS>Better better better.</INS>"]


def compile_with(task_lm, opt_lm, **kwargs):
    settings = {"num_steps": 2, "num_candidates": 3, "num_threads": 1, **kwargs}
    metric = settings.pop("metric", toy_metric)
    optimizer = OPROTeleprompter(metric, prompt_model=opt_lm, task_model=task_lm, **settings)
    return optimizer.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(6))


@pytest.mark.parametrize("num_threads", [1, 8])
def test_usage_totals_equal_the_engines_tokens(num_threads):
    task_lm, task_engine = make_lm(toy_task_reply, input_tokens=11, output_tokens=7)
    opt_lm, opt_engine = make_lm(lambda request, n: REPLIES[(n - 1) % 3], model="openai/opt", input_tokens=100,
                                 output_tokens=20)
    usage = compile_with(task_lm, opt_lm, num_threads=num_threads).opro_run.usage
    tasks, opts = len(task_engine.requests), len(opt_engine.requests)
    assert (tasks, opts) == (6 * 4, 6)
    assert usage.task.model_dump() == {"calls": tasks, "cache_hits": 0, "prompt_tokens": 11 * tasks,
                                       "completion_tokens": 7 * tasks, "cached_tokens": 0, "cost": 0.0,
                                       "unpriced_calls": tasks}
    assert usage.optimizer.model_dump() == {"calls": opts, "cache_hits": 0, "prompt_tokens": 100 * opts,
                                            "completion_tokens": 20 * opts, "cached_tokens": 0, "cost": 0.0,
                                            "unpriced_calls": opts}
    assert set(usage.by_model) == {"openai/fake", "openai/opt"}


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
    assert run.candidates[1].status == "unscored"
