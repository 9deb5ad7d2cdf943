"""Exact accounting against the simulated endpoint's request log: tokens and cost per model under any threading,
LiteLLM's per-response cost with cached-token discounts, roll-up into ``dspy.track_usage()``, ``max_cost`` as a hard
budget, and tracing that nests every program run under compile. (Usage through a Dask executor:
``tests/test_dask.py``.)"""

from __future__ import annotations

import dspy
import litellm
import pytest

from dspy_opro import OPROTeleprompter
from dspy_opro.errors import OptimizerUnavailableError
from dspy_opro.testing import SimulatedEndpoint, simulated_dataset, simulated_metric
from dspy_opro.testing.faults import FaultConfig

TASK, OPTIMIZER = "openai/gpt-4o-mini", "openai/gpt-4o"


pytestmark = pytest.mark.compat  # the compatibility subset: usage, on every DSPy 3.x CI installs


class FanOut(dspy.Module):
    """A program that runs its two predictors on DSPy's parallel executor (worker threads of its own)."""

    def __init__(self, threads: int = 2):
        super().__init__()
        self.draft = dspy.Predict("question -> answer")
        self.check = dspy.Predict("question -> answer")
        self.threads = threads

    def forward(self, question):
        parallel = dspy.Parallel(num_threads=self.threads, disable_progress_bar=True)
        first, _ = parallel([(self.draft, {"question": question}), (self.check, {"question": question})])
        return first


def served(endpoint, model: str) -> tuple[int, int, int, int]:
    """(requests, prompt tokens, completion tokens, cached tokens) the endpoint answered for a model."""
    records = [r for r in endpoint.requests if r.model == model.split("/", 1)[1] and r.status == 200]
    return (len(records), sum(r.prompt_tokens for r in records), sum(r.completion_tokens for r in records),
            sum(r.cached_tokens for r in records))


def served_cost(records, model: str) -> float:
    """The bill of these requests at LiteLLM's list prices for the model, cached prompt tokens at the cache rate."""
    prices = litellm.model_cost[model.split("/", 1)[1]]
    cache_rate = prices.get("cache_read_input_token_cost", prices["input_cost_per_token"])
    return sum((r.prompt_tokens - r.cached_tokens) * prices["input_cost_per_token"] + r.cached_tokens * cache_rate
               + r.completion_tokens * prices["output_cost_per_token"] for r in records if r.status == 200)


def compile_fan_out(endpoint, *, num_threads=1, program_threads=2, executor=None, **options):
    optimizer = OPROTeleprompter(simulated_metric, prompt_model=endpoint.lm(OPTIMIZER, num_retries=0),
                                 task_model=endpoint.lm(TASK, num_retries=0), num_steps=2, num_candidates=2,
                                 num_threads=num_threads, executor=executor, **options)
    return optimizer.compile(FanOut(program_threads), trainset=simulated_dataset(6, seed=1))


@pytest.mark.parametrize("num_threads", [1, 8])
def test_usage_of_a_program_on_threads_equals_what_the_endpoint_served(num_threads):
    with SimulatedEndpoint(cached_tokens=20) as endpoint:
        run = compile_fan_out(endpoint, num_threads=num_threads).opro_run
        task, optimizer = served(endpoint, TASK), served(endpoint, OPTIMIZER)
        records = endpoint.requests
    usage = run.usage
    assert task[0] == 2 * run.metric_calls == 2 * 6 * (1 + len(run.candidates) - 1)  # two requests per run
    got = usage.by_model[TASK]
    assert (got.calls, got.prompt_tokens, got.completion_tokens, got.cached_tokens) == task
    got = usage.by_model[OPTIMIZER]
    assert (got.calls, got.prompt_tokens, got.completion_tokens, got.cached_tokens) == optimizer
    assert (usage.task.calls, usage.optimizer.calls) == (task[0], optimizer[0])
    # LiteLLM's per-response cost: cached prompt tokens at the discounted rate.
    assert usage.by_model[TASK].cost == pytest.approx(served_cost([r for r in records if r.model == "gpt-4o-mini"],
                                                                  TASK), rel=1e-9)
    assert usage.optimizer.cost == pytest.approx(served_cost([r for r in records if r.model == "gpt-4o"], OPTIMIZER),
                                                 rel=1e-9)
    assert usage.task.unpriced_calls == usage.optimizer.unpriced_calls == 0


def test_track_usage_around_compile_sees_the_runs_usage():
    with SimulatedEndpoint() as endpoint, dspy.track_usage() as tracker:
        compile_fan_out(endpoint, num_threads=4)
        task, optimizer = served(endpoint, TASK), served(endpoint, OPTIMIZER)
    totals = tracker.get_total_tokens()
    assert (totals[TASK]["prompt_tokens"], totals[TASK]["completion_tokens"]) == task[1:3]
    assert (totals[OPTIMIZER]["prompt_tokens"], totals[OPTIMIZER]["completion_tokens"]) == optimizer[1:3]
    assert task[1] > 0 and optimizer[1] > 0


