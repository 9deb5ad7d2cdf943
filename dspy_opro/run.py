"""One OPRO compile: the step loop, which owns the run record.

:class:`OPRORun` wires one ``compile`` together (the configuration, the checked data, the models, the run record and
its recorder, the scorer and the budget), and :meth:`OPRORun.execute` reads as the algorithm does:

1. score the program as given, with any ``initial_instructions``, on every training example (step -1); a program
   that cannot run, or a start that cannot be scored, stops the run before any optimizer call;
2. for every step: pick the predictor (round-robin), draw the exemplars, build the meta-prompt from the predictor's
   history, ask the optimizer for ``num_candidates`` proposals, triage the replies (extract, polish, de-duplicate,
   filter), score the new instructions, record the step;
3. select what to return (a :class:`~dspy_opro.selection.SelectionPolicy`) and return a copy of the program with it.

Data flows one way. :mod:`dspy_opro.proposing` builds the step's inputs and proposals; :mod:`dspy_opro.scoring`
returns the events of each scoring phase (every finished evaluation, then each candidate's outcome), and this loop
records them through its :class:`~dspy_opro.scoring_events.ScoringEventRecorder`: on the candidates, in the journal
(:mod:`dspy_opro.record`), in the usage and on the progress bar.
Nothing below this module imports it. The extensions come in through the policies the configuration builds and
through the metric (label-free OPRO's :class:`~dspy_opro.scoring.evaluation.AnchoredMetric`).
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import dspy

from dspy_opro.compat import user_stacklevel
from dspy_opro.config import OPROConfig
from dspy_opro.errors import (
    MetricError,
    OPRORunError,
    OptimizerUnavailableError,
    ProgramError,
    check_model_ready,
)
from dspy_opro.plan import RunPlan, initial_count, plan_run, use_local_price_maps_offline
from dspy_opro.proposing.initial import initial_by_predictor, initial_candidates
from dspy_opro.proposing.meta_prompt import gen_meta_prompt
from dspy_opro.proposing.optimizer_calls import propose
from dspy_opro.proposing.step_inputs import ExemplarPicker, predictor_history
from dspy_opro.proposing.triage import step_candidates
from dspy_opro.record.observers import CandidateReports, CandidateSpans
from dspy_opro.record.progress import Progress, evaluations_due, import_litellm_announced, phase_name
from dspy_opro.record.recorder import RunRecorder
from dspy_opro.record.state import (
    START_ID,
    Candidate,
    CandidateStatus,
    Fingerprint,
    Phase,
    RunState,
    Session,
    Split,
    Step,
    digest,
    no_scores,
    ranked_candidates,
)
from dspy_opro.record.summary import CandidateList, attach
from dspy_opro.scoring.evaluation import AnchoredMetric, metric_takes_trace
from dspy_opro.scoring.evaluator import Budget, Evaluator
from dspy_opro.scoring.scorer import CandidateScorer, EvaluationSetup
from dspy_opro.scoring.usage import token_prices
from dspy_opro.scoring_events import ScoringEventRecorder, split_of
from dspy_opro.task.data import RunData
from dspy_opro.task.placement import AFTER_INPUTS
from dspy_opro.task.programs import predictor_map, read_instructions

logger = logging.getLogger(__name__)

MAX_EMPTY_STEPS = 3  # steps in a row without a single optimizer reply before the run gives up


class OPRORun:
    """The state and steps of one ``OPROTeleprompter.compile`` call.

    Args:
        config: The run's configuration.
        student: The program to optimize (never changed).
        trainset: The training examples.
        valset: The validation examples, if any.
    """

    def __init__(self, config: OPROConfig, student: dspy.Module, trainset: Sequence[Any],
                 valset: Sequence[Any] | None):
        self.config = config
        metric = config.metric
        self.anchored: AnchoredMetric | None = metric if isinstance(metric, AnchoredMetric) else None
        self.data = RunData.build(student, trainset, valset, predictors=config.predictors,
                                  label_free=self.anchored is not None, valset_needed_by=config.valset_needed_by,
                                  num_exemplars=config.num_exemplars, max_metric_calls=config.max_metric_calls)
        self.selection = config.selection_policy(has_valset=bool(self.data.valset))
        self.initial = initial_by_predictor(config.initial, targets=self.data.targets,
                                            all_predictors=list(predictor_map(student)))
        self.models = config.resolve_models()
        roles = (("optimizer", self.models.prompt), ("task", self.models.task), ("judge", self.models.judge))
        use_local_price_maps_offline(lm for _, lm in roles)  # before LiteLLM's import and the first price lookup
        import_litellm_announced(roles)  # seconds of silence otherwise, before the first line of the run
        for role, lm in roles:
            if lm is not None:
                check_model_ready(lm, role)
        self.recorder = RunRecorder(config.folder, num_steps=config.steps,
                                    max_metric_calls=config.max_metric_calls, max_cost=config.max_cost)
        self.ignores_n: set[str] = set()  # optimizer models seen answering an n request with fewer choices
        self.num_threads = config.num_threads or dspy.settings.get("num_threads") or 1
        self.base = student.deepcopy()
        settings: dict[str, Any] = {"lm": self.models.task}
        if dspy.settings.adapter is not None:
            settings["adapter"] = dspy.settings.adapter
        self.caller_tracker = dspy.settings.usage_tracker  # usage is rolled up into the caller's track_usage()
        self.exemplars = ExemplarPicker(policy=config.exemplar_policy(), data=self.data,
                                        num_exemplars=config.num_exemplars)

        fingerprint = config.fingerprint(self.models, self.data.targets, trainset=self.data.trainset,
                                         valset=self.data.valset, program=self.base)
        saved = self.recorder.open(fingerprint)
        self.state = saved if saved is not None else self._new_record(fingerprint)
        self.ignores_n.update(self.state.optimizer_single_choice)  # found by the run this one resumes
        try:
            if self.anchored is not None:  # a resumed run judges against the anchors it recorded
                for key, text in self.state.anchors.items():
                    split, index = key.split(":")
                    self.anchored.add_anchor(self.data.examples(split_of(split))[int(index)], text)
            self.evaluator = Evaluator(num_threads=self.num_threads, executor=config.executor, timeout=config.timeout)
            # Each candidate's scoring is a span its evaluations run under, and is reported to DSPy's callbacks.
            self.spans = CandidateSpans()
            if self.spans.enabled:
                self.evaluator.job_context = self.spans.context_for
            self.reports = CandidateReports(trainset=self.data.trainset, valset=self.data.valset, metric=metric)
            self.budget = Budget(config.max_metric_calls, config.max_cost, self.state)
            setup = EvaluationSetup(
                data=self.data, base=self.base, instruction_pos=config.instruction_pos, metric=metric,
                metric_takes_trace=metric_takes_trace(metric), settings=settings, failure_score=config.failure_score,
                anchor_metric=self.anchored.anchor_metric() if self.anchored is not None else None)
            self.setup = setup
            self.scorer = CandidateScorer(setup=setup, evaluator=self.evaluator, budget=self.budget,
                                          policy=config.scoring_policy())
        except BaseException:
            self.recorder.close()
            raise
        self.progress = Progress(display=config.display_progress)
        self.events = ScoringEventRecorder(
            state=self.state, recorder=self.recorder, data=self.data, setup=setup, models=self.models,
            max_errors=config.max_errors, failure_score=config.failure_score, anchored=self.anchored,
            progress=self.progress, spans=self.spans, reports=self.reports, caller_tracker=self.caller_tracker)

    def _new_record(self, fingerprint: Fingerprint) -> RunState:
        """A fresh run record: the program as given is candidate 0, its initial instructions follow (all step -1)."""
        targets = self.data.targets
        state = RunState(fingerprint=fingerprint,
                         config=self.config.recorded_settings(self.models, targets, has_valset=bool(self.data.valset)),
                         predictors=targets, train_size=len(self.data.trainset), val_size=len(self.data.valset))
        start = read_instructions(self.base, targets)
        state.candidates.append(Candidate(id=START_ID, step=-1, predictor=None, instruction="", instructions=start,
                                          md5=digest(start), scores=[None] * len(self.data.trainset)))
        state.candidates += initial_candidates(self.initial, start=start, first_id=START_ID + 1,
                                               n_train=len(self.data.trainset))
        return state

    # ------------------------------------------------------------------------------------------------------------
    # The run

    def execute(self) -> dspy.Module:
        state = self.state
        try:
            if state.selection is not None:
                logger.info("The OPRO run in %s is complete; returning its result without LM calls",
                            self.config.log_dir)
                return self._result()
            state.sessions.append(Session(started_at=time.time()))
            self._announce()
            self.recorder.save_first(state)
            with self._phase("step -1 scoring"):
                self._score_start()
            self._log_cost_estimate()
            self._score_pending_of_finished_steps()
            first = len(state.steps) - (0 if not state.steps or state.steps[-1].complete else 1)
            for step in range(first, self.config.steps):
                if state.status == "stopped" or self._check_budget():
                    break
                self._run_step(step)
            self._check_optimizer_answered()
            with self._phase("selection"):
                self._select()
            self._end_session(state.status)
            self.recorder.save(state, final=True)
            return self._result()
        except BaseException as exc:
            # Ctrl-C, a fatal LM error or a broken metric: keep what was paid for before the error propagates.
            self.events.keep_finished(self.evaluator.take_finished())
            self._end_session("interrupted" if isinstance(exc, KeyboardInterrupt) else "failed")
            self.recorder.end(state, exc)
            raise
        finally:
            self.evaluator.close()
            self.recorder.close()
            self.progress.close()

    def plan(self) -> RunPlan:
        """The run's plan in LM calls (the same as ``OPROTeleprompter.estimate`` returns)."""
        return plan_run(self.config, self.models, self.data, self.selection,
                        initial=initial_count(self.config, self.base, self.data), ignores_n=self.ignores_n)

    def _announce(self) -> None:
        config, n_train = self.config, len(self.data.trainset)
        logger.info("OPRO: %d steps x %d candidates over %d training examples, predictors %s", config.steps,
                    config.candidates, n_train, self.data.targets)
        logger.info(self.plan().describe())
        if self.state.metric_calls:
            logger.info("OPRO resumes: %d evaluations and %d steps are already in the record",
                        self.state.metric_calls, len(self.state.steps))
        self._log_selection()
        if config.max_cost is not None:
            for role, lm in (("optimizer", self.models.prompt), ("task", self.models.task)):
                if token_prices(getattr(lm, "model", "")) is None:
                    warnings.warn(f"max_cost=${config.max_cost:g}: the {role} model {lm.model!r} has no known price, "
                                  "so its calls count as $0 and the cost is reported as unknown",
                                  stacklevel=user_stacklevel())

    def _log_selection(self) -> None:
        select, has_valset = self.config.select, bool(self.data.valset)
        if self.selection.uses_valset and has_valset:
            why = " (select='auto' with a valset; select='train' is the paper's setting)" if select == "auto" else ""
            logger.info("OPRO selects on the valset (%d examples)%s", len(self.data.valset), why)
        elif select == "auto" and not has_valset:
            logger.info("OPRO selects on training (the paper's setting): no valset was given")
        elif has_valset and not self.selection.uses_valset:
            logger.info("OPRO selects on training (select=%r): the valset of %d examples is not used", select,
                        len(self.data.valset))

    def _log_cost_estimate(self) -> None:
        """After step -1: the plan's cost, from the task tokens measured per evaluation so far."""
        task, calls = self.state.usage.task, self.state.metric_calls
        if not calls:
            return
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
        self.state.status = "stopped"
        self.state.stop_reason = reason

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
            raise OPRORunError(
                f"the program as given could not be scored on every training example ({start.reason}), and every "
                "meta-prompt must show its instruction with its score. Fix the cause (the task model's provider, "
                "the budget) and compile again with the same log_dir to resume."
            )
        if len(start.failed) == n_train and start.errors:
            first = start.errors[0]
            if all(e.error.startswith("metric: ") for e in start.errors):  # tolerated one by one, but never scored
                raise MetricError(
                    f"the metric failed on all {n_train} training examples of the program as given; first, on "
                    f"example {first.example}: {first.error.removeprefix('metric: ')}. Fix the metric: it must return "
                    "a float in [0, 1], a bool, or dspy.Prediction(score=..., feedback=...); then compile again.")
            raise ProgramError(
                f"the program as given raised on all {n_train} training examples; first, on example {first.example}: "
                f"{first.error}. No instruction can do better than a program that cannot run: fix the program "
                "(call it on one training example to see the traceback) and compile again."
            )
        logger.info("Step -1: training score %.1f", 100 * (start.score or 0.0))
        for candidate in initial[1:]:
            if candidate.status == CandidateStatus.SCORED:
                logger.info("Step -1: initial instruction %d for %r: training score %.1f", candidate.id,
                            candidate.predictor, 100 * (candidate.score or 0.0))
            elif candidate.status == CandidateStatus.UNSCORED:
                logger.warning("Step -1: initial instruction %d for %r is unscored (%s); the run goes on without it",
                               candidate.id, candidate.predictor, candidate.reason)

    def _score_initial(self, candidates: list[Candidate]) -> None:
        """One scoring phase for step -1 candidates, all in parallel; label-free runs score the start first, since
        its runs are the anchors the other candidates are judged against."""
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

    def _run_step(self, step: int) -> None:
        state, config = self.state, self.config
        record = state.steps[step] if step < len(state.steps) else None
        asked_now = record is None  # a resumed step's proposals were asked (or skipped) by the run before
        if record is None:
            predictor = self.data.targets[step % len(self.data.targets)]
            exemplar_indices = self.exemplars.draw(step, predictor, state)
            meta_prompt = gen_meta_prompt(
                predictor_history(state, predictor),
                self.exemplars.pairs(exemplar_indices, predictor, state) if config.num_exemplars else None,
                optimizer_family=config.optimizer_family, instruction_pos=config.instruction_pos,
                meta_prompt_type=config.meta_prompt_type, include_qa=config.include_qa,
                score_threshold=config.score_threshold, max_num_instructions=config.max_num_instructions,
                num_score_buckets=config.num_score_buckets, task_description=config.task_description)
            logger.info("Step %d: optimizing %r with exemplars %s", step, predictor, exemplar_indices)
            started = time.time()
            with self._phase(f"step {step} proposals"):
                proposals = propose(self.models.prompt, meta_prompt, num_candidates=config.candidates, step=step,
                                    seed=config.seed, temperature=config.temperature, max_tokens=config.max_tokens,
                                    num_threads=self.num_threads, ignores_n=self.ignores_n,
                                    cost_left=self._cost_left(),  # counts the received replies' cost as spent
                                    received=self.recorder.received_replies(state, step, meta_prompt),
                                    reply_log=self.recorder.reply_log(step, meta_prompt))
            # Until the step is recorded, a snapshot (Ctrl-C, an error) holds its replies beside their usage.
            self.recorder.keep_replies(state, step, meta_prompt, proposals.by_sample)
            self.events.record_usage("optimizer", proposals.usage)
            if proposals.usage_undercount is not None:
                state.optimizer_usage_undercount.setdefault(getattr(self.models.prompt, "model", "optimizer"),
                                                            proposals.usage_undercount)
            if proposals.single_choice is not None:
                state.optimizer_single_choice.setdefault(getattr(self.models.prompt, "model", "optimizer"),
                                                         proposals.single_choice)
            record = Step(step=step, predictor=predictor, exemplar_indices=exemplar_indices, meta_prompt=meta_prompt,
                          temperature=config.temperature, failed_calls=proposals.failed_calls,
                          errors=proposals.errors, skipped_calls=proposals.skipped_calls,
                          skip_reason=proposals.skip_reason, started_at=started)
            if config.racing:  # the best at the start of the step, fixed for the step (and for its resumption)
                record.race_against = (state.best() or state.candidates[START_ID]).id
            self._triage(record, proposals.replies)
            state.steps.append(record)
            self._save()
            self._check_empty_steps()
        new = [c for c in state.candidates if c.step == step and c.status == CandidateStatus.PENDING]
        fates = [reply.fate for reply in record.replies]
        scored = fates.count("new") + fates.count("unclosed")
        logger.info("Step %d: %d replies, %d new (%d without their closing tag), %d duplicates, %d skipped, %d failed "
                    "calls", step, len(fates), scored, fates.count("unclosed"), fates.count("duplicate"),
                    len(fates) - scored - fates.count("duplicate"), record.failed_calls)
        with self._phase(f"step {step} scoring"):
            self._score(new, "train", baseline=self._baseline(record), decided=self._decided_of(step))
        self._warn_unscored(new, f"Step {step}")
        if asked_now and record.skipped_calls and record.skip_reason:
            self._stop(f"{record.skip_reason}: step {step} asked for {config.candidates - record.skipped_calls} "
                       f"of its {config.candidates} proposals")
        best = state.best()
        record.best_score = best.score if best is not None else None
        record.complete = state.status != "stopped"
        if record.complete:
            record.ended_at = time.time()
        self._save()
        self.recorder.write_step_report(state, step)
        if best is not None:
            logger.info("Step %d: best training score so far %.1f", step, 100 * (best.score or 0.0))

    def _cost_left(self) -> float | None:
        """USD left under ``max_cost`` for the next optimizer requests (None: no limit)."""
        if self.config.max_cost is None:
            return None
        return max(0.0, self.config.max_cost - self.state.usage.total_cost)

    def _warn_unscored(self, candidates: list[Candidate], where: str) -> None:
        """One WARNING for the candidates an outage left unscored after the retry: how many, and why."""
        unscored = [c for c in candidates if c.status == CandidateStatus.UNSCORED]
        if unscored:
            logger.warning("%s: %d candidate%s left unscored by infrastructure failures after a retry (%s; last: %s). "
                           "Compiling again with the same log_dir scores them again.", where, len(unscored),
                           "s" if len(unscored) > 1 else "", ", ".join(str(c.id) for c in unscored),
                           unscored[-1].reason)

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
            "learned, so the start is not returned as a result. Fix the optimizer model's provider and compile again "
            "with the same log_dir: what was scored is kept.")

    def _decided_of(self, step: int) -> list[Candidate]:
        """A step's candidates already scored or raced out (a resumed race replays them)."""
        return [c for c in self.state.candidates if c.step == step and c.status in
                (CandidateStatus.SCORED, CandidateStatus.RACED_OUT)]

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

    def _triage(self, record: Step, replies: list[str]) -> None:
        """Triage the replies (:func:`step_candidates`): the step's reply records, and its new candidates."""
        config = self.config
        records, new = step_candidates(record, replies, self.state, n_train=len(self.data.trainset),
                                       optimizer_family=config.optimizer_family,
                                       instruction_pos=config.instruction_pos,
                                       meta_prompt_type=config.meta_prompt_type,
                                       max_instruction_chars=config.max_instruction_chars)
        record.replies += records
        self.state.candidates += new

    # ------------------------------------------------------------------------------------------------------------
    # Scoring and recording what it returns

    def _score(self, candidates: list[Candidate], split: Split, *, baseline: Candidate | None = None,
               decided: Sequence[Candidate] = ()) -> None:
        """One scoring phase: every event the scorer returns is recorded as it arrives."""
        self.events.show_best()
        n = len(self.data.examples(split))
        if split == "val":
            for candidate in candidates:
                if candidate.val_scores is None:
                    candidate.val_scores = no_scores(n)
        self.progress.start_phase(phase_name(candidates, split, label_free=self.anchored is not None),
                                  evaluations_due(candidates, split, n_examples=n,
                                                  remaining_budget=self.budget.remaining_calls()))
        self.spans.start(candidates, split)
        phase = self.scorer.score(candidates, split, baseline=baseline, decided=decided)
        try:
            for event in phase:
                self.events.record(event)
        finally:
            self.spans.end_all()
            self.progress.end_phase()
        if phase.stop_reason is not None:
            self._stop(phase.stop_reason)
            self._save()

    def _save(self) -> None:
        self.recorder.save(self.state)

    # ------------------------------------------------------------------------------------------------------------
    # Final selection and output

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
                logger.warning("OPRO %s: compiling again with the same log_dir scores them once the provider is back",
                               state.stop_reason)
        logger.info("OPRO selected candidate %d (%s)", state.selection.candidate_id, state.selection.reason)

    def _result(self) -> dspy.Module:
        state = self.state
        assert state.selection is not None
        program = self.setup.program(state.candidates[state.selection.candidate_id])
        candidates = [
            {"score": c.score, "program": self.setup.program(c), "instructions": dict(c.instructions),
             "step": c.step, "val_score": c.val_score}
            for c in ranked_candidates(state.candidates)
        ]
        # Whole in memory; saved with the program only under track_stats (else a summary: record/summary.py).
        if self.config.track_stats:
            program.candidate_programs, program.opro_run = candidates, state  # type: ignore[attr-defined]
        else:
            program.candidate_programs = CandidateList(candidates)  # type: ignore[attr-defined]
            program.opro_run = attach(state, self.config.folder)  # type: ignore[attr-defined]
        # Not marked compiled (``_compiled``), as COPRO and MIPROv2 leave theirs: BootstrapFewShot and other
        # optimizers refuse a compiled student, and stacking them on OPRO's instructions is the common recipe.
        if self.config.instruction_pos in AFTER_INPUTS:
            logger.warning("instruction_pos=%r: the returned program carries the instruction as the default of an "
                           "extra input field, which DSPy's JSON save (program.save('x.json')) does not keep; save it "
                           "with program.save(folder, save_program=True) to keep it", self.config.instruction_pos)
        return program


__all__ = ["OPRORun"]
