"""Evaluation fanned out over a real Dask cluster (worker processes on 127.0.0.1)."""

import os

import dspy
import pytest

from dspy_opro import OPROTeleprompter
from dspy_opro.testing import SimulatedEndpoint, simulated_dataset, simulated_metric

distributed = pytest.importorskip("distributed")

pytestmark = pytest.mark.slow  # starts a Dask cluster of worker processes


def lms(endpoint):
    connection = {"api_base": endpoint.base_url, "api_key": "x", "engine": "litellm", "cache": False,
                  "num_retries": 0}
    return dspy.LM("openai/sim-task", **connection), dspy.LM("openai/sim-opt", **connection)


def summary(compiled):
    run = compiled.opro_run
    return compiled.signature.instructions, [(c.instruction, c.status, c.scores) for c in run.candidates]


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=2, host="127.0.0.1",
                                  dashboard_address=None) as local, distributed.Client(local) as client:
        yield client


def compile_once(endpoint, *, executor=None, num_threads=1):
    task_lm, opt_lm = lms(endpoint)
    optimizer = OPROTeleprompter(simulated_metric, prompt_model=opt_lm, task_model=task_lm, num_steps=2,
                                 num_candidates=3, num_threads=num_threads, executor=executor)
    return optimizer.compile(dspy.Predict("question -> answer"), trainset=simulated_dataset(8, seed=3))


def test_dask_executor_equals_a_threaded_run(cluster):
    # Each step's proposals are one request with n (LiteLLM, an OpenAI-compatible model), so both runs see the same
    # replies in the same order; only the evaluations differ: worker processes versus this process's 4 threads.
    with SimulatedEndpoint() as endpoint:
        threaded = compile_once(endpoint, num_threads=4)
        task_requests = endpoint.count(kind="task")
    with SimulatedEndpoint() as endpoint:
        on_dask = compile_once(endpoint, executor=cluster.get_executor())
        assert endpoint.count(kind="task") == task_requests
    assert summary(on_dask) == summary(threaded)
    assert on_dask.opro_run.usage.task.calls == task_requests  # usage came back from the workers
    assert on_dask.opro_run.usage.task.prompt_tokens == threaded.opro_run.usage.task.prompt_tokens


def _on_a_dask_worker() -> bool:
    try:
        distributed.get_worker()
    except ValueError:
        return False
    return True


class KillsItsWorker(dspy.Module):
    """A program whose worker process dies whenever the instruction mentions 'crash'."""

    def __init__(self):
        super().__init__()
        self.predict = dspy.Predict("question -> answer")

    def forward(self, question):
        if "crash" in self.predict.signature.instructions and _on_a_dask_worker():
            os._exit(1)
        return self.predict(question=question)


def test_a_worker_that_dies_is_an_infrastructure_failure(cluster):
    scheduler = cluster.cluster.scheduler
    allowed, scheduler.allowed_failures = scheduler.allowed_failures, 0  # no silent rescheduling by Dask
    try:
        with SimulatedEndpoint() as endpoint:
            task_lm, _ = lms(endpoint)
            opt_lm = dspy.LM("openai/script", engine=_Scripted(["<INS>Please crash.</INS>"]), cache=False)
            optimizer = OPROTeleprompter(simulated_metric, prompt_model=opt_lm, task_model=task_lm, num_steps=1,
                                         num_candidates=1, num_exemplars=1, num_threads=1,
                                         executor=cluster.get_executor())
            compiled = optimizer.compile(KillsItsWorker(), trainset=simulated_dataset(1, seed=3))
    finally:
        scheduler.allowed_failures = allowed
    crashed = compiled.opro_run.candidates[1]
    assert crashed.status == "unscored" and "KilledWorker" in crashed.reason
    assert compiled.opro_run.candidates[0].status == "scored"


class _Scripted:
    def __init__(self, replies):
        self.replies = replies

    def complete(self, request):
        from dspy.lm15 import Message, Response, TextPart, Usage

        return Response(id=None, model="script", message=Message.assistant([TextPart(self.replies[0])]),
                        finish_reason="stop", usage=Usage(input_tokens=1, output_tokens=1, total_tokens=2))

    def stream(self, request):
        raise NotImplementedError

    def close(self):
        pass
