"""Evaluation fanned out over a real Dask cluster (worker processes on 127.0.0.1)."""

import os
import signal

import dspy
import pytest

from dspy_opro import OPROTeleprompter
from dspy_opro.testing import SimulatedEndpoint, simulated_dataset, simulated_metric
from tests.fakes import make_lm, scripted_optimizer
from tests.test_accounting import TASK, compile_fan_out, served, served_cost

distributed = pytest.importorskip("distributed")
SchedulerPlugin = pytest.importorskip("distributed.diagnostics.plugin").SchedulerPlugin

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
    with distributed.LocalCluster(n_workers=WORKERS, processes=True, threads_per_worker=2, host="127.0.0.1",
                                  dashboard_address=None) as local, distributed.Client(local) as client:
        yield client


WORKERS = 2


@pytest.fixture
def whole_cluster(cluster):
    """The module's cluster with both its workers up before the test. A test that kills workers leaves their nannies
    restarting them; killing another worker before they were back once left both nannies closed and the next
    test's evaluation waiting, with no worker, for ever (a CI run, 2026-12-03). A nanny whose worker was SIGKILLed
    does not always come back (Dask's own doing): should no worker be left, this fails within 120 s, saying so."""
    cluster.wait_for_workers(WORKERS, timeout=120)
    return cluster


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


def test_usage_through_the_dask_executor_equals_what_the_endpoint_served(cluster):
    """The usage of every evaluation comes back from the worker processes, exact, for a program on threads of its
    own (as ``tests/test_accounting.py`` checks it on this process's threads)."""
    with SimulatedEndpoint(cached_tokens=20) as endpoint:
        run = compile_fan_out(endpoint, num_threads=2, executor=cluster.get_executor()).opro_run
        task = served(endpoint, TASK)
        records = [r for r in endpoint.requests if r.model == "gpt-4o-mini"]
    got = run.usage.by_model[TASK]
    assert task[0] == 2 * run.metric_calls
    assert (got.calls, got.prompt_tokens, got.completion_tokens, got.cached_tokens) == task
    assert got.cost == pytest.approx(served_cost(records, TASK), rel=1e-9)


class RaisesWhileItsCallRuns(dspy.Module):
    """Starts its LM call on a thread of its own and, on "item" questions, raises before that call has ended (as a
    program does whose ``dspy.Parallel`` fails while its threads still run: DSPy's executor clears tqdm's instances
    unlocked, so two of them at once in one process can raise ``KeyError: <weakref ... to 'tqdm'>``)."""

    def __init__(self):
        super().__init__()
        self.predict = dspy.Predict("question -> answer")

    def forward(self, question):
        import contextvars
        import threading

        answers = []
        call = threading.Thread(target=contextvars.copy_context().run,
                                args=(lambda: answers.append(self.predict(question=question)),))
        call.start()
        if "1" in question:
            raise RuntimeError("gave up before its call ended")
        call.join()
        return answers[0]


def test_usage_of_calls_a_failed_program_left_running_on_a_dask_worker_comes_back(cluster):
    """The program raises while its own thread's LM call is still on its way (0.3 s per request): the result waits
    for that call on the worker, so the record's task usage is still what the endpoint served."""
    with SimulatedEndpoint(latency=0.3) as endpoint:
        task_lm, opt_lm = lms(endpoint)
        optimizer = OPROTeleprompter(simulated_metric, prompt_model=opt_lm, task_model=task_lm, num_steps=1,
                                     num_candidates=1, num_threads=2, executor=cluster.get_executor())
        run = optimizer.compile(RaisesWhileItsCallRuns(), trainset=simulated_dataset(4, seed=3)).opro_run
        records = [r for r in endpoint.requests if r.kind == "task" and r.status == 200]
    failed = [c.failed for c in run.candidates]
    assert failed and all(f for f in failed)  # some evaluations raised, with their calls in flight
    usage = run.usage.by_model["openai/sim-task"]
    assert (usage.calls, usage.prompt_tokens, usage.completion_tokens) == (
        len(records), sum(r.prompt_tokens for r in records), sum(r.completion_tokens for r in records))


def _on_a_dask_worker() -> bool:
    try:
        distributed.get_worker()
    except ValueError:
        return False
    return True


def held_by_the_client(client) -> list:
    """The tasks the client still holds (their results Dask would compute again, and pay for, if a worker died)."""

    async def nothing():
        return None

    client.sync(nothing)  # one turn of the client's loop: the releases queued before it have run
    return list(client.futures)


class DiesAfterItsFirstCall(dspy.Module):
    """Two LM calls in sequence; when the instruction mentions 'crash', the Dask worker dies between them, on the
    first ``deaths`` attempts (counted by files in ``markers``) and then no more."""

    def __init__(self, markers, deaths):
        super().__init__()
        self.predict = dspy.Predict("question -> answer")
        self.markers, self.deaths = str(markers), deaths

    def forward(self, question):
        first = self.predict(question=question)  # paid for: the provider bills it whatever happens next
        if "crash" in self.predict.signature.instructions and _on_a_dask_worker():
            died = len(os.listdir(self.markers))
            if died < self.deaths:
                open(os.path.join(self.markers, f"death-{died}"), "w").close()
                os._exit(1)
        self.predict(question=question + " Check: " + str(first.answer))
        return first


