"""Evaluations on DSPy's own machinery: each candidate's scoring is a real ``dspy.Evaluate`` call.

:class:`CandidateEvaluate` is a ``dspy.Evaluate``: DSPy's evaluation callbacks see it (``on_evaluate_start/end``, with
the candidate's program and an ``EvaluationResult`` of its per-example predictions and scores), so MLflow's autolog
makes a nested run of it with its traces and predictions table, as it does for COPRO's and MIPROv2's evaluations. It
differs from ``dspy.Evaluate`` only in what one example's evaluation is, because OPRO needs guarantees DSPy's does not
carry: a journal line per finished evaluation before the next starts (a kill loses only what is in flight), budgets
that stop it at an exact count, and results classified as OPRO counts them. So one example's evaluation takes a place
in the :class:`Budget` (or is not run once it is spent, or the run is stopping), runs
:func:`~dspy_opro.scoring.evaluation.run_example`, and hands the result to the run's ``record`` callback, which
journals and stores it. An error that must stop the run (a fatal LM error, a broken metric) is raised by ``record``:
no further example starts, and the call raises it.

The examples fan out on :meth:`Runner.map`, not on DSPy's ``ParallelExecutor``, which cannot carry two guarantees:
it resubmits a straggler (paid twice) and waits for a hung one forever, on threads the interpreter waits for at exit,
so neither a ``timeout`` nor Ctrl-C would end a run whose LM call hangs. The runner keeps the evaluations in flight on
persistent daemon threads, reused from evaluation to evaluation (an abandoned one runs on unread and nothing waits for
it; the meter still counts an LM call of it that ends while the run lasts), or on the user's executor (a Dask
cluster's included), each in a copy of its call's context; it abandons one that overruns ``timeout``, tries it once
more, then reports it as an infrastructure failure, and draws a bar like DSPy's executor's.

A round's calls (one per candidate) run at once (:meth:`Runner.concurrently`), sharing ``num_threads`` places
(:class:`RoundSlots`) handed out in candidate order, so a small training split or racing's short blocks still keep
every thread busy; the first error halts them all (:meth:`Budget.halt`).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextvars
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import dspy

from dspy_opro.compat import EvaluationResult, sharing_mlflow_runs, with_callbacks
from dspy_opro.errors import OPRORunError, describe_exception
from dspy_opro.scoring.dask_usage import UsageLedger, dask_client, submit_to_dask
from dspy_opro.scoring.evaluation import ExampleJob, ExampleResult, run_example
from dspy_opro.scoring.usage import add_usage
from dspy_opro.state import ModelUsage, RunState, budget_spent

logger = logging.getLogger(__name__)

@dataclass
class Budget:
    """The run's limits against what its record says was spent, and the evaluations in flight.

    Args:
        max_metric_calls: The limit in evaluations, or None.
        max_cost: The limit in USD, or None.
        state: The run record: ``metric_calls`` and ``usage.total_cost`` are what was spent.
    """

    max_metric_calls: int | None
    max_cost: float | None
    state: RunState
    in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    halted: threading.Event = field(default_factory=threading.Event)

    def exhausted(self) -> str | None:
        """Why no further evaluation may start now; None while one may."""
        if self.halted.is_set():
            return "the run is stopping"
        return budget_spent(self.state, max_metric_calls=self.max_metric_calls, max_cost=self.max_cost,
                            in_flight=self.in_flight)

    def halt(self) -> None:
        """Stop the run's evaluations: none starts, and none finishing later is recorded (the run is ending)."""
        with self.lock:  # a record in progress completes first
            self.halted.set()

    def reserve(self) -> str | None:
        """Take a place for one evaluation; why not, when the budget is spent."""
        with self.lock:
            reason = self.exhausted()
            if reason is None:
                self.in_flight += 1
            return reason



class RunHalted(Exception):
    """Raised in an evaluation call still running when the run stopped (its result is not recorded)."""


_POLL = 0.25  # seconds between looks at a halt while waiting