def test_an_unpriced_model_leaves_the_cost_unknown():
    with SimulatedEndpoint() as endpoint:
        optimizer = OPROTeleprompter(simulated_metric, prompt_model=endpoint.lm("openai/sim-opt"),
                                     task_model=endpoint.lm("openai/sim-task"), num_steps=1, num_candidates=2,
                                     num_threads=2)
        usage = optimizer.compile(FanOut(), trainset=simulated_dataset(4, seed=1)).opro_run.usage
        requests = served(endpoint, "openai/sim-task")[0]
    assert (usage.task.unpriced_calls, usage.task.cost, usage.task.cost_known) == (requests, 0.0, False)


def request_cost(record) -> float:
    return served_cost([record], TASK if record.model == "gpt-4o-mini" else OPTIMIZER)


def test_max_cost_is_a_hard_budget_exceeded_only_by_the_evaluation_in_flight():
    with SimulatedEndpoint() as endpoint:
        # Room for step 0's optimizer request at its worst case (n x max_tokens=10: tests/test_optimizer_calls.py
        # checks that bound), so that the evaluations, not an optimizer request, meet the budget.
        max_cost = 0.0012
        run = compile_fan_out(endpoint, num_threads=1, max_cost=max_cost, max_tokens=10).opro_run
        records = endpoint.requests
    spent, crossed = 0.0, None
    for position, record in enumerate(records):
        spent += request_cost(record)
        if crossed is None and spent >= max_cost:
            crossed = position
    assert run.status == "stopped" and run.stop_reason.startswith(f"max_cost=${max_cost:g} reached")
    # After the request that reached the budget, at most the rest of the evaluation in flight (two requests each).
    assert crossed is not None and len(records) - 1 - crossed <= 1
    assert all(record.model == "gpt-4o-mini" for record in records[crossed + 1:])
    assert run.usage.total_cost == pytest.approx(spent, rel=1e-9)


class Nesting(dspy.utils.callback.BaseCallback):
    """Records each compile's and evaluation's call id and the parent call id of every module run and evaluation."""

    def __init__(self):
        self.compiles: list[str] = []
        self.evaluations: dict[str, str | None] = {}
        self.parents: list[tuple[str, str | None]] = []

    def on_compile_start(self, call_id, instance, inputs):
        self.compiles.append(call_id)

    def on_evaluate_start(self, call_id, instance, inputs):
        from dspy.utils.callback import ACTIVE_CALL_ID

        self.evaluations[call_id] = ACTIVE_CALL_ID.get()

    def on_module_start(self, call_id, instance, inputs):
        from dspy.utils.callback import ACTIVE_CALL_ID

        self.parents.append((type(instance).__name__, ACTIVE_CALL_ID.get()))


@pytest.mark.skipif(dspy.__version__ < "3.3", reason="DSPy reports compile calls to callbacks from 3.3")
@pytest.mark.parametrize("num_threads", [1, 4])
def test_callbacks_nest_every_program_run_under_its_evaluation_under_compile(num_threads):
    nesting = Nesting()
    with SimulatedEndpoint() as endpoint, dspy.context(callbacks=[nesting]):
        run = compile_fan_out(endpoint, num_threads=num_threads).opro_run
    program_runs = [parent for name, parent in nesting.parents if name == "FanOut"]
    assert len(nesting.compiles) == 1
    # One dspy.Evaluate per scored candidate, each a child of the compile, each program run a child of one of them.
    assert list(nesting.evaluations.values()) == [nesting.compiles[0]] * len(run.scored())
    assert len(program_runs) == run.metric_calls and set(program_runs) == set(nesting.evaluations)


def test_the_unknown_price_warning_points_at_the_callers_line():
    with SimulatedEndpoint() as endpoint:
        optimizer = OPROTeleprompter(simulated_metric, prompt_model=endpoint.lm("openai/sim-opt"),
                                     task_model=endpoint.lm(TASK), num_steps=1, num_candidates=1, max_cost=1.0)
        with pytest.warns(UserWarning, match="has no known price") as caught:
            optimizer.compile(dspy.Predict("question -> answer"), trainset=simulated_dataset(3, seed=1))
    warning = next(w for w in caught if "no known price" in str(w.message))
    assert (warning.filename, warning.lineno) == (__file__, test_the_unknown_price_warning_points_at_the_callers_line
                                                  .__code__.co_firstlineno + 5)


def test_a_program_that_tracks_its_own_usage_still_counts():
    class SelfTracking(dspy.Module):
        def __init__(self):
            super().__init__()
            self.predict = dspy.Predict("question -> answer")

        def forward(self, question):
            with dspy.track_usage():  # DSPy 3.4 rolls it up into the tracker around it on exit
                return self.predict(question=question)

    with SimulatedEndpoint(cached_tokens=20) as endpoint:
        optimizer = OPROTeleprompter(simulated_metric, prompt_model=endpoint.lm(OPTIMIZER),
                                     task_model=endpoint.lm(TASK), num_steps=1, num_candidates=1, num_threads=2)
        usage = optimizer.compile(SelfTracking(), trainset=simulated_dataset(4, seed=1)).opro_run.usage
        task = served(endpoint, TASK)
        records = [r for r in endpoint.requests if r.model == "gpt-4o-mini"]
    got = usage.by_model[TASK]
    assert (got.calls, got.prompt_tokens, got.completion_tokens, got.cached_tokens) == task
    # Counted once (the meter, not the roll-up), cached prompt tokens at the cached rate.
    assert got.cost == pytest.approx(served_cost(records, TASK), rel=1e-9)


