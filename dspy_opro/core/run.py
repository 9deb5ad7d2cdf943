"""One OPRO compile: the step loop, which owns the run record.

:class:`OPRORun` wires one ``compile`` together (the checked data, the models, the record and its files, the usage
meter, the scorer and the budget), and :meth:`OPRORun.execute` reads as the algorithm does:

1. score the program as given, with any ``initial_instructions``, on every training example (step -1); a program that
   cannot run, or a start that cannot be scored, stops the run before any optimizer call;
2. for every step: pick the predictor (round-robin), draw the exemplars, build the meta-prompt from the predictor's
   history, ask the optimizer for ``num_candidates`` proposals, triage the replies (extract, polish, de-duplicate,
   filter), score the new instructions, record the step;
3. select what to return (a :class:`~dspy_opro.core.selection.SelectionPolicy`) and return a copy of the program.

Scoring goes through :class:`~dspy_opro.scoring.scorer.CandidateScorer` (each candidate's evaluations one
``dspy.Evaluate`` call), which hands every finished evaluation and every candidate's outcome back to this loop
(:meth:`OPRORun.record_result`, :meth:`OPRORun.record_outcome`): its usage, the run's one count of evaluations, the
journal line that makes it survive a kill, then the candidate's score. An error of the program or the metric is
tolerated up to ``max_errors`` per evaluation of one candidate, as ``dspy.Evaluate`` counts them (scored
``failure_score``, logged, recorded); past it, and on a fatal LM error or a program that returns no prediction, the
run stops with the error type that names the fix, keeping everything paid for. The extensions come in through the
policies the settings build and through the metric (label-free OPRO's
:class:`~dspy_opro.scoring.evaluation.AnchoredMetric`).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import dspy

from dspy_opro.compat import user_stacklevel
from dspy_opro.core import settings as s
from dspy_opro.core.exemplars import ExemplarPicker, predictor_history
from dspy_opro.core.initial import initial_by_predictor, initial_candidates
from dspy_opro.core.meta_prompt import gen_meta_prompt
from dspy_opro.core.plan import RunPlan, plan_run, use_local_price_maps_offline
from dspy_opro.core.proposals import propose, step_candidates
from dspy_opro.errors import (
    FatalLMError,
    MetricError,
    OPRORunError,
    OptimizerUnavailableError,
    ProgramError,
    check_model_ready,
)
from dspy_opro.record.observers import CandidateSpans, import_litellm_announced
from dspy_opro.record.recorder import RunRecorder
from dspy_opro.record.summary import attach_result
from dspy_opro.scoring.engine import Budget, Runner
from dspy_opro.scoring.evaluation import AnchoredMetric, ExampleResult, metric_takes_trace
from dspy_opro.scoring.scorer import CandidateOutcome, CandidateScorer, EvaluationSetup
from dspy_opro.scoring.usage import UsageMeter, add_usage, roll_up, token_prices
from dspy_opro.state import (
    METRIC_ERROR_PREFIX,
    START_ID,
    Candidate,
    CandidateStatus,
    ModelUsage,
    Phase,
    RunState,
    Session,
    Split,
    Step,
    digest,
    no_scores,
    record_result,
    validation_incomplete,
)
from dspy_opro.task.data import RunData
from dspy_opro.task.placement import AFTER_INPUTS
from dspy_opro.task.programs import predictor_map, read_instructions

logger = logging.getLogger(__name__)

MAX_EMPTY_STEPS = 3  # steps in a row without a single optimizer reply before the run gives up


class OPRORun:
    """The state and steps of one ``OPROTeleprompter.compile`` call.

    Args:
        opt: The teleprompter (its settings are read, never changed).
        student: The program to optimize (never changed).
        trainset: The training examples.
        valset: The validation examples, if any.
    """

    def __init__(self, opt: Any, student: dspy.Module, trainset: Sequence[Any], valset: Sequence[Any] | None):
        self.opt = opt
        self.anchored: AnchoredMetric | None = opt.metric if isinstance(opt.metric, AnchoredMetric) else None
        self.data = RunData.build(student, trainset, valset, predictors=opt.predictors,
                                  label_free=self.anchored is not None, valset_needed_by=s.valset_needed_by(opt),
                                  num_exemplars=opt.num_exemplars, max_metric_calls=opt.max_metric_calls)
        self.num_steps, self.num_candidates = s.resolved_search(opt, len(self.data.trainset))
        self.options = s.meta_prompt_options(opt)
        self.folder = str(opt.log_dir) if opt.log_dir is not None else None
        self.selection = s.selection_policy(opt, has_valset=bool(self.data.valset))
        n_val = len(self.data.valset)
        self.max_metric_calls = s.resolved_budget(opt, len(self.data.trainset),
                                                  self.selection.planned_evaluations(n_val) if n_val else 0)
        self.racing = s.racing_options(opt.racing, auto=opt.auto) is not None
        self.initial = initial_by_predictor(s.check_initial_instructions(opt.initial_instructions),
                                            targets=self.data.targets, all_predictors=list(predictor_map(student)))
        self.models = s.Models.resolve(opt)
        roles = (("optimizer", self.models.prompt), ("task", self.models.task), ("judge", self.models.judge))
        use_local_price_maps_offline(lm for _, lm in roles)  # before LiteLLM's import and the first price lookup
        import_litellm_announced(roles)  # seconds of silence otherwise, before the first line of the run
        for role, lm in roles:
            if lm is not None:
                check_model_ready(lm, role)
        self.num_threads = opt.num_threads or dspy.settings.get("num_threads") or 1
        self.base = student.deepcopy()
        self.caller_tracker = dspy.settings.get("usage_tracker")  # usage is rolled up into the caller's track_usage()
        self.meter = UsageMeter()
        self.lock = threading.Lock()  # the record is written by evaluation threads and optimizer calls alike
        self.ignores_n: set[str] = set()  # optimizer models seen answering an n request with fewer choices
        self.errors: dict[tuple[str, int], int] = {}  # errors max_errors counts, per split and candidate
        self._warned: set[tuple[str, int]] = set()  # (split, candidate id) whose program errors were logged
        self._said_unclosed = False  # replies without their closing tag are explained once per run
        self.recorder = RunRecorder(self.folder, num_steps=self.num_steps, max_metric_calls=self.max_metric_calls,
                                    max_cost=opt.max_cost)
        recorded = s.recorded_settings(opt, opt.setting_names(), num_steps=self.num_steps,
                                       num_candidates=self.num_candidates, models=self.models,
                                       targets=self.data.targets, has_valset=bool(self.data.valset))
        fingerprint = s.fingerprint(recorded, trainset=self.data.trainset, valset=self.data.valset,
                                    uses_valset=self.selection.uses_valset, program=self.base)
        saved = self.recorder.open(fingerprint)
        self.state = saved if saved is not None else self._new_record(fingerprint, recorded)
        self.ignores_n.update(self.state.optimizer_single_choice)  # found by the run this one resumes
        if self.anchored is not None:  # a resumed run judges against the anchors it recorded
            for key, text in self.state.anchors.items():
                split, index = key.split(":")
                self.anchored.add_anchor(self.data.examples("val" if split == "val" else "train")[int(index)], text)
        self.exemplars = ExemplarPicker(policy=s.exemplar_policy(opt), data=self.data,
                                        num_exemplars=opt.num_exemplars)
        settings: dict[str, Any] = {"lm": self.models.task}
        if dspy.settings.adapter is not None:
            settings["adapter"] = dspy.settings.adapter
        self.setup = EvaluationSetup(
            data=self.data, base=self.base, instruction_pos=opt.instruction_pos, metric=opt.metric,
            metric_takes_trace=metric_takes_trace(opt.metric), settings=settings, failure_score=opt.failure_score,
            meter=self.meter, anchor_metric=self.anchored.anchor_metric() if self.anchored is not None else None)
        self.budget = Budget(self.max_metric_calls, opt.max_cost, self.state)
        self.runner = Runner(executor=opt.executor, timeout=opt.timeout)
        self.spans = CandidateSpans()
        self.scorer = CandidateScorer(setup=self.setup, runner=self.runner, budget=self.budget, recorder=self,
                                      num_threads=self.num_threads, display_progress=opt.display_progress,
                                      policy=s.scoring_policy(opt))

    def _new_record(self, fingerprint: Any, recorded: dict[str, Any]) -> RunState:
        """A fresh run record: the program as given is candidate 0, its initial instructions follow (all step -1)."""
        targets, n_train = self.data.targets, len(self.data.trainset)
        state = RunState(fingerprint=fingerprint, config=recorded, predictors=targets, train_size=n_train,
                         val_size=len(self.data.valset))
        start = read_instructions(self.base, targets, instruction_pos=self.opt.instruction_pos)
        state.candidates.append(Candidate(id=START_ID, step=-1, predictor=None, instruction="", instructions=start,
                                          md5=digest(start), scores=no_scores(n_train)))
        state.candidates += initial_candidates(self.initial, start=start, first_id=START_ID + 1, n_train=n_train)
        return state

    # ------------------------------------------------------------------------------------------------------------
    # The run

    def execute(self) -> dspy.Module:
        state = self.state
        lms = (self.models.task, self.models.prompt, self.models.judge,
               *(getattr(p, "lm", None) for p in predictor_map(self.base).values()))
        try:
            with self.meter.attached(lms), dspy.context(usage_tracker=None):  # the caller's tracker gets a roll-up
                if state.selection is None:
                    self._search()
                else:
                    logger.info("The OPRO run in %s is complete; returning its result without LM calls", self.folder)
        except BaseException as exc:
            # Ctrl-C, a fatal LM error or a broken metric: keep what was paid for before the error propagates (a
            # second Ctrl-C while the record is written waits until it is written).
            with ctrl_c_deferred():
                self._take_usage("task")
                self._end_session("interrupted" if isinstance(exc, KeyboardInterrupt) else "failed")
                self.recorder.end(state, exc)
            raise
        finally:
            self.runner.close()
            self.recorder.close()
        return self._result()

    def _search(self) -> None:
        state = self.state
        state.sessions.append(Session(started_at=time.time()))
        self._announce()
        self.recorder.save_first(state)
        with self._phase("step -1 scoring"):
            self._score_start()
        self._log_cost_estimate()
        self._score_pending_of_finished_steps()
        first = len(state.steps) - (0 if not state.steps or state.steps[-1].complete else 1)
        for step in range(first, self.num_steps):
            if state.status == "stopped" or self._check_budget():
                break
            self._run_step(step)
        self._check_optimizer_answered()
        with self._phase("selection"):
            self._select()
        self._take_usage("task")
        self._end_session(state.status)
        self.recorder.save(state, final=True)

    @property
    def resume_hint(self) -> str:
        """How to go on after a failure that can be fixed."""
        if self.folder is None:
            return "compile again (pass log_dir=... to keep what was scored and resume instead)"
        return "compile again with the same log_dir to resume"

    def plan(self) -> RunPlan:
        """The run's plan in LM calls (the same as ``OPROTeleprompter.estimate`` returns)."""
        initial = sum(c.status != CandidateStatus.SKIPPED for c in self.state.candidates if c.step == -1) - 1
        return plan_run(num_steps=self.num_steps, num_candidates=self.num_candidates, models=self.models,
                        data=self.data, selection=self.selection, max_metric_calls=self.max_metric_calls,
                        initial=initial, ignores_n=self.ignores_n)

    def _announce(self) -> None:
        logger.info("OPRO: %d steps x %d candidates over %d training examples, predictors %s", self.num_steps,
                    self.num_candidates, len(self.data.trainset), self.data.targets)
        for note in self.data.notes():
            logger.warning("OPRO: %s", note)
        plan, done, steps = self.plan(), self.state.metric_calls, len(self.state.steps)
        if not done:
            logger.info(plan.describe())
        else:  # what is left, not the whole plan: the record's evaluations are not run again
            per_step = plan.optimizer_requests // plan.num_steps if plan.num_steps else 0
            logger.info("OPRO resumes: %d evaluations and %d of %d steps are already in the record; left: at most %d "
                        "program runs with the metric and %d optimizer requests", done, steps, plan.num_steps,
                        max(plan.evaluations - done, 0), per_step * max(plan.num_steps - steps, 0))
        select, n_val = self.opt.select, len(self.data.valset)
        if self.selection.uses_valset and n_val:
            why = " (select='auto' with a valset; select='train' is the paper's setting)" if select == "auto" else ""
            logger.info("OPRO selects on the valset (%d examples)%s", n_val, why)
        elif select == "auto" and not n_val and not self.data.valset_given:
            logger.info("OPRO selects on training (the paper's setting): no valset was given")
        elif n_val and not self.selection.uses_valset:
            logger.info("OPRO selects on training (select=%r): the valset of %d examples is not used", select, n_val)
        if self.opt.max_cost is not None:
            for role, lm in (("optimizer", self.models.prompt), ("task", self.models.task)):
                if token_prices(getattr(lm, "model", "")) is None:
                    warnings.warn(f"max_cost=${self.opt.max_cost:g}: the {role} model {lm.model!r} has no known "
                                  "price, so its calls count as $0 and the cost is reported as unknown",
                                  stacklevel=user_stacklevel())

    def _log_cost_estimate(self) -> None:
        """After step -1: the plan's cost, from the task tokens measured per evaluation so far."""
        task, calls = self.state.usage.task, self.state.metric_calls
        if calls:
            plan = self.plan().with_cost(prompt_tokens=task.prompt_tokens / calls,
                                         completion_tokens=task.completion_tokens / calls,
                                         measured=f"measured on {calls} evaluations of step -1")
            logger.info(plan.describe_cost())

    @contextlib.contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        """Time a phase in the record; one the run stops inside keeps no end."""
        phase = Phase(name=name, started_at=time.time())
        self.state.phases.append(phase)
        yield
        phase.ended_at = time.time()

    def _end_session(self, end: str) -> None:
        if self.state.sessions and self.state.sessions[-1].ended_at is None:
            self.state.sessions[-1].ended_at, self.state.sessions[-1].end = time.time(), end

    def _check_budget(self) -> bool:
        reason = self.budget.exhausted()
        if reason is not None:
            self._stop(reason)
        return reason is not None

    def _stop(self, reason: str) -> None:
        if self.state.status != "stopped":
            logger.info("OPRO stops: %s; everything scored so far is kept", reason)
        self.state.status, self.state.stop_reason = "stopped", reason

    # ------------------------------------------------------------------------------------------------------------
    # Step -1

    def _score_start(self) -> None:
        """Score the program as given and its initial instructions (step -1) on every training example.

        Only the start must be scored for the run to go on (every meta-prompt shows its instruction); an initial
        instruction that LM failures left unscored after a retry stays out of the history, and compiling again with
        the same log_dir tries it again.
        """
        start = self.state.candidates[START_ID]
        initial = [c for c in self.state.candidates if c.step == -1]  # the start first
        n_train = len(self.data.trainset)
        pending = [c for c in initial if c.status == CandidateStatus.PENDING]
        if pending:
            logger.info("Step -1: scoring the program as given%s on %d training examples",
                        f" and {len(initial) - 1} initial instructions" if len(initial) > 1 else "", n_train)
            self._score_initial(pending)
            retry = [c for c in initial if c.status == CandidateStatus.UNSCORED]
            if retry:
                logger.warning("Step -1: candidates %s are unscored (%s); trying those examples once more",
                               [c.id for c in retry], retry[0].reason)
                for candidate in retry:
                    candidate.status, candidate.reason = CandidateStatus.PENDING, None
                self._score_initial(retry)
        if start.status != CandidateStatus.SCORED:
            raise OPRORunError(f"the program as given could not be scored on every training example ({start.reason}), "
                               "and every meta-prompt must show its instruction with its score. Fix the cause (the "
                               f"task model's provider, the budget) and {self.resume_hint}.")
        if len(start.failed) == n_train and start.errors:
            first = start.errors[0]
            if all(e.error.startswith(METRIC_ERROR_PREFIX) for e in start.errors):  # tolerated, but never scored
                raise MetricError(
                    f"the metric failed on all {n_train} training examples of the program as given; first, on example "
                    f"{first.example}: {first.error.removeprefix(METRIC_ERROR_PREFIX)}. Fix the metric: it must "
                    f"return a float in [0, 1], a bool, or dspy.Prediction(score=..., feedback=...); then "
                    f"{self.resume_hint}.")
            raise ProgramError(
                f"the program as given raised on all {n_train} training examples; first, on example {first.example}: "
                f"{first.error}. No instruction can do better than a program that cannot run: fix the program (call "
                "it on one training example to see the traceback) and compile again.")
        logger.info("Step -1: training score %.1f", 100 * (start.score or 0.0))
        for candidate in initial[1:]:
            if candidate.status == CandidateStatus.SCORED:
                logger.info("Step -1: initial instruction %d for %r: training score %.1f", candidate.id,
                            candidate.predictor, 100 * (candidate.score or 0.0))
            elif candidate.status == CandidateStatus.UNSCORED:
                logger.warning("Step -1: initial instruction %d for %r is unscored (%s); the run goes on without it",
                               candidate.id, candidate.predictor, candidate.reason)

    def _score_initial(self, candidates: list[Candidate]) -> None:
        """One scoring phase for step -1 candidates; label-free runs score the start first, since its runs are the
        anchors the other candidates are judged against."""
        start = self.state.candidates[START_ID]
        if self.anchored is not None and start in candidates and len(candidates) > 1:
            self._score([start], "train")
            candidates = [c for c in candidates if c is not start] if start.status == CandidateStatus.SCORED else []
        if candidates and self.state.status != "stopped":
            self._score(candidates, "train")

    def _score_pending_of_finished_steps(self) -> None:
        steps = self.state.steps
        pending = [c for c in self.state.candidates
                   if c.status == CandidateStatus.PENDING and 0 <= c.step < len(steps) and steps[c.step].complete]
        if not pending:
            return
        logger.info("Scoring %d candidates again that LM failures left unscored before the run stopped", len(pending))
        for step in sorted({c.step for c in pending}):  # each step's candidates against that step's baseline
            if self.state.status == "stopped":
                break
            self._score([c for c in pending if c.step == step], "train", baseline=self._baseline(steps[step]),
                        decided=self._decided_of(step))
        self._warn_unscored(pending, "Scoring again")

    # ------------------------------------------------------------------------------------------------------------
    # One step

    def _run_step(self, step: int) -> None:
        state, opt = self.state, self.opt
        record = state.steps[step] if step < len(state.steps) else None
        asked_now = record is None  # a resumed step's proposals were asked (or skipped) by the run before
        if record is None:
            predictor = self.data.targets[step % len(self.data.targets)]
            exemplars = self.exemplars.draw(step, predictor, state)
            pairs = self.exemplars.pairs(exemplars, predictor, state) if opt.num_exemplars else None
            meta_prompt = gen_meta_prompt(predictor_history(state, predictor), pairs, self.options)
            logger.info("Step %d: optimizing %r with exemplars %s", step, predictor, exemplars)
            started = time.time()
            self._take_usage("task")  # what lingering evaluations cost is the task's, not the optimizer's
            with self._phase(f"step {step} proposals"):
                proposals = propose(self.models.prompt, meta_prompt, num_candidates=self.num_candidates, step=step,
                                    seed=opt.seed, temperature=opt.temperature, max_tokens=opt.max_tokens,
                                    num_threads=self.num_threads, take_usage=self.meter.take,
                                    ignores_n=self.ignores_n, cost_left=self._cost_left(),
                                    received=self.recorder.received_replies(state, step, meta_prompt),
                                    reply_log=self.recorder.reply_log(step, meta_prompt))
            # Until the step is recorded, a snapshot (Ctrl-C, an error) holds its replies beside their usage.
            self.recorder.keep_replies(state, step, meta_prompt, proposals.by_sample)
            self._record_usage("optimizer", proposals.usage)
            model = getattr(self.models.prompt, "model", "optimizer")
            if proposals.usage_undercount is not None:
                state.optimizer_usage_undercount.setdefault(model, proposals.usage_undercount)
            if proposals.single_choice is not None:
                state.optimizer_single_choice.setdefault(model, proposals.single_choice)
            record = Step(step=step, predictor=predictor, exemplar_indices=exemplars, meta_prompt=meta_prompt,
                          temperature=opt.temperature, failed_calls=proposals.failed_calls, errors=proposals.errors,
                          skipped_calls=proposals.skipped_calls, skip_reason=proposals.skip_reason, started_at=started)
            if self.racing:  # the best at the start of the step, fixed for the step (and for its resumption)
                record.race_against = (state.best() or state.candidates[START_ID]).id
            replies, new = step_candidates(record, proposals.replies, state, self.options,
                                           max_instruction_chars=opt.max_instruction_chars)
            record.replies += replies
            state.candidates += new
            state.steps.append(record)
            self.recorder.save(state)
            self._check_empty_steps()
        new = [c for c in state.candidates if c.step == step and c.status == CandidateStatus.PENDING]
        fates = [reply.fate for reply in record.replies]
        scored = fates.count("new") + fates.count("unclosed")
        logger.info("Step %d: %d replies, %d new (%d without their closing tag), %d duplicates, %d skipped, %d failed "
                    "calls", step, len(fates), scored, fates.count("unclosed"), fates.count("duplicate"),
                    len(fates) - scored - fates.count("duplicate"), record.failed_calls)
        if fates.count("unclosed") and not self._said_unclosed:
            self._said_unclosed = True
            logger.warning("Step %d: %d optimizer replies opened the instruction's tag and never closed it; as the "
                           "authors' extraction does, each is taken from the tag to the end of the reply (whatever "
                           "the model wrote after its instruction included) and scored. Said once per run; the "
                           "replies are in the run record (fate 'unclosed')", step, fates.count("unclosed"))
        with self._phase(f"step {step} scoring"):
            self._score(new, "train", baseline=self._baseline(record), decided=self._decided_of(step))
        self._warn_unscored(new, f"Step {step}")
        if asked_now and record.skipped_calls and record.skip_reason:
            self._stop(f"{record.skip_reason}: step {step} asked for {self.num_candidates - record.skipped_calls} of "
                       f"its {self.num_candidates} proposals")
        best = state.best()
        record.best_score = best.score if best is not None else None
        record.complete = state.status != "stopped"
        if record.complete:
            record.ended_at = time.time()
        self.recorder.save(state)
        self.recorder.write_step_report(state, step)
        if best is not None:
            logger.info("Step %d: best training score so far %.1f", step, 100 * (best.score or 0.0))

    def _cost_left(self) -> float | None:
        """USD left under ``max_cost`` for the next optimizer requests (None: no limit)."""
        if self.opt.max_cost is None:
            return None
        return max(0.0, self.opt.max_cost - self.state.usage.total_cost)

    def _warn_unscored(self, candidates: list[Candidate], where: str) -> None:
        """One WARNING for the candidates an outage left unscored after the retry: how many, and why."""
        unscored = [c for c in candidates if c.status == CandidateStatus.UNSCORED]
        if unscored:
            logger.warning("%s: %d candidate%s left unscored by infrastructure failures after a retry (%s; last: %s). "
                           "Compiling again%s scores them again.", where, len(unscored),
                           "s" if len(unscored) > 1 else "", ", ".join(str(c.id) for c in unscored),
                           unscored[-1].reason, " with the same log_dir" if self.folder else "")

    def _check_optimizer_answered(self) -> None:
        """A run whose optimizer calls all failed learned nothing: it raises rather than return the start."""
        steps = self.state.steps
        if not steps or any(record.replies for record in steps) or not any(record.failed_calls for record in steps):
            return
        errors = [error for record in steps for error in record.errors]
        model = getattr(self.models.prompt, "model", repr(self.models.prompt))
        calls = sum(record.failed_calls for record in steps)
        self._stop(f"no optimizer call succeeded ({calls} failed)")
        raise OptimizerUnavailableError(
            f"no call to the optimizer model {model!r} succeeded in {len(steps)} step{'s' if len(steps) > 1 else ''} "
            f"({calls} failed after a retry); last error: {errors[-1] if errors else 'none recorded'}. Nothing was "
            f"learned, so the start is not returned as a result. Fix the optimizer model's provider and "
            f"{self.resume_hint}: what was scored is kept.")

    def _decided_of(self, step: int) -> list[Candidate]:
        """A step's candidates already scored or raced out (a resumed race replays them)."""
        return [c for c in self.state.candidates
                if c.step == step and c.status in (CandidateStatus.SCORED, CandidateStatus.RACED_OUT)]

    def _baseline(self, record: Step) -> Candidate | None:
        """The candidate a step's new candidates are scored against (racing), fixed when the step began."""
        return self.state.candidates[record.race_against] if record.race_against is not None else None

    def _check_empty_steps(self) -> None:
        empty = 0
        for record in reversed(self.state.steps):
            if record.replies:
                break
            empty += 1
        if empty >= MAX_EMPTY_STEPS:
            last = self.state.steps[-1].errors[-1] if self.state.steps[-1].errors else "no error recorded"
            self._stop(f"{empty} steps in a row without an optimizer reply")
            raise OPRORunError(f"the optimizer model returned no reply in {empty} steps in a row; last error: {last}")

    # ------------------------------------------------------------------------------------------------------------
    # Scoring, and recording what it returns (the scorer's ScoringRecorder)

    def _score(self, candidates: list[Candidate], split: Split, *, baseline: Candidate | None = None,
               decided: Sequence[Candidate] = ()) -> None:
        if split == "val":
            for candidate in candidates:
                if candidate.val_scores is None:
                    candidate.val_scores = no_scores(len(self.data.valset))
        try:
            stop_reason = self.scorer.score(candidates, split, baseline=baseline, decided=decided)
        finally:
            self.spans.end_all()
        self._take_usage("task")
        if stop_reason is not None:
            self._stop(stop_reason)
            self.recorder.save(self.state)

    def span(self, candidate: Candidate, split: Split) -> contextlib.AbstractContextManager[Any]:
        return self.spans.current(candidate, split)

    def _take_usage(self, role: str) -> None:
        """Record what the metered LMs were billed since the last read (calls that ended between evaluations, here
        or, after their results, on Dask workers)."""
        with self.lock:
            self._record_usage(role, add_usage(self.meter.take(), self.runner.late_usage()))

    def _record_usage(self, role: str, usage: dict[str, ModelUsage]) -> None:
        if usage:
            self.state.usage.record(role, usage)  # type: ignore[arg-type]
            roll_up(self.caller_tracker, usage)

    def record_result(self, result: ExampleResult) -> None:
        """One finished evaluation: its usage, the run's count, the journal, then the candidate.

        A fatal LM error, a program that returns no prediction, or more errors than ``max_errors`` stop the run here
        (everything recorded before is kept).
        """
        state = self.state
        candidate = state.candidates[result.candidate_id]
        with self.lock:
            usage = add_usage(dict(result.usage), self.meter.take())
            self._record_usage("task", usage)
        if result.outcome == "fatal":
            role, model = self._failing_model(result)
            raise FatalLMError(f"the {role} {model!r} failed in a way no retry can fix on "
                               f"{self._describe_failure(result)}. Check its API key (or environment variable), "
                               "permissions, billing and model name.")
        state.metric_calls += 1  # the one count of evaluations that ran (a fatal one did not)
        if result.outcome == "interrupted":
            raise ProgramError(
                f"the {'metric' if result.stage == 'metric' else 'program'} raised KeyboardInterrupt itself on "
                f"{self._describe_failure(result, error=False)} (code asking the run to stop, not Ctrl-C, which "
                f"never lands on an evaluation's thread). Remove that raise; then {self.resume_hint}.")
        if result.outcome == "not_a_prediction":
            name = type(self.base).__name__
            raise ProgramError(
                f"the program {name} {result.error} on {self._describe_failure(result, error=False)}, not a "
                f"dspy.Prediction: no instruction can fix that. Make {name}.forward return the prediction of its last "
                "predictor (e.g. `return self.predict(question=question)`) or dspy.Prediction(answer=...).")
        if result.counted:
            self._count_error(result)
        if result.anchor is not None and self.anchored is not None:
            state.anchors[f"{result.split}:{result.index}"] = result.anchor
            self.anchored.add_anchor(self.data.examples(_split(result.split))[result.index], result.anchor)
        # A tolerated metric error is recorded as a program error is: it scored failure_score, the error is kept.
        outcome = "failed" if result.outcome == "metric_error" else result.outcome
        error = f"{METRIC_ERROR_PREFIX}{result.error}" if result.outcome == "metric_error" else result.error
        self.recorder.journal(candidate, index=result.index, split=result.split, outcome=outcome, score=result.score,
                              error=error, answer=result.answer, usage=usage, anchor=result.anchor,
                              count=state.metric_calls)
        record_result(candidate, index=result.index, split=result.split, outcome=outcome, score=result.score,
                      error=error, answer=result.answer)

    def _count_error(self, result: ExampleResult) -> None:
        """One error ``max_errors`` counts, per evaluation of one candidate as ``dspy.Evaluate`` counts them: logged
        and recorded; past the limit the run stops."""
        key = (result.split, result.candidate_id)
        count = self.errors[key] = self.errors.get(key, 0) + 1
        limit, where = self.opt.max_errors, "metric" if result.outcome == "metric_error" else "program"
        scope = f"error {count} of candidate {result.candidate_id}'s evaluation on {_split_name(result.split)}"
        if limit is not None and count > limit:
            if where == "metric":
                raise MetricError(
                    f"the metric failed on {self._describe_failure(result)}, {scope}, more than max_errors={limit}. "
                    "Fix the metric: it must return a float in [0, 1], a bool, or dspy.Prediction(score=..., "
                    f"feedback=...); then {self.resume_hint}.")
            raise ProgramError(
                f"the program raised on {self._describe_failure(result)}, {scope}, more than max_errors={limit}. Fix "
                f"the program (call it on that example to see the traceback), or raise max_errors; then "
                f"{self.resume_hint}.")
        self.state.tolerated_errors += 1
        logger.warning("Tolerated %s error %d of max_errors=%s for candidate %d (scored failure_score=%g) on %s", where,
                       count, limit, result.candidate_id, self.opt.failure_score, self._describe_failure(result))

    def record_outcome(self, outcome: CandidateOutcome) -> None:
        """A candidate whose scoring on a split ended: its status and mean, or why it has none."""
        candidate = self.state.candidates[outcome.candidate_id]
        self._warn_program_errors(candidate, outcome.split)
        status = str(outcome.status) if outcome.status is not None else \
            "scored" if outcome.score is not None else "unscored"
        self.spans.end(outcome.split, candidate.id, status=status, score=outcome.score)
        if outcome.split == "val":
            candidate.val_score = outcome.score
            return
        assert outcome.status is not None
        candidate.status, candidate.score, candidate.reason = outcome.status, outcome.score, outcome.reason
        if outcome.race is not None:
            candidate.race = outcome.race
        candidate.failed.sort()
        if outcome.status == CandidateStatus.RACED_OUT:
            logger.info("Candidate %d %s (partial mean %.1f)", candidate.id, candidate.reason,
                        100 * (candidate.score or 0.0))
        elif outcome.status == CandidateStatus.UNSCORED:
            logger.info("Candidate %d unscored: %s", candidate.id, candidate.reason)

    def _failing_model(self, result: ExampleResult) -> tuple[str, str]:
        """Which model a fatal error came from: the task model, the label-free judge, or the metric's own LM."""
        if result.stage == "program":
            return "task model", getattr(self.models.task, "model", repr(self.models.task))
        if self.anchored is not None:
            judge = self.models.judge or self.models.task
            return "judge model", getattr(judge, "model", repr(judge))
        return "model inside the metric", result.model or "unknown"

    def _describe_failure(self, result: ExampleResult, *, error: bool = True) -> str:
        """A one-line description of a stopping failure that names the example (and the error)."""
        example = self.data.examples(_split(result.split))[result.index]
        shown = repr({key: example[key] for key in example.inputs().keys()})
        shown = shown[:200] + "..." if len(shown) > 200 else shown
        return f"{_split_name(result.split)} example {result.index} ({shown})" + (f": {result.error}" if error else "")

    def _warn_program_errors(self, candidate: Candidate, split: Split) -> None:
        """One WARNING per candidate and split whose program (or metric) raised: how often, and the first error."""
        errors = [e for e in candidate.errors if e.split == split]
        if not errors or (split, candidate.id) in self._warned:
            return
        self._warned.add((split, candidate.id))
        first = errors[0]
        by_metric = [e.error.startswith(METRIC_ERROR_PREFIX) for e in errors]
        raised = "the metric raised" if all(by_metric) else "the program raised" if not any(by_metric) else \
            "the program or the metric raised"
        logger.warning("Candidate %d: %s on %d %s evaluations (%d distinct errors); first, on example %d: %s",
                       candidate.id, raised, sum(e.count for e in errors), _split_name(split), len(errors),
                       first.example, first.error)

    # ------------------------------------------------------------------------------------------------------------
    # Selection and output

    def _select(self) -> None:
        state = self.state
        if state.best() is None:
            raise OPRORunError("no candidate could be scored, not even the program as given; see the run record")
        has_valset = bool(self.data.valset)
        for group in self.selection.validation_phases(state, has_valset=has_valset):
            if group and state.status != "stopped":
                self._score(group, "val")
        start = state.candidates[START_ID]
        if start.val_score is not None:
            state.start_val_score = start.val_score
        state.selection = self.selection.decide(state, has_valset=has_valset)
        if state.status != "stopped":
            state.status = "finished"
            unscored = sum(c.status == CandidateStatus.UNSCORED for c in state.candidates)
            if unscored:
                state.stop_reason = (f"finished with {unscored} candidate{'s' if unscored > 1 else ''} unscored "
                                     "(infrastructure)")
                logger.warning("OPRO %s: compiling again%s scores them once the provider is back", state.stop_reason,
                               " with the same log_dir" if self.folder else "")
            elif validation_incomplete(state):
                state.stop_reason = "finished with its validation incomplete (infrastructure): selected on training"
                logger.warning("OPRO %s, not on the valset as select=%r asks: compiling again%s scores the rest of "
                               "the validation once the provider is back, and selects anew", state.stop_reason,
                               self.opt.select, " with the same log_dir" if self.folder else "")
        logger.info("OPRO selected candidate %d (%s)", state.selection.candidate_id, state.selection.reason)

    def _result(self) -> dspy.Module:
        if self.opt.instruction_pos in AFTER_INPUTS:
            logger.warning("instruction_pos=%r: the returned program carries the instruction in an extra input "
                           "field after the inputs, which a fresh program loading its JSON save with DSPy's load() "
                           "lacks; load it with dspy_opro.load_program(program, 'x.json') instead",
                           self.opt.instruction_pos)
        return attach_result(self.state, self.setup.program, log_dir=self.folder, track_stats=self.opt.track_stats)


@contextlib.contextmanager
def ctrl_c_deferred() -> Iterator[None]:
    """Hold a Ctrl-C that arrives during the block until it ends (then raise it), so that what the block writes is
    written whole; only where Python delivers signals (the main thread) and when Ctrl-C raises KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    held: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if held:
        raise KeyboardInterrupt


def _split(name: str) -> Split:
    return "val" if name == "val" else "train"


def _split_name(name: str) -> str:
    return "validation" if name == "val" else "training"


__all__ = ["OPRORun"]