class RoundSlots:
    """The evaluations in flight of a round's ``dspy.Evaluate`` calls together, handed out in the calls' order.

    The call of rank ``r`` starts its examples once the calls before it have started all of theirs, taking each
    place as one frees, as one queue of the round's evaluations in candidate order would: which evaluation runs when
    does not depend on which thread the scheduler wakes first.

    Args:
        width: The places (``num_threads``).
    """

    def __init__(self, width: int):
        self._condition = threading.Condition()
        self._free = width
        self._feeding = 0  # the rank of the call whose examples start now
        self._wakeup: cf.Future[None] | None = None

    def take(self, rank: int, *, wait: bool, halted: threading.Event | None) -> bool:
        """A place for call ``rank``'s next evaluation; False when there is none now (``wait`` False) or the run
        halted."""
        with self._condition:
            while not (self._free and rank == self._feeding):
                if not wait:
                    self._arm()  # under the lock: a place freed from now on is not missed
                    return False
                if halted is not None and halted.is_set():
                    return False
                self._condition.wait(_POLL)
            self._free -= 1
            return True

    def give_back(self) -> None:
        with self._condition:
            self._free += 1
            self._condition.notify_all()
            if self._wakeup is not None and not self._wakeup.done():
                self._wakeup.set_result(None)

    def fed(self, rank: int) -> None:
        """Call ``rank`` starts no more evaluations: the next call's turn."""
        with self._condition:
            self._feeding = max(self._feeding, rank + 1)
            self._condition.notify_all()

    def wakeup(self) -> cf.Future[None]:
        """Done once a place frees after a ``take`` found none: the feeding call waits on it beside its own
        evaluations."""
        with self._condition:
            return self._arm()

    def _arm(self) -> cf.Future[None]:
        if self._wakeup is None or (self._wakeup.done() and not self._free):
            self._wakeup = cf.Future()
        return self._wakeup


