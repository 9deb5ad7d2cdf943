"""Scoring candidates: evaluations fanned out within the budget, and their results recorded as they arrive.

:class:`Evaluator` feeds (candidate, example) jobs (:mod:`dspy_opro.scoring.evaluation`) to a thread pool or any
``concurrent.futures.Executor`` (a Dask cluster included) lazily, so the ``max_metric_calls`` and ``max_cost``
budgets stop it at an exact count, and hands each finished result back in the calling thread.
:class:`CandidateScorer` decides what to run (every example a candidate has no score for), stores each result on its
candidate as it arrives, journals it, and finishes a candidate once all its examples are in: ``scored`` with its
mean, or ``unscored`` when LM failures left examples without a score. With ``racing=True`` a step's new candidates
race the best (:mod:`dspy_opro.extensions.racing`): they run in rounds of one block each, and a candidate the test stops is
``raced_out`` with its partial mean. Fatal LM errors and broken metrics stop the
run here, naming the model or the example.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import dspy

from dspy_opro.compat import current_context, run_in_context
from dspy_opro.config import Models, OPROConfig
from dspy_opro.task.data import RunData
from dspy_opro.errors import FatalLMError, MetricError, OPRORunError, describe_exception
from dspy_opro.scoring.evaluation import ExampleJob, ExampleResult, run_example
from dspy_opro.extensions.racing import Race, RacingSchedule, example_order
from dspy_opro.record.state import (
    START_ID,
    Candidate,
    ModelUsage,
    RaceLook,
    RaceRecord,
    RunState,
    mean_score,
    record_result,
)

logger = logging.getLogger(__name__)

LM_FAILURES = "LM failures"  # how the reason of a candidate left unscored by infrastructure failures begins
CUT_SHORT = "cut short"  # how the reason of a candidate a budget stopped begins


@dataclass
class Budget:
    """Counts evaluations and cost against the run's limits."""

    max_metric_calls: int | None = None
    max_cost: float | None = None
    metric_calls: int = 0
    cost_so_far: Callable[[], float] = lambda: 0.0

    def exhausted(self) -> str | None:
        if self.max_metric_calls is not None and self.metric_calls >= self.max_metric_calls:
            return f"max_metric_calls={self.max_metric_calls} reached"
        if self.max_cost is not None and self.cost_so_far() >= self.max_cost:
            return f"max_cost=${self.max_cost:g} reached (spent ${self.cost_so_far():.4f})"
        return None


class Evaluator:
    """Runs (candidate, example) jobs on a thread pool or a given executor, within a budget.

    Args:
        num_threads: Worker threads when no executor is given.
        executor: Any ``concurrent.futures.Executor``; jobs are pickled if it runs them in other processes.
    """

    def __init__(self, *, num_threads: int = 1, executor: cf.Executor | None = None):
        self.num_threads = max(1, num_threads)
        self._external = executor
        self._pool: cf.ThreadPoolExecutor | None = None

    @property
    def max_in_flight(self) -> int:
        # Threads: one job per worker, so a budget check sits between every two evaluations. Other executors:
        # a queue of twice their width hides the round trip to remote workers.
        return self.num_threads if self._external is None else max(self.num_threads, 8) * 2

    def _submit(self, job: ExampleJob) -> cf.Future[ExampleResult]:
        if self._external is not None:
            return self._external.submit(run_example, job)
        if self._pool is None:
            self._pool = cf.ThreadPoolExecutor(max_workers=self.num_threads, thread_name_prefix="opro-eval")
        # The worker adopts the caller's DSPy settings and active call id, so callbacks and tracing nest the
        # evaluation under the compile that started it, as DSPy's own parallel executor does.
        return self._pool.submit(run_in_context, current_context(), run_example, job)

    def run(self, jobs: Iterable[ExampleJob], budget: Budget, on_result: Callable[[ExampleResult], None]) -> str | None:
        """Run ``jobs`` in order until done or the budget is spent; returns the reason it stopped early, if any.

        ``on_result`` is called in this thread for every finished job. A job whose worker failed (for example a
        Dask worker that died) is resubmitted once and then reported as an ``infra`` outcome.
        """
        pending: dict[cf.Future[ExampleResult], tuple[ExampleJob, int]] = {}
        job_iter: Iterator[ExampleJob] = iter(jobs)
        stop_reason: str | None = None
        exhausted_jobs = False
        try:
            while True:
                while not exhausted_jobs and stop_reason is None and len(pending) < self.max_in_flight:
                    stop_reason = budget.exhausted()
                    if stop_reason is not None:
                        break
                    job = next(job_iter, None)
                    if job is None:
                        exhausted_jobs = True
                        break
                    budget.metric_calls += 1
                    pending[self._submit(job)] = (job, 0)
                if not pending:
                    return stop_reason
                done, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
                for future in done:
                    job, resubmits = pending.pop(future)
                    try:
                        result = future.result()
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
                            pending[self._submit(job)] = (job, resubmits + 1)
                            continue
                        result = ExampleResult(job.candidate_id, job.index, "infra", error=describe_exception(exc),
                                               split=job.split)
                    on_result(result)
        except BaseException:
            for future in pending:
                future.cancel()
            raise

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def describe_failure(result: ExampleResult, example: Any) -> str:
    """A one-line description of a stopping failure that names the example."""
    inputs = {k: example[k] for k in example.inputs().keys()} if hasattr(example, "inputs") else example
    shown = repr(inputs)
    if len(shown) > 200:
        shown = shown[:200] + "..."
    return f"training/validation example {result.index} ({shown}): {result.error}"