@pytest.mark.parametrize("fail_kind", ["invalid_utf8", "malformed_usage", "empty_choices"])
def test_a_200_reply_the_client_could_not_use_still_counts_the_usage_it_carried(fail_kind):
    """A 200 reply that is not UTF-8 or not JSON as a whole (a server error to DSPy), or has no choices (a program
    failure), was served and carried a usage object: its tokens and cost count, so the record equals what the
    endpoint billed."""
    from dspy_opro.testing import FaultConfig

    faults = FaultConfig(fail_requests={2, 3}, fail_kind=fail_kind, only_kinds={"task"})
    with SimulatedEndpoint(faults=faults) as endpoint:
        optimizer = OPROTeleprompter(simulated_metric, prompt_model=endpoint.lm(OPTIMIZER, num_retries=0),
                                     task_model=endpoint.lm(TASK, num_retries=0), num_steps=1, num_candidates=1,
                                     num_threads=1)
        run = optimizer.compile(dspy.Predict("question -> answer"), trainset=simulated_dataset(4)).opro_run
        tasks = [r for r in endpoint.requests if r.kind == "task"]
    assert [r.fault for r in tasks[2:4]] == [fail_kind, fail_kind] and all(r.status == 200 for r in tasks)
    usage = run.usage.by_model[TASK]
    assert (usage.prompt_tokens, usage.completion_tokens) == (sum(r.prompt_tokens for r in tasks),
                                                             sum(r.completion_tokens for r in tasks))
    assert usage.cost == pytest.approx(served_cost(tasks, TASK), rel=1e-9)


@pytest.mark.parametrize("kind", ["no_usage", "negative_usage"])
def test_replies_without_a_usage_that_can_be_true_are_estimated_and_max_cost_still_holds(kind, caplog):
    """Every task reply comes without ``usage`` (or with negative counts): each call's tokens are estimated from its
    text, the cost is marked estimated and said once, and ``max_cost`` stops the run as it would with true usage
    (the estimate is above the served bill here, so the bill stays within the budget)."""
    import logging

    faults = FaultConfig(fail_requests=set(range(10_000)), fail_kind=kind, only_kinds={"task"})
    with SimulatedEndpoint(faults=faults) as endpoint, caplog.at_level(logging.WARNING, logger="dspy_opro"):
        max_cost = 0.0012
        run = compile_fan_out(endpoint, num_threads=1, max_cost=max_cost, max_tokens=10).opro_run
        records = endpoint.requests
    task = run.usage.by_model[TASK]
    served = [r for r in records if r.model == "gpt-4o-mini"]
    assert task.calls == task.estimated_calls == len(served) > 0 and task.unpriced_calls == 0
    assert task.prompt_tokens >= sum(r.prompt_tokens for r in served) > 0
    assert run.status == "stopped" and run.stop_reason.startswith("max_cost")
    assert sum(request_cost(r) for r in records) <= max_cost < run.usage.total_cost + request_cost(records[-1]) * 3
    said = [m for m in caplog.messages if "answered without a usage that can be true" in m]
    assert len(said) == 1 and said[0].startswith(f"The model {TASK!r} answered")
    assert "estimated_calls" in said[0]


@pytest.mark.slow  # LiteLLM waits between its retries
def test_max_cost_holds_for_the_optimizer_with_the_clients_own_retries():
    """The optimizer model with DSPy's default ``num_retries=3``: every reply is an unreadable 200 carrying its
    usage, so one call is four billed requests. Each call is reserved at four requests' worst case, so the second
    try that no longer fits is not sent, and the endpoint's bill stays within ``max_cost``."""
    faults = FaultConfig(fail_requests=set(range(10_000)), fail_kind="malformed_usage", only_kinds={"opro"})
    with SimulatedEndpoint(faults=faults) as endpoint:
        def compile_run(num_steps, max_cost=None):
            optimizer = OPROTeleprompter(simulated_metric, prompt_model=endpoint.lm(OPTIMIZER, num_retries=3),
                                         task_model=endpoint.lm(TASK, num_retries=0), num_steps=num_steps,
                                         num_candidates=1, num_threads=1, max_tokens=10, max_cost=max_cost)
            return optimizer.compile(dspy.Predict("question -> answer"), trainset=simulated_dataset(3)).opro_run

        compile_run(0)
        start = sum(request_cost(r) for r in endpoint.requests)
        endpoint.reset_log()
        max_cost = start + 0.005  # about one call's four requests, not two calls' eight
        with pytest.raises(OptimizerUnavailableError, match="no call to the optimizer model"):
            compile_run(1, max_cost)
        opro = [r for r in endpoint.requests if r.kind == "opro"]
    assert len(opro) == 4 and all(r.status == 200 and r.fault == "malformed_usage" for r in opro)
    assert sum(request_cost(r) for r in endpoint.requests) <= max_cost