def _with(context: Callable[[], Any], call: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        with context():
            return call()

    return run


class _DaemonPool(cf.Executor):
    """Persistent daemon threads, reused from evaluation to evaluation; a thread held by an abandoned evaluation is
    replaced by a new one. Daemon, so that neither a hung evaluation nor Ctrl-C waits for it, not even at exit."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._threads = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        future: cf.Future[Any] = cf.Future()
        with self._lock:
            self._queue.put((future, fn, args, kwargs))
            if self._idle:
                self._idle -= 1  # a waiting thread takes it
            else:
                self._threads += 1
                threading.Thread(target=self._work, name=f"opro-eval-{self._threads}", daemon=True).start()
        return future

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                with self._lock:
                    self._idle += 1
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                with self._lock:
                    self._idle += 1  # idle before the caller hears, so that its next job finds this thread
                future.set_exception(exc)
            else:
                with self._lock:
                    self._idle += 1
                future.set_result(result)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            idle, self._idle = self._idle, 0
        for _ in range(idle):
            self._queue.put(None)


class Runner:
    """Where evaluations run, and how long they may take.

    Args:
        executor: Any ``concurrent.futures.Executor`` (a Dask cluster's included; jobs are pickled if it runs them in
            other processes); None: the run's own daemon threads.
        timeout: Seconds an evaluation may take from its submission (None: no limit).
    """

    def __init__(self, *, executor: cf.Executor | None, timeout: float | None):
        self.executor, self.timeout = executor, timeout
        self._threads = _DaemonPool()  # the examples' threads without an executor; the concurrent calls' always
        self._dask = dask_client(executor)
        self._ledger: UsageLedger | None = None

    def map(self, items: Sequence[Any], start: Callable[[Any], ExampleJob | None],
            finish: Callable[[Any, ExampleResult], Any], *, width: int, context: contextvars.Context,
            progress: Any, slots: tuple[RoundSlots, int] | None = None,
            halted: threading.Event | None = None) -> list[Any]:
        """``finish(item, result)`` of every item whose ``start(item)`` gave a job, in item order (None for the rest);
        at most ``width`` jobs in flight, each in a copy of ``context``; ``start`` giving None stops the feeding.

        ``slots`` (the round's, and this call's rank in it) caps the jobs in flight of calls running at once
        together; once ``halted`` is set, the call returns without waiting for its jobs. A job overdue, or lost with
        its worker (a Dask worker that died), is tried once more, then its result is an ``infra`` failure.
        ``finish`` runs on this thread; what it raises propagates, and nothing more starts.
        """
        outcomes: list[Any] = [None] * len(items)
        pending: dict[cf.Future[ExampleResult], tuple[int, ExampleJob, int, float, Any]] = {}
        feed = iter(enumerate(items))
        feeding = True

        def submit(position: int, job: ExampleJob, attempt: int) -> None:
            future, dask_future = self._submit(job, context)
            pending[future] = (position, job, attempt, time.monotonic(), dask_future)

        def take_slot() -> bool:
            """A place among the round's jobs in flight; with jobs of its own in flight, a call does not wait for one
            (it waits for its jobs and the place together)."""
            return slots is None or slots[0].take(slots[1], wait=not pending, halted=halted)

        def release_slot() -> None:
            if slots is not None:
                slots[0].give_back()

        def drop(future: cf.Future[ExampleResult]) -> None:
            dask_future = pending.pop(future)[4]
            if dask_future is not None:
                dask_future.release()  # a result Dask still held would be computed, and paid, again

        def settled(position: int, job: ExampleJob, attempt: int, result: ExampleResult | None, error: str) -> None:
            if result is None and attempt == 1:
                logger.warning("Evaluation of %s example %d: %s; retrying once", job.split, job.index, error)
                submit(position, job, 2)  # in the place the first attempt had
                return
            if result is None:
                result = ExampleResult(job.candidate_id, job.index, "infra", error=error, split=job.split)
            outcomes[position] = finish(items[position], self._settle(job, result))
            release_slot()  # once recorded: a record that raises hands no place on
            progress.update(outcomes[position])

        try:
            while True:
                while feeding and len(pending) < width and take_slot():
                    position, item = next(feed, (-1, None))
                    job = start(item) if position >= 0 else None
                    if job is None:
                        feeding = False
                        release_slot()
                        break
                    submit(position, self._tag(job), 1)
                if not feeding and slots is not None:
                    slots[0].fed(slots[1])
                if not pending or (halted is not None and halted.is_set()):
                    return outcomes
                deadline = None if self.timeout is None else \
                    max(min(began for _, _, _, began, _ in pending.values()) + self.timeout - time.monotonic(), 0)
                if halted is not None:  # look at it now and then
                    deadline = _POLL if deadline is None else min(deadline, _POLL)
                waits_for_place = slots is not None and feeding and len(pending) < width
                place: list[cf.Future[Any]] = [slots[0].wakeup()] if slots is not None and waits_for_place else []
                done, _ = cf.wait([*pending, *place], timeout=deadline, return_when=cf.FIRST_COMPLETED)
                now = time.monotonic()
                for future in list(pending):
                    position, job, attempt, began, _ = pending[future]
                    overdue = self.timeout is not None and now - began >= self.timeout
                    if future not in done and not overdue:
                        continue
                    drop(future)
                    if future not in done:
                        future.cancel()
                        settled(position, job, attempt, None, f"TimeoutError: the evaluation did not finish within "
                                                              f"timeout={self.timeout:g} s and was abandoned")
                        continue
                    try:
                        result = future.result()
                    except Exception as exc:  # the worker itself failed, not the program
                        if "pickle" in str(exc).lower():
                            raise OPRORunError(
                                f"the executor could not transfer an evaluation job ({describe_exception(exc)}). "
                                "Jobs carry the program, the example, the metric and the task LM; DSPy's signatures "
                                "need cloudpickle, so use a Dask executor (distributed.Client(...).get_executor()) "
                                "rather than concurrent.futures.ProcessPoolExecutor, and make the metric importable"
                            ) from exc
                        settled(position, job, attempt, None, describe_exception(exc))
                        continue
                    settled(position, job, attempt, result, "")
        except BaseException:
            if halted is not None:
                halted.set()  # the run stops: no call of the round starts another evaluation
            raise
        finally:
            for future in list(pending):  # an error, a halt, or Ctrl-C: start nothing more
                future.cancel()
                drop(future)
                release_slot()
            if slots is not None:
                slots[0].fed(slots[1])

    def concurrently(self, calls: Sequence[Callable[[], Any]], *, started: Sequence[threading.Event],
                     halt: Callable[[], None], one_at_a_time: bool = False) -> list[Any]:
        """The results of ``calls``, each run on one of the runner's daemon threads in a copy of this thread's
        context (MLflow's active runs shared: :func:`~dspy_opro.compat.sharing_mlflow_runs`), in order.

        Each call starts once the one before has set its ``started`` event (or ended), so that callbacks see the
        calls begin in order (MLflow numbers the evaluations so). The first error, or Ctrl-C here, calls ``halt``
        and propagates at once: nothing waits for a call that hangs. ``one_at_a_time`` runs them one after the
        other on this thread (MLflow tracing, which gives a trace to the latest run started anywhere).
        """
        if len(calls) == 1 or one_at_a_time:
            return [call() for call in calls]
        shared = sharing_mlflow_runs()
        futures: list[cf.Future[Any]] = []
        try:
            for call, began in zip(calls, started, strict=True):
                futures.append(self._threads.submit(contextvars.copy_context().run, _with(shared, call)))
                while not began.wait(_POLL) and not futures[-1].done():
                    pass
            for future in cf.as_completed(futures):
                future.result()
        except BaseException:
            halt()
            raise
        return [future.result() for future in futures]

    def places(self, num_threads: int) -> int:
        """Evaluations in flight for ``num_threads``: as many on the run's threads; on an executor, which queues
        them on workers of its own, 2 x max(``num_threads``, 8) so that the workers never wait for a submission."""
        return num_threads if self.executor is None else max(num_threads, 8) * 2

    def _submit(self, job: ExampleJob, context: contextvars.Context) -> tuple[cf.Future[ExampleResult], Any]:
        if self.executor is None:
            return self._threads.submit(context.copy().run, run_example, job), None
        if self._dask is not None:
            return submit_to_dask(self.executor, self._dask, run_example, job)
        return self.executor.submit(run_example, job), None

    def _tag(self, job: ExampleJob) -> ExampleJob:
        """On a Dask executor, ``job`` with the usage channel all its attempts report on."""
        if self._dask is None:
            return job
        if self._ledger is None:
            self._ledger = UsageLedger(self._dask)
        return self._ledger.tag(job)

    def _settle(self, job: ExampleJob, result: ExampleResult) -> ExampleResult:
        """``result`` with the usage of the job's lost attempts added (a Dask executor's), once."""
        if self._ledger is not None:
            add_usage(result.usage, self._ledger.settle(job.usage_channel, result.attempt, result.usage))
        return result

    def late_usage(self) -> dict[str, ModelUsage]:
        """On a Dask executor, what recorded evaluations were billed after their results came back (see
        :meth:`~dspy_opro.scoring.dask_usage.UsageLedger.late_usage`); in this process the run's meter counts it."""
        return self._ledger.late_usage() if self._ledger is not None else {}

    def close(self) -> None:
        """Leave abandoned evaluations to themselves; let idle threads go."""
        self._threads.shutdown(wait=False)
        if self._ledger is not None:
            self._ledger.close()


class _Bar:
    """The progress bar of OPRO's own fan-out, as DSPy's executor draws its own: the average metric so far."""

    def __init__(self, total: int, display: bool, position: int):
        import tqdm

        self._bar = tqdm.tqdm(total=total, dynamic_ncols=True, disable=not display, file=sys.stdout,
                              position=position)  # a round's calls run at once: a line each
        self._sum = 0.0
        self._count = 0

    def update(self, outcome: tuple[Any, float] | None) -> None:
        if outcome is not None and not self._bar.disable:
            self._sum, self._count = self._sum + outcome[1], self._count + 1
            self._bar.set_description(f"Average Metric: {self._sum:.2f} / {self._count} "
                                      f"({round(100 * self._sum / self._count, 1)}%)")
            self._bar.update()

    def close(self) -> None:
        self._bar.close()


class CandidateEvaluate(dspy.Evaluate):
    """The ``dspy.Evaluate`` of one candidate: each example evaluated as OPRO needs it (see the module docstring).

    Args:
        devset: The examples to evaluate, by index into their split: ``[(index, example), ...]``.
        jobs: Makes the job of one example (by index).
        runner: Runs the jobs.
        budget: Gives each evaluation its place.
        record: Records a finished evaluation; it raises to stop the run.
        num_threads: Evaluations in flight.
        display_progress: The progress bar.
        failure_score: What an example that got no score counts in the returned ``EvaluationResult``.
        slots: The round's places, shared by its evaluation calls, and this call's rank among them.
        started: Set once the call's callbacks have seen it start.
    """

    def __init__(self, *, devset: Sequence[tuple[int, dspy.Example]], jobs: Callable[[int], ExampleJob],
                 runner: Runner, budget: Budget, record: Callable[[ExampleResult], None], num_threads: int,
                 display_progress: bool, failure_score: float, slots: tuple[RoundSlots, int] | None = None,
                 started: threading.Event | None = None):
        super().__init__(devset=[example for _, example in devset], num_threads=num_threads,
                         display_progress=display_progress, failure_score=failure_score)
        self.indexed, self.jobs, self.runner, self.budget, self.record = list(devset), jobs, runner, budget, record
        self.slots, self.started = slots, started or threading.Event()
        self.stop_reason: str | None = None

    @with_callbacks
    def __call__(self, program: dspy.Module, metric: Any = None, devset: Any = None, num_threads: int | None = None,
                 display_progress: bool | None = None, display_table: Any = None,
                 callback_metadata: dict[str, Any] | None = None, save_as_csv: str | None = None,
                 save_as_json: str | None = None) -> Any:
        self.started.set()
        # Each evaluation runs in a copy of this context: the caller's DSPy settings, this call's id (callbacks nest
        # the program runs under it), an OpenTelemetry span.
        bar = _Bar(len(self.indexed), self.display_progress, self.slots[1] if self.slots else 0)
        try:
            outcomes = self.runner.map(self.indexed, self._start, self._finish, width=self.num_threads or 1,
                                       context=contextvars.copy_context(), progress=bar, slots=self.slots,
                                       halted=self.budget.halted)
        finally:
            bar.close()
        results: list[Any] = [(example, outcome[0] if outcome else dspy.Prediction(),
                    outcome[1] if outcome else self.failure_score)
                   for example, outcome in zip(self.devset, outcomes, strict=True)]
        total = sum(score for _, _, score in results)
        return EvaluationResult(score=round(100 * total / len(results), 2) if results else 0.0, results=results)

    def _start(self, item: tuple[int, dspy.Example]) -> ExampleJob | None:
        """The job of one example, once it has a place in the budget; None once the budget is spent."""
        reason = self.budget.reserve()
        if reason is not None:
            self.stop_reason = reason
            return None
        return self.jobs(item[0])

    def _finish(self, item: tuple[int, dspy.Example], result: ExampleResult) -> tuple[Any, float]:
        """Record one finished evaluation: counted and out of flight at once, so the budget never sees it twice."""
        with self.budget.lock:
            if self.budget.halted.is_set():  # the run is ending: its record is being saved
                raise RunHalted("the run stopped before this evaluation finished")
            self.budget.in_flight -= 1
            self.record(result)
        prediction = result.prediction if isinstance(result.prediction, dspy.Prediction) else dspy.Prediction()
        return prediction, result.score if result.score is not None else self.failure_score


__all__ = ["Budget", "CandidateEvaluate", "RoundSlots", "RunHalted", "Runner"]