class CandidateScorer:
    """Scores candidates on the training or validation split and records every result in the run record.

    Args:
        config: The run's configuration.
        data: The run's examples.
        state: The run record results are stored in.
        models: The run's models (named in the error of a fatal failure).
        evaluator: Runs the jobs.
        budget: Counts evaluations and cost.
        program_for: Builds the program a candidate runs.
        metric: The metric (for label-free OPRO, the preference metric against the anchors).
        metric_takes_trace: Whether the metric takes a third ``trace`` argument.
        settings: The DSPy settings every evaluation runs under (task LM, adapter).
        on_usage: Records an evaluation's usage (run record and the caller's tracker).
        on_result: Called with every candidate and result before it is stored: the journal, the progress bar,
            label-free anchors.
        on_finished: Called with every candidate whose scoring on a split ended (scored or not): the best score
            the progress bar shows.

    The scorer does not write the run record: the journal keeps every result until the run's next snapshot (after
    the step, see :mod:`dspy_opro.run`).
    """

    def __init__(self, *, config: OPROConfig, data: RunData, state: RunState, models: Models, evaluator: Evaluator,
                 budget: Budget, program_for: Callable[[Candidate], dspy.Module], metric: Any,
                 metric_takes_trace: bool, settings: dict[str, Any],
                 on_usage: Callable[[Literal["optimizer", "task"], dict[str, ModelUsage]], None],
                 on_result: Callable[[Candidate, ExampleResult], None],
                 on_finished: Callable[[Candidate], None] = lambda candidate: None):
        self.config, self.data, self.state, self.models = config, data, state, models
        self.evaluator, self.budget = evaluator, budget
        self.program_for, self.metric, self.metric_takes_trace, self.settings = (
            program_for, metric, metric_takes_trace, settings)
        self.on_usage, self.on_result, self.on_finished = on_usage, on_result, on_finished
        self._remaining: dict[tuple[str, int], set[int]] = {}
        self._infra_errors: dict[tuple[str, int], list[str]] = {}
        self._warned: set[tuple[str, int]] = set()
        self._races: dict[int, Race] = {}  # racing: the races of the training scoring under way
        self._race_against: int | None = None

    def score(self, candidates: list[Candidate], split: str, *, race_against: Candidate | None = None) -> str | None:
        """Score ``candidates`` on every example of ``split`` they have no score for, all in parallel.

        Args:
            candidates: The candidates to score.
            split: ``"train"`` or ``"val"``.
            race_against: With ``racing=True`` on ``"train"``: the best candidate at the start of the step. Every
                other candidate but the start then races it (:mod:`dspy_opro.extensions.racing`): its examples are run block
                by block in the shared seeded order, every candidate's next block only once the previous look is
                decided, and a candidate the test finds worse is recorded ``raced_out``. Recorded scores are replayed
                into the race first, so a resumed race takes the same decisions.

        Returns:
            The budget's reason when it stopped the scoring early (what was cut short is recorded), else None.
        """
        examples = self.data.examples(split)
        racing = race_against is not None and split == "train" and self.config.racing
        if split == "train":
            self._races, self._race_against = {}, race_against.id if racing else None
        todo: list[Candidate] = []
        for candidate in candidates:
            if split == "val" and candidate.val_scores is None:
                candidate.val_scores = [None] * len(examples)
            scores = candidate.scores if split == "train" else candidate.val_scores
            missing = [i for i, value in enumerate(scores) if value is None]
            key = (split, candidate.id)
            self._remaining[key] = set(missing)
            self._infra_errors[key] = []
            if racing and candidate.id not in (START_ID, race_against.id):
                race = self._races[candidate.id] = self._new_race(candidate, race_against)
                if race.decision.action == "stop":  # its recorded scores already decide it (a resumed race)
                    self._race_out(candidate)
                    continue
            if missing:
                todo.append(candidate)
            else:
                self._finish(candidate, split)

        stop_reason: str | None = None
        first_round = True
        while stop_reason is None:
            # One round: every candidate's next block (all its missing examples when it does not race). A round is
            # run to its end before the next is planned, so which evaluations run depends on the scores alone,
            # never on the thread count or the order results arrive in.
            round_jobs = [(candidate, indices) for candidate in todo
                          if (indices := self._next_block(candidate, split, first_round))]
            first_round = False
            if not round_jobs:
                break
            stop_reason = self.evaluator.run(self._jobs(round_jobs, split, examples), self.budget, self._on_result)
        for candidate in todo:
            key = (split, candidate.id)
            if key not in self._remaining:
                continue
            self._remaining.pop(key)
            if split != "train":
                continue
            if stop_reason is not None:
                candidate.status = "unscored"
                candidate.reason = f"{CUT_SHORT}: {stop_reason}"
            else:  # a race an LM failure left with a gap in its block: unscored, tried again like any other
                self._finish(candidate, split)
        return stop_reason

    def _new_race(self, candidate: Candidate, best: Candidate) -> Race:
        """A race of ``candidate`` against ``best`` with the candidate's recorded scores replayed into it."""
        n = len(candidate.scores)
        race = Race(best_scores=best.scores, order=example_order(n, seed=self.config.seed),
                    schedule=RacingSchedule.build(n), alpha=self.config.racing_alpha, seed=self.config.seed,
                    stream=candidate.id)
        for index, value in enumerate(candidate.scores):  # a race's decisions do not depend on the arrival order
            if value is not None:
                race.record(index, value)
        return race

    def _next_block(self, candidate: Candidate, split: str, first_round: bool) -> list[int]:
        """The examples ``candidate`` runs in the next round."""
        key = (split, candidate.id)
        if key not in self._remaining:
            return []
        race = self._races.get(candidate.id) if split == "train" else None
        if race is None:
            return sorted(self._remaining[key]) if first_round else []
        if self._infra_errors[key]:
            return []  # an LM failure left a gap the race cannot decide past
        return race.needed()

    def _jobs(self, round_jobs: list[tuple[Candidate, list[int]]], split: str,
              examples: list[Any]) -> Iterator[ExampleJob]:
        label_free = self.config.label_free
        for candidate, indices in round_jobs:
            program = self.program_for(candidate)
            # Label-free: the starting program runs without a metric; its runs are the anchors.
            metric = None if label_free and candidate.id == START_ID else self.metric
            for i in indices:
                yield ExampleJob(
                    candidate_id=candidate.id, index=i, program=program, example=examples[i], metric=metric,
                    failure_score=self.config.failure_score, settings=self.settings, split=split,
                    answer_fields=self.data.answer_fields(i, split), keep_trace=label_free,
                    metric_takes_trace=self.metric_takes_trace, judge_failures=label_free)

    def _race_out(self, candidate: Candidate) -> None:
        """Record a candidate its race stopped: ``raced_out``, its partial mean as its score, the looks."""
        race = self._races[candidate.id]
        self._remaining.pop(("train", candidate.id), None)
        self._infra_errors.pop(("train", candidate.id), None)
        self._warn_program_errors(candidate, "train")
        candidate.status = "raced_out"
        candidate.score = race.decision.mean
        candidate.reason = race.decision.reason
        candidate.race = self._race_record(race)
        candidate.failed.sort()
        logger.info("Candidate %d %s (partial mean %.1f)", candidate.id, candidate.reason, 100 * candidate.score)

    def _race_record(self, race: Race) -> RaceRecord:
        stopped = race.decision.action == "stop"
        return RaceRecord(against=self._race_against, examples=race.decision.examples, n=race.n,
                          looks=[RaceLook(**dataclasses.asdict(look)) for look in race.looks],
                          stopped_at=race.decision.examples if stopped else None)

    def _on_result(self, result: ExampleResult) -> None:
        state = self.state
        candidate = state.candidates[result.candidate_id]
        split = result.split
        self.on_usage("task", result.usage)
        example = self.data.examples(split)[result.index]
        if result.outcome == "fatal":
            role, model = self._failing_model(result)
            raise FatalLMError(f"the {role} {model!r} failed in a way no retry can fix on "
                               f"{describe_failure(result, example)}. Check its API key (or environment variable), "
                               "permissions, billing and model name.")
        state.metric_calls += 1  # an evaluation that ran (a fatal one did not)
        if result.outcome == "metric_error":
            raise MetricError(f"the metric failed on {describe_failure(result, example)}. Fix the metric: it must "
                              "return a float in [0, 1], a bool, or dspy.Prediction(score=..., feedback=...).")
        self.on_result(candidate, result)
        record_result(candidate, index=result.index, split=split, outcome=result.outcome, score=result.score,
                      error=result.error, answer=result.answer)
        key = (split, candidate.id)
        race = self._races.get(candidate.id) if split == "train" else None
        if race is not None and candidate.status == "pending" and result.score is not None:
            if race.record(result.index, result.score).action == "stop":
                # Not saved here: the journal holds the scores, and a resumed run replays them into a new race,
                # which stops at the same look (a race's decisions depend on the scores, not on their order).
                self._race_out(candidate)
                return
        if key not in self._remaining:
            return  # a result past its candidate's stop: paid and recorded, the decision stands
        self._remaining[key].discard(result.index)
        if result.outcome == "infra":
            self._infra_errors[key].append(result.error or "unknown error")
        if not self._remaining[key]:
            self._remaining.pop(key)
            self._finish(candidate, split)

    def _failing_model(self, result: ExampleResult) -> tuple[str, str]:
        """Which model a fatal error came from: the task model, the label-free judge, or the metric's own LM."""
        if result.stage == "program":
            return "task model", getattr(self.models.task, "model", repr(self.models.task))
        if self.config.label_free:
            judge = self.models.judge or self.models.task
            return "judge model", getattr(judge, "model", repr(judge))
        return "model inside the metric", result.model or "unknown"

    def _finish(self, candidate: Candidate, split: str) -> None:
        self._settle(candidate, split)
        self.on_finished(candidate)

    def _settle(self, candidate: Candidate, split: str) -> None:
        """Decide a candidate whose scoring on ``split`` ended: its mean, or why it has none."""
        self._warn_program_errors(candidate, split)
        errors = self._infra_errors.pop((split, candidate.id), [])
        scores = candidate.scores if split == "train" else candidate.val_scores
        complete = all(value is not None for value in scores)
        if split == "val":
            candidate.val_score = mean_score(scores) if complete else None
            return
        if not complete:
            candidate.status = "unscored"
            last = errors[-1] if errors else ""
            candidate.reason = f"{LM_FAILURES} on {len(errors)} examples after a retry; last: {last}"
            logger.info("Candidate %d unscored: %s", candidate.id, candidate.reason)
            return
        candidate.status = "scored"
        candidate.score = mean_score(scores)
        candidate.failed.sort()
        race = self._races.get(candidate.id)
        if race is not None:
            candidate.race = self._race_record(race)

    def _warn_program_errors(self, candidate: Candidate, split: str) -> None:
        """One WARNING per candidate and split whose program raised: how often, and the first error."""
        errors = [e for e in candidate.errors if e.split == split]
        if not errors or (split, candidate.id) in self._warned:
            return
        self._warned.add((split, candidate.id))
        count = sum(e.count for e in errors)
        first = errors[0]
        logger.warning("Candidate %d: the program raised on %d %s evaluations (%d distinct errors); first, on "
                       "example %d: %s", candidate.id, count, "training" if split == "train" else "validation",
                       len(errors), first.example, first.error)


__all__ = ["CUT_SHORT", "LM_FAILURES", "Budget", "CandidateScorer", "Evaluator", "describe_failure"]
