"""A program that makes its LM calls on threads it starts itself, with the model of ``dspy.configure(lm=...)``.

Such threads see none of the DSPy context an evaluation runs in (their ``contextvars`` start empty), only the global
settings. The run's usage meter sits in the task LM's own callbacks, so their calls are counted all the same: the
record equals the simulated endpoint's request log, and ``max_cost`` holds. Marked ``compat``: it runs on every DSPy
release CI installs.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading

import dspy
import pytest

from dspy_opro import OPROTeleprompter
from dspy_opro.testing import SimulatedEndpoint, simulated_dataset, simulated_metric

pytestmark = pytest.mark.compat

TASK = "openai/gpt-4o-mini"


class OnAPool(dspy.Module):
    """Drafts an answer twice on a ThreadPoolExecutor of its own and returns the first draft."""

    def __init__(self):
        super().__init__()
        self.draft = dspy.Predict("question -> answer")

    def forward(self, question):
        with cf.ThreadPoolExecutor(max_workers=2) as pool:
            drafts = list(pool.map(lambda _: self.draft(question=question), range(2)))
        return drafts[0]


class OnAThread(dspy.Module):
    """Drafts an answer on a bare threading.Thread, then once more on the evaluation's own thread."""

    def __init__(self):
        super().__init__()
        self.draft = dspy.Predict("question -> answer")

    def forward(self, question):
        drafts = []
        thread = threading.Thread(target=lambda: drafts.append(self.draft(question=question)))
        thread.start()
        thread.join()
        drafts.append(self.draft(question=question))
        return drafts[0]


def served(endpoint) -> tuple[int, int, int]:
    records = [r for r in endpoint.requests if r.model == TASK.split("/")[1] and r.status == 200]
    return len(records), sum(r.prompt_tokens for r in records), sum(r.completion_tokens for r in records)


@pytest.fixture
def configured():
    """``dspy.configure(lm=...)`` on this thread, undone afterwards (only the thread that configured may change it)."""
    endpoint = SimulatedEndpoint().start()
    task = endpoint.lm(TASK, num_retries=0)
    before = dspy.settings.lm
    dspy.configure(lm=task)  # what a bare thread sees
    try:
        with dspy.context(lm=task):  # and this thread, through the test suite's own context
            yield endpoint, task
    finally:
        dspy.configure(lm=before)
        endpoint.stop()


@pytest.mark.parametrize("program", [OnAPool, OnAThread])
@pytest.mark.parametrize("num_threads", [1, 4])
def test_calls_on_threads_the_program_starts_are_counted_as_the_endpoint_served(configured, program, num_threads):
    endpoint, task = configured
    optimizer = OPROTeleprompter(simulated_metric, prompt_model=endpoint.lm("openai/gpt-4o", num_retries=0),
                                 num_steps=1, num_candidates=2, num_threads=num_threads, display_progress=False)
    run = optimizer.compile(program(), trainset=simulated_dataset(5, seed=3)).opro_run
    calls, prompt, completion = served(endpoint)
    assert calls == 2 * run.metric_calls == 2 * 5 * len(run.scored())  # two task calls per program run
    usage = run.usage.by_model[TASK]
    assert (usage.calls, usage.prompt_tokens, usage.completion_tokens) == (calls, prompt, completion)
    assert run.usage.task.calls == calls and task.callbacks == []  # the LM is left as it was


def test_max_cost_holds_for_calls_on_threads_the_program_starts(configured):
    endpoint, _ = configured
    optimizer = OPROTeleprompter(simulated_metric, prompt_model=endpoint.lm(TASK, num_retries=0), max_tokens=64,
                                 num_steps=3, num_candidates=2, num_threads=1, max_cost=0.0006, display_progress=False)
    run = optimizer.compile(OnAPool(), trainset=simulated_dataset(5, seed=3)).opro_run
    calls, prompt, completion = served(endpoint)
    assert run.status == "stopped" and run.stop_reason.startswith("max_cost=$0.0006 reached")
    assert run.usage.by_model[TASK].calls == calls  # the optimizer's and the program's threads' calls alike
    assert run.usage.task.calls == 2 * run.metric_calls
    # One evaluation at a time: the budget is passed by the evaluation that reached it, at most.
    one_evaluation = run.usage.task.cost / run.metric_calls
    assert 0.0006 <= run.usage.total_cost < 0.0006 + 1.5 * one_evaluation
