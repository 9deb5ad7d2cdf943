"""The fan-out of evaluations: jobs fed to threads or any executor, within the run's budget.

:class:`Evaluator` feeds (candidate, example) jobs (:mod:`dspy_opro.scoring.evaluation`) to a thread pool or any
``concurrent.futures.Executor`` (a Dask cluster included) lazily, so the ``max_metric_calls`` and ``max_cost``
budgets stop it at an exact count, and yields each finished result in the calling thread. Every evaluation runs
in a copy of the caller's context (DSPy's settings and active call id), as DSPy's own parallel executor does.

:class:`Budget` reads what was spent from the run record (the one count of evaluations, ``metric_calls``, and the
recorded cost) and adds the evaluations in flight, so nothing is counted twice.

Nothing hangs the run: an evaluation that has not finished ``timeout`` seconds after it was handed to a worker is
abandoned, retried once, then reported as an ``infra`` outcome (the candidate is left unscored and compiling again
scores it). A thread cannot be killed, so the abandoned one runs on, in the background: its late result is never
read, and what its LM calls cost, should they ever return, is not counted (the provider may bill it). Worker
threads are daemon threads, so neither an abandoned evaluation nor Ctrl-C waits for them: the process ends at once,
and :meth:`Evaluator.take_finished` hands over the evaluations that finished but were not yet consumed, so the run
records them before it saves.

On a Dask cluster an evaluation can be paid for more than once: a worker that dies mid-evaluation (Dask reruns the
task, or the evaluator resubmits it after ``KilledWorker``), or a result lost with its worker and computed again.
Each attempt reports its usage to the scheduler as it is paid (:mod:`dspy_opro.scoring.dask_usage`), and the result
that is recorded carries, besides its own usage, that of the job's lost attempts (all of them when the job finally
failed), so the record's task usage and ``max_cost`` see every call the provider served.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextvars
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from dspy_opro.compat import current_context, run_in_context
from dspy_opro.errors import OPRORunError, describe_exception
from dspy_opro.record.state import RunState, budget_spent
from dspy_opro.scoring.dask_usage import UsageLedger, add_usage, dask_client, submit_to_dask
from dspy_opro.scoring.evaluation import ExampleJob, ExampleResult, run_example

logger = logging.getLogger(__name__)


@dataclass
class Budget:
    """The run's limits, checked against what its record says was spent.

    Args:
        max_metric_calls: The limit in evaluations, or None.
        max_cost: The limit in USD, or None.
        state: The run record: ``metric_calls`` and ``usage.total_cost`` are what was spent.
    """

    max_metric_calls: int | None
    max_cost: float | None
    state: RunState

    def remaining_calls(self) -> int | None:
        """Evaluations the limit still allows (None without a limit)."""
        if self.max_metric_calls is None:
            return None
        return max(self.max_metric_calls - self.state.metric_calls, 0)

    def exhausted(self, *, in_flight: int = 0) -> str | None:
        """Why no further evaluation may start, with ``in_flight`` already running; None while one may."""
        return budget_spent(self.state, max_metric_calls=self.max_metric_calls, max_cost=self.max_cost,
                            in_flight=in_flight)


class Batch:
    """The results of one batch of jobs, in the order they finish; ``stop_reason`` is set once it is consumed.

    Iterate it in the thread that owns the run record: a result is yielded only after it left the in-flight count,
    and the next job starts only after the consumer has recorded it, so the budget sees every evaluation once.
    """

    def __init__(self, evaluator: Evaluator, jobs: Iterable[ExampleJob], budget: Budget):
        self._evaluator, self._jobs, self._budget = evaluator, jobs, budget
        self.stop_reason: str | None = None

    def __iter__(self) -> Iterator[ExampleResult]:
        evaluator, budget = self._evaluator, self._budget
        pending: dict[cf.Future[ExampleResult], tuple[ExampleJob, int, float]] = {}
        job_iter = iter(self._jobs)
        jobs_left = True
        try:
            while True:
                while jobs_left and self.stop_reason is None and len(pending) < evaluator.max_in_flight:
                    self.stop_reason = budget.exhausted(in_flight=len(pending))
                    if self.stop_reason is not None:
                        break
                    job = next(job_iter, None)
                    if job is None:
                        jobs_left = False
                        break
                    job = evaluator.tag(job)  # before its first submission: every attempt reports on one channel
                    pending[evaluator.submit(job)] = (job, 0, time.monotonic())
                if not pending:
                    return
                done, _ = cf.wait(pending, timeout=self._wait_time(pending), return_when=cf.FIRST_COMPLETED)
                for future in done:
                    job, resubmits, _started = pending.pop(future)
                    try:
                        result = evaluator.consume(future)
                    except Exception as exc:  # the worker itself failed, not the program
                        if "pickle" in str(exc).lower():
                            raise OPRORunError(
                                f"the executor could not transfer an evaluation job ({describe_exception(exc)}). Jobs "
                                "carry the program, the example, the metric and the task LM; DSPy's signatures need "
                                "cloudpickle, so use a Dask executor (distributed.Client(...).get_executor()) "
                                "rather than concurrent.futures.ProcessPoolExecutor, and make the metric importable"
                            ) from exc
                        if resubmits < 1:
                            logger.warning("Worker failed on example %d (%s); retrying once", job.index,
                                           describe_exception(exc))
                            pending[evaluator.submit(job)] = (job, resubmits + 1, time.monotonic())
                            continue
                        result = ExampleResult(job.candidate_id, job.index, "infra", error=describe_exception(exc),
                                               split=job.split)
                    yield evaluator.settle(job, result)
                for future in self._overdue(pending):
                    job, resubmits, _started = pending.pop(future)
                    evaluator.abandon(future)
                    error = (f"TimeoutError: the evaluation did not finish within timeout={evaluator.timeout:g} s "
                             "and was abandoned")
                    if resubmits < 1:
                        logger.warning("Evaluation of %s example %d did not finish within timeout=%g s; abandoned, "
                                       "retrying once", job.split, job.index, evaluator.timeout)
                        pending[evaluator.submit(job)] = (job, resubmits + 1, time.monotonic())
                        continue
                    yield evaluator.settle(job, ExampleResult(job.candidate_id, job.index, "infra", error=error,
                                                              split=job.split))
        finally:
            for future in pending:  # an exception in the consumer, or Ctrl-C: start nothing more
                future.cancel()

    def _wait_time(self, pending: dict[cf.Future[ExampleResult], tuple[ExampleJob, int, float]]) -> float | None:
        """Seconds until the first evaluation in flight is overdue (None: no time limit)."""
        timeout = self._evaluator.timeout
        if timeout is None:
            return None
        first = min(started for _, _, started in pending.values())
        return max(first + timeout - time.monotonic(), 0.0)

    def _overdue(self, pending: dict[cf.Future[ExampleResult], tuple[ExampleJob, int, float]]
                 ) -> list[cf.Future[ExampleResult]]:
        timeout = self._evaluator.timeout
        if timeout is None:
            return []
        now = time.monotonic()
        return [f for f, (_, _, started) in pending.items() if not f.done() and now - started >= timeout]


class _DaemonThreads(cf.Executor):
    """One daemon thread per job: nothing waits for a thread that never returns (an abandoned evaluation), not
    even the interpreter at exit, as it would for a ``ThreadPoolExecutor``'s workers."""

    _numbers = itertools.count(1)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        future: cf.Future[Any] = cf.Future()

        def work() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)

        threading.Thread(target=work, name=f"opro-eval-{next(self._numbers)}", daemon=True).start()
        return future