@pytest.mark.parametrize(("allowed_failures", "deaths"), [(0, 2), (0, 1), (1, 1)],
                         ids=["killed-twice-unscored", "killed-then-resubmitted", "rerun-by-dask"])
@pytest.mark.usefixtures("whole_cluster")
def test_a_worker_that_dies_is_an_infrastructure_failure(cluster, tmp_path, allowed_failures, deaths):
    """A worker that dies after the first of two LM calls: its evaluation is paid again (by Dask's own rerun with
    ``allowed_failures=1``, by OPRO's one resubmission after ``KilledWorker`` with 0), and the record's task usage
    is what the endpoint served, the dead attempts' calls included. Killed on both tries, the candidate is
    unscored (an infrastructure failure) and only its dead attempts were paid."""
    scheduler = cluster.cluster.scheduler
    allowed, scheduler.allowed_failures = scheduler.allowed_failures, allowed_failures
    try:
        with SimulatedEndpoint() as endpoint:
            task_lm = endpoint.lm(TASK, num_retries=0)
            opt_lm, _ = make_lm(scripted_optimizer(["<INS>Please crash.</INS>"]), model="openai/script")
            optimizer = OPROTeleprompter(simulated_metric, prompt_model=opt_lm, task_model=task_lm, num_steps=1,
                                         num_candidates=1, num_exemplars=1, num_threads=1,
                                         executor=cluster.get_executor())
            compiled = optimizer.compile(DiesAfterItsFirstCall(tmp_path, deaths), trainset=simulated_dataset(1, seed=3))
            task = served(endpoint, TASK)
            records = [r for r in endpoint.requests if r.model == TASK.split("/", 1)[1]]
    finally:
        scheduler.allowed_failures = allowed
    run = compiled.opro_run
    assert len(os.listdir(tmp_path)) == deaths
    crashed = run.candidates[1]
    if deaths == 2:
        assert crashed.status == "unscored" and "KilledWorker" in crashed.reason
        assert task[0] == 2 + 2  # the start's two calls; one call by each dead attempt
    else:
        assert crashed.status == "scored"
        assert task[0] == 2 + 1 + 2  # the start's two; the dead attempt's one; the attempt that came back, two
    assert run.candidates[0].status == "scored"
    assert held_by_the_client(cluster) == []  # each task released once its result was in
    got = run.usage.task
    assert (got.calls, got.prompt_tokens, got.completion_tokens, got.cached_tokens) == task
    assert got.cost == pytest.approx(served_cost(records, TASK), rel=1e-9)
    assert run.usage.by_model[TASK].calls == task[0]


class KillsTheFirstWorkerToFinish(SchedulerPlugin):
    """Kills (SIGKILL) the worker that holds the first finished task, just after the scheduler learns of it, so its
    result is lost with the worker and Dask computes the task again."""

    def __init__(self, scheduler):
        self.scheduler, self.killed = scheduler, []

    def transition(self, key, start, finish, *args, **kwargs):
        if finish == "memory" and not self.killed:
            for worker in self.scheduler.tasks[key].who_has:
                self.killed.append((key, start, worker.address, worker.pid))
                os.kill(worker.pid, signal.SIGKILL)


@pytest.mark.usefixtures("whole_cluster")
def test_an_evaluation_dask_computes_again_counts_each_time_it_was_paid(cluster, tmp_path):
    """The first evaluation finishes, then its worker dies before the result is fetched: Dask runs it again. Both
    runs were paid, and the record's task usage is what the endpoint served."""
    scheduler = cluster.cluster.scheduler
    plugin = KillsTheFirstWorkerToFinish(scheduler)
    scheduler.add_plugin(plugin, name="kills-the-first-worker-to-finish")
    try:
        with SimulatedEndpoint() as endpoint:
            task_lm = endpoint.lm(TASK, num_retries=0)
            opt_lm, _ = make_lm(scripted_optimizer(["<INS>Answer well.</INS>"]), model="openai/script")
            optimizer = OPROTeleprompter(simulated_metric, prompt_model=opt_lm, task_model=task_lm, num_steps=1,
                                         num_candidates=1, num_exemplars=1, num_threads=1,
                                         executor=cluster.get_executor())
            compiled = optimizer.compile(DiesAfterItsFirstCall(tmp_path, 0), trainset=simulated_dataset(1, seed=3))
            task = served(endpoint, TASK)
            records = [r for r in endpoint.requests if r.model == TASK.split("/", 1)[1]]
    finally:
        scheduler.remove_plugin(name="kills-the-first-worker-to-finish")
    run = compiled.opro_run
    assert len(plugin.killed) == 1
    assert held_by_the_client(cluster) == []
    assert [c.status for c in run.candidates] == ["scored", "scored"]
    assert run.metric_calls == 2
    assert task[0] == 2 + 2 + 2  # the start's run, lost with its worker; its run again; the candidate's
    got = run.usage.task
    assert (got.calls, got.prompt_tokens, got.completion_tokens, got.cached_tokens) == task
    assert got.cost == pytest.approx(served_cost(records, TASK), rel=1e-9)