class Evaluator:
    """Runs (candidate, example) jobs on a thread pool or a given executor.

    Args:
        num_threads: Worker threads when no executor is given.
        executor: Any ``concurrent.futures.Executor``; jobs are pickled if it runs them in other processes.
        timeout: Seconds after which an evaluation handed to a worker is abandoned (None: no limit).
    """

    # The context a job runs in, given its split and candidate id (the run's spans set it); None: a plain copy of
    # the caller's. Only for the evaluator's own threads: an executor's jobs may leave the process.
    job_context: Callable[[str, int], contextvars.Context] | None = None

    def __init__(self, *, num_threads: int = 1, executor: cf.Executor | None = None, timeout: float | None = None):
        self.num_threads = max(1, num_threads)
        self.timeout = timeout
        self._external = executor
        self._pool: cf.Executor | None = None
        self._unconsumed: dict[cf.Future[ExampleResult], ExampleJob] = {}  # submitted, neither consumed nor abandoned
        self._dask = dask_client(executor)  # the client of a Dask executor, else None
        self._ledger: UsageLedger | None = None  # a Dask executor's: what lost attempts cost (made at the first job)
        self._dask_futures: dict[cf.Future[ExampleResult], Any] = {}  # a Dask task's future, until it is released
        self._lock = threading.Lock()
        self.abandoned = 0

    @property
    def max_in_flight(self) -> int:
        # Threads: one job per worker, so a budget check sits between every two evaluations. Other executors:
        # a queue of twice their width hides the round trip to remote workers.
        return self.num_threads if self._external is None else max(self.num_threads, 8) * 2

    def tag(self, job: ExampleJob) -> ExampleJob:
        """``job`` as it is submitted: on a Dask executor, with the usage channel its attempts report on."""
        if self._dask is None:
            return job
        if self._ledger is None:
            self._ledger = UsageLedger(self._dask)
        return self._ledger.tag(job)

    def settle(self, job: ExampleJob, result: ExampleResult) -> ExampleResult:
        """``result`` with the usage of the job's lost attempts added (a Dask executor's; else as it is), once."""
        if self._ledger is None:
            return result
        lost = self._ledger.settle(job.usage_channel, result.attempt)
        if lost:
            result.usage = add_usage(result.usage, lost)
        return result

    def submit(self, job: ExampleJob) -> cf.Future[ExampleResult]:
        future = self._submit(job)
        with self._lock:
            self._unconsumed[future] = job
        return future

    def _submit(self, job: ExampleJob) -> cf.Future[ExampleResult]:
        if self._external is not None and self._dask is not None:
            future, dask_future = submit_to_dask(self._external, self._dask, run_example, job)
            with self._lock:
                self._dask_futures[future] = dask_future
            return future
        if self._external is not None:
            return self._external.submit(run_example, job)
        if self._pool is None:
            self._pool = _DaemonThreads()
        # The worker adopts the caller's DSPy settings and active call id, so callbacks and tracing nest the
        # evaluation under the compile that started it, as DSPy's own parallel executor does; and it runs in a copy
        # of the caller's contextvars context, so the user's context values and spans contain the program run.
        return self._pool.submit(caller_context(self.job_context, job).run, run_in_context, current_context(),
                                 run_example, job)

    def consume(self, future: cf.Future[ExampleResult]) -> ExampleResult:
        """The result of a finished evaluation, handed over once (it raises what the worker raised), with the usage of
        its job's lost attempts."""
        with self._lock:
            job = self._unconsumed.pop(future, None)
        try:
            result = future.result()
        finally:
            self._release([future])
        return self.settle(job, result) if job is not None else result

    def _release(self, futures: Iterable[cf.Future[ExampleResult]] | None = None) -> None:
        """Let Dask forget these tasks (None: all): a result it still held would be computed (and paid for) again
        whenever the worker holding it died."""
        with self._lock:
            chosen = list(self._dask_futures) if futures is None else futures
            dask_futures = [self._dask_futures.pop(f) for f in chosen if f in self._dask_futures]
        for dask_future in dask_futures:
            dask_future.release()

    def abandon(self, future: cf.Future[ExampleResult]) -> None:
        """Give up on an overdue evaluation: its result, whenever it comes, is never read."""
        future.cancel()
        with self._lock:
            self._unconsumed.pop(future, None)
            self.abandoned += 1
        self._release([future])

    def take_finished(self) -> list[ExampleResult]:
        """The evaluations that finished but were never consumed (a run stopped by Ctrl-C or an error), once."""
        with self._lock:
            finished = [(f, job) for f, job in self._unconsumed.items()
                        if f.done() and not f.cancelled() and f.exception() is None]
            self._unconsumed.clear()
        results = [self.settle(job, future.result()) for future, job in finished]
        self._release()
        return results

    def run(self, jobs: Iterable[ExampleJob], budget: Budget) -> Batch:
        """The results of ``jobs``, run in order until done or the budget is spent (then ``stop_reason`` says why).

        A job whose worker failed (for example a Dask worker that died) is resubmitted once and then reported as an
        ``infra`` outcome.
        """
        return Batch(self, jobs, budget)

    def close(self) -> None:
        """Start nothing more; wait for nothing (a hung evaluation must not keep the run, or Ctrl-C, waiting)."""
        with self._lock:
            for future in self._unconsumed:
                future.cancel()
            self._unconsumed.clear()
        self._release()
        self._pool = None
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None


def caller_context(job_context: Callable[[str, int], contextvars.Context] | None,
                   job: ExampleJob) -> contextvars.Context:
    """The context ``job`` runs in: a copy of the calling thread's ``contextvars`` context (as
    ``contextvars.copy_context()`` gives), or the one ``job_context`` makes for its candidate."""
    if job_context is None:
        return contextvars.copy_context()
    return job_context(job.split, job.candidate_id)


__all__ = ["Batch", "Budget", "Evaluator", "caller_context"]
