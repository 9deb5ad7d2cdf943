"""One OPRO compile: input checks, the step loop, recording, resume and final selection.

:class:`OPRORun` holds everything that lives for one ``compile``: the resolved models, the data, the run record
(:class:`dspy_opro.state.RunState`), the evaluator and the budget. ``execute`` reads as the algorithm does: score the
program as given (step -1), then for every step pick the predictor, draw the exemplars, build the meta-prompt, ask
the optimizer, triage the replies, score the new instructions, and finally select what to return.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import dspy
import tqdm

from dspy_opro import selection
from dspy_opro.errors import (
    LogDirError,
    ProgramError,
    check_model_ready,
    describe_exception,
)
from dspy_opro.exemplars import NO_REFERENCE_NOTE, draw_exemplar_indices, render_fields
from dspy_opro.meta_prompt import gen_meta_prompt, instruction_md5
from dspy_opro.programs import (
    callable_fingerprint,
    dataset_fingerprint,
    output_fields,
    predictor_map,
    program_fingerprint,
    read_instructions,
    with_instructions,
)
from dspy_opro.proposer import honours_n, propose
from dspy_opro.scoring import (
    Budget,
    Evaluator,
    ExampleJob,
    ExampleResult,
    FatalLMError,
    MetricError,
    OPRORunError,
    describe_failure,
    metric_takes_trace,
)
from dspy_opro.selection import START_ID
from dspy_opro.state import (
    MAX_ERROR_KINDS,
    STATE_FILE,
    Candidate,
    ErrorRecord,
    Fingerprint,
    LogDirLock,
    ModelUsage,
    ProgressJournal,
    Reply,
    RunState,
    Step,
    check_fingerprint,
    digest,
    load_state,
    save_state,
)
from dspy_opro.triage import triage_replies
from dspy_opro.usage import roll_up, token_prices

if TYPE_CHECKING:
    from dspy_opro.teleprompter import OPROTeleprompter

logger = logging.getLogger(__name__)

MAX_EMPTY_STEPS = 3  # steps in a row without a single optimizer reply before the run gives up
LM_FAILURES = "LM failures"  # how the reason of a candidate left unscored by infrastructure failures begins


def _check_examples(name: str, examples: Sequence[Any]) -> list[dspy.Example]:
    examples = list(examples)
    for position, example in enumerate(examples):
        if not isinstance(example, dspy.Example):
            raise TypeError(f"{name}[{position}] is a {type(example).__name__}, not a dspy.Example")
        if not example._input_keys:
            raise ValueError(
                f"{name}[{position}] has no input fields set; build examples with "
                "dspy.Example(...).with_inputs('question', ...)"
            )
    return examples


def _resolve_model(model: Any) -> dspy.BaseLM | None:
    """A LiteLLM model string becomes ``dspy.LM(model, engine="litellm")``; an LM or None stays as it is."""
    return dspy.LM(model, engine="litellm") if isinstance(model, str) else model


def _check_log_dir_is_folder(log_dir: str) -> None:
    """Refuse a ``log_dir`` that is a file, before any LM call."""
    path = Path(log_dir)
    if path.exists() and not path.is_dir():
        raise LogDirError(f"log_dir {str(path)!r} is a file, not a folder. Pass the path of a folder (it is created "
                          "if missing), or move the file away.")


def _check_log_dir_writable(log_dir: str) -> None:
    """Refuse a ``log_dir`` where no file can be written, before any LM call (a finished run's folder may be
    read-only: its result is returned without writing)."""
    path = Path(log_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-check-", dir=path)
        try:
            os.write(fd, b"\0" * 4096)  # a full disk refuses data, not always an empty file
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        raise LogDirError(f"log_dir {str(path)!r} cannot hold the run record: {exc.strerror or exc}. Choose a "
                          "folder you can write to, on a disk with free space.") from exc


def _resolve_prompt_model(prompt_model: Any) -> dspy.BaseLM:
    if isinstance(prompt_model, str):
        return dspy.LM(prompt_model, engine="litellm")
    if prompt_model is None:
        if dspy.settings.lm is None:
            raise ValueError("no optimizer model: pass prompt_model=... or dspy.configure(lm=...)")
        return dspy.settings.lm
    return prompt_model


_LIBRARY_DIRS = tuple(str(Path(module.__file__).resolve().parent) + os.sep
                      for module in (dspy, sys.modules[__package__]))


def user_stacklevel() -> int:
    """The ``stacklevel`` of a warning issued by the caller that points at the first line outside dspy-opro and DSPy
    (DSPy wraps ``compile`` in callback handlers, so a fixed number would point into DSPy)."""
    frame = sys._getframe(1)  # the function that calls warnings.warn: stacklevel 1
    level = 1
    while frame is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(_LIBRARY_DIRS):
        frame = frame.f_back
        level += 1
    return level


def _mean(values: Sequence[float | None]) -> float:
    return sum(v for v in values if v is not None) / len(values)


class OPRORun:
    """The state and steps of one ``OPROTeleprompter.compile`` call."""

    def __init__(self, config: OPROTeleprompter, student: dspy.Module, trainset: Sequence[Any],
                 valset: Sequence[Any] | None):
        self.cfg = config
        if not isinstance(student, dspy.Module):
            raise TypeError(f"compile() needs a dspy.Module to optimize; got {type(student).__name__}")
        self.trainset = _check_examples("trainset", trainset)
        self.valset = _check_examples("valset", valset or [])
        if not self.trainset:
            raise ValueError("trainset is empty; OPRO scores every instruction on the training examples")
        all_predictors = list(predictor_map(student))
        if not all_predictors:
            raise ValueError("the program has no predictors (dspy.Predict and friends) whose instructions to optimize")
        unknown = sorted(set(config.predictors or []) - set(all_predictors))
        if unknown:
            raise ValueError(f"unknown predictors {unknown}; the program's predictors are {all_predictors}")
        self.targets = config.predictors or all_predictors
        if config.select == "validation" and not self.valset:
            raise ValueError("select='validation' needs a valset: pass compile(..., valset=...) or use select='train'")
        if config.val_gate and not self.valset:
            raise ValueError("val_gate=True needs a valset: pass compile(..., valset=...)")
        if config.num_exemplars > len(self.trainset):
            raise ValueError(
                f"num_exemplars={config.num_exemplars} exceeds the trainset size {len(self.trainset)}; lower it"
            )
        if config.max_metric_calls is not None and config.max_metric_calls < len(self.trainset):
            raise ValueError(
                f"max_metric_calls={config.max_metric_calls} cannot even score the program as given on the "
                f"{len(self.trainset)} training examples; raise it or use a smaller trainset"
            )
        self.task_lm = _resolve_model(config.task_model) or dspy.settings.lm
        if self.task_lm is None:
            raise ValueError("no task model: pass task_model=... or dspy.configure(lm=...)")
        self.prompt_lm = _resolve_prompt_model(config.prompt_model)
        self.judge_lm = _resolve_model(config.judge_model)
        for role, lm in (("optimizer", self.prompt_lm), ("task", self.task_lm), ("judge", self.judge_lm)):
            if lm is not None:
                check_model_ready(lm, role)
        if config.log_dir:
            _check_log_dir_is_folder(config.log_dir)
        self.ignores_n: set[str] = set()  # optimizer models seen answering an n request with fewer choices
        self.num_threads = config.num_threads or dspy.settings.get("num_threads") or 1

        self.base = student.deepcopy()
        self.settings: dict[str, Any] = {"lm": self.task_lm}
        if dspy.settings.adapter is not None:
            self.settings["adapter"] = dspy.settings.adapter
        self.label_keys = [sorted(example.labels().keys()) for example in self.trainset]
        self.output_fields = {name: output_fields(self.base, name) for name in self.targets}
        # Examples whose labels miss some target predictor's outputs: their runs record an exemplar answer.
        self.needs_answer = [any(not self._label_fields(i, name) for name in self.targets)
                             for i in range(len(self.trainset))]
        self.metric = config.metric if not config.label_free else self._make_preference_metric()
        self.metric_takes_trace = metric_takes_trace(self.metric)
        # usage is rolled up into the caller's dspy.track_usage() tracker, if any
        self.caller_tracker = dspy.settings.usage_tracker
        self.lock = LogDirLock(config.log_dir) if config.log_dir else None
        try:
            self.state = self._load_or_create()
            if config.label_free:
                self._restore_anchors()
            self.evaluator = Evaluator(num_threads=self.num_threads, executor=config.executor)
            self.budget = Budget(config.max_metric_calls, config.max_cost, metric_calls=self.state.metric_calls,
                                 cost_so_far=lambda: self.state.usage.total_cost)
            self.journal = ProgressJournal(config.log_dir) if config.log_dir else None
            self._reopen_if_budget_allows()
            self._continue_if_more_steps()
            self._reopen_after_failure()
            self._retry_lm_failures()
        except BaseException:
            if self.lock is not None:
                self.lock.release()
            raise
        self._remaining: dict[tuple[str, int], set[int]] = {}
        self._infra_errors: dict[tuple[str, int], list[str]] = {}
        self._progress: tqdm.tqdm | None = None
        self._warned: set[tuple[str, int]] = set()

    # ------------------------------------------------------------------------------------------------------------
    # Set-up and resume

    def _search_config(self) -> dict[str, Any]:
        """What shapes the search: resuming under other values would mix two runs. (Budgets may change.)"""
        return {**self.cfg.search_config(), "prompt_model": getattr(self.prompt_lm, "model", None),
                "task_model": getattr(self.task_lm, "model", None), "targets": self.targets,
                "metric": callable_fingerprint(self.cfg.metric),
                "judge_model": getattr(self.judge_lm, "model", None)}

    def _uses_valset(self) -> bool:
        return self.cfg.select == "validation" or self.cfg.val_gate or self.cfg.label_free

    def _fingerprint(self) -> Fingerprint:
        # num_steps is left out: raising it continues a run from its last step, like a larger budget.
        settings = json.loads(json.dumps({key: value for key, value in self._search_config().items()
                                          if key != "num_steps"}, default=str))
        return Fingerprint(config=digest(settings), trainset=dataset_fingerprint(self.trainset),
                           valset=dataset_fingerprint(self.valset if self._uses_valset() else []),
                           program=program_fingerprint(self.base), settings=settings)

    def _load_or_create(self) -> RunState:
        fingerprint = self._fingerprint()
        if self.cfg.log_dir:
            saved = load_state(self.cfg.log_dir)
            if saved is not None and saved.selection is not None and not self._wants_more_steps(saved):
                # A finished run: its result needs no lock, so a read-only log_dir still returns it.
                check_fingerprint(saved, fingerprint, self.cfg.log_dir)
                if not self._would_reopen(saved):
                    self.lock = None
                    return saved
            _check_log_dir_writable(self.cfg.log_dir)
            self.lock.acquire()
            saved = load_state(self.cfg.log_dir)  # read again under the lock: another run may have just written it
            if saved is not None:
                check_fingerprint(saved, fingerprint, self.cfg.log_dir)
                self._replay_journal(saved)
                logger.info("Resuming the OPRO run in %s: %d candidates, %d steps recorded", self.cfg.log_dir,
                            len(saved.candidates), len(saved.steps))
                return saved
        config = {**self._search_config(), "max_metric_calls": self.cfg.max_metric_calls,
                  "max_cost": self.cfg.max_cost}
        start = read_instructions(self.base, self.targets)
        state = RunState(fingerprint=fingerprint, config=config, predictors=self.targets,
                         train_size=len(self.trainset), val_size=len(self.valset))
        state.candidates.append(Candidate(id=START_ID, step=-1, predictor=None, instruction="", instructions=start,
                                          md5=digest(start), scores=[None] * len(self.trainset)))
        return state

    def _replay_journal(self, state: RunState) -> None:
        """Apply evaluations that finished after the last snapshot of ``state.json``, with what they cost.

        An entry applies only to the candidate with the same instruction digest, and only where the snapshot has
        no score yet (a crash between writing the snapshot and clearing the journal leaves entries it holds).
        """
        for entry in ProgressJournal.read(self.cfg.log_dir):
            try:
                number, index, split = int(entry["c"]), int(entry["i"]), entry.get("split", "train")
                candidate = state.candidates[number] if 0 <= number < len(state.candidates) else None
                if candidate is None or entry.get("d") != candidate.md5:
                    continue
                scores = candidate.scores if split == "train" else candidate.val_scores
                if split == "train" and candidate.status != "pending":
                    continue
                if split == "val" and scores is None:
                    scores = candidate.val_scores = [None] * state.val_size
                if not 0 <= index < len(scores) or scores[index] is not None or entry.get("s") is None:
                    continue
                result = ExampleResult(candidate_id=number, index=index, outcome=entry["o"], score=entry["s"],
                                       error=entry.get("e"), answer=entry.get("a"))
                usage = {model: ModelUsage.model_validate(value) for model, value in (entry.get("u") or {}).items()}
            except (KeyError, TypeError, ValueError):
                continue  # not an entry this version wrote
            self._store(state, candidate, result, split)
            if "t" in entry:
                state.anchors[f"{split}:{index}"] = entry["t"]
            state.usage.record("task", usage)
            state.metric_calls += 1

    def _wants_more_steps(self, state: RunState) -> bool:
        return self.cfg.num_steps > len(state.steps) and state.status != "stopped"

    def _would_reopen(self, state: RunState) -> bool:
        """Whether a stopped run continues now: its budget allows more than it had."""
        if state.status != "stopped":
            return False
        budget = Budget(self.cfg.max_metric_calls, self.cfg.max_cost, metric_calls=state.metric_calls,
                        cost_so_far=lambda: state.usage.total_cost)
        return budget.exhausted() is None

    def _continue_if_more_steps(self) -> None:
        """A finished run continues from its last step when compiled again with a larger ``num_steps``."""
        state = self.state
        if state.selection is None or not self._wants_more_steps(state):
            return
        logger.info("The saved run finished after %d steps; num_steps=%d continues it", len(state.steps),
                    self.cfg.num_steps)
        state.status, state.selection = "running", None
        state.config["num_steps"] = self.cfg.num_steps

    def _reopen_if_budget_allows(self) -> None:
        """A run stopped by its budget continues when compiled again with a larger one."""
        state = self.state
        if state.status != "stopped" or self.budget.exhausted() is not None:
            return
        logger.info("The saved run stopped (%s); the budget now allows more, so it continues", state.stop_reason)
        state.status, state.stop_reason, state.selection = "running", None, None
        for candidate in state.candidates:
            if candidate.status == "unscored" and (candidate.reason or "").startswith("cut short"):
                candidate.status, candidate.reason = "pending", None

    def _reopen_after_failure(self) -> None:
        """A run that an exception or Ctrl-C ended continues where it was."""
        state = self.state
        if state.status in ("failed", "interrupted") and state.selection is None:
            logger.info("The saved run was %s (%s); it continues", state.status, state.stop_reason)
            state.status, state.stop_reason = "running", None

    def _retry_lm_failures(self) -> None:
        """On resuming an unfinished run, candidates left unscored by LM failures (an outage) are tried again."""
        if self.state.selection is not None:
            return
        for candidate in self.state.candidates:
            if candidate.status == "unscored" and (candidate.reason or "").startswith(LM_FAILURES):
                candidate.status, candidate.reason = "pending", None

    def _score_pending_of_finished_steps(self) -> None:
        steps = self.state.steps
        pending = [c for c in self.state.candidates
                   if c.status == "pending" and 0 <= c.step < len(steps) and steps[c.step].complete]
        if pending:
            logger.info("Scoring %d candidates again that LM failures left unscored before the run stopped",
                        len(pending))
            self._score(pending, "train")

    # ------------------------------------------------------------------------------------------------------------
    # The run

    def execute(self) -> dspy.Module:
        state = self.state
        try:
            if state.selection is not None:
                logger.info("The OPRO run in %s is complete; returning its result without LM calls", self.cfg.log_dir)
                return self._result()
            self._announce()
            if self.cfg.log_dir and not (Path(self.cfg.log_dir) / STATE_FILE).exists():
                self._save()  # the first snapshot, before anything is paid: step -1's journal entries need it
            self._score_start()
            self._score_pending_of_finished_steps()
            for step in range(len(state.steps) - (0 if self._last_step_complete() else 1), self.cfg.num_steps):
                if state.status == "stopped" or self._check_budget():
                    break
                self._run_step(step)
            self._select()
            self._save(final=True)
            return self._result()
        except BaseException as exc:
            # Ctrl-C, a fatal LM error or a broken metric: keep what was paid for before the error propagates.
            self._record_end(exc)
            raise
        finally:
            self.evaluator.close()
            if self.journal is not None:
                self.journal.close()
            if self.lock is not None:
                self.lock.release()
            if self._progress is not None:
                self._progress.close()

    def _record_end(self, exc: BaseException) -> None:
        """Mark the record ``interrupted`` or ``failed``, save it with ``report.md``, and say how to resume."""
        state = self.state
        interrupted = isinstance(exc, KeyboardInterrupt)
        state.status = "interrupted" if interrupted else "failed"
        state.stop_reason = "interrupted by the user (KeyboardInterrupt)" if interrupted else describe_exception(exc)
        reason = state.stop_reason.rstrip(".")
        saved = False
        if self.cfg.log_dir:
            try:
                self._save(final=True)
                saved = True
            except Exception as save_exc:  # never hide the original error behind a failed save
                logger.error("Could not save the run record: %s", save_exc)
        if saved:
            logger.error("OPRO run %s: %s. The run record is in %s (report.md shows it); compile again with the same "
                         "log_dir to resume.", state.status, reason, os.path.abspath(self.cfg.log_dir))
        elif self.cfg.log_dir:
            logger.error("OPRO run %s: %s. The run record in %s holds what was saved before; compile again with the "
                         "same log_dir to resume from there.", state.status, reason,
                         os.path.abspath(self.cfg.log_dir))
        else:
            logger.error("OPRO run %s: %s. No log_dir was set, so nothing was saved; pass log_dir=... to be able "
                         "to resume.", state.status, reason)

    def _announce(self) -> None:
        cfg, n_train = self.cfg, len(self.trainset)
        planned = n_train * (1 + cfg.num_steps * cfg.num_candidates)
        if cfg.select == "validation" or cfg.val_gate:
            planned += len(self.valset) * (cfg.top_k + (1 if cfg.val_gate else 0))
        elif cfg.label_free and self.valset:
            planned += 2 * len(self.valset)
        if cfg.max_metric_calls is not None:
            planned = min(planned, cfg.max_metric_calls)
        requests = cfg.num_steps * (1 if honours_n(self.prompt_lm, self.ignores_n) else cfg.num_candidates)
        logger.info(
            "OPRO: %d steps x %d candidates over %d training examples, predictors %s; at most %d evaluations planned "
            "(%d optimizer requests)", cfg.num_steps, cfg.num_candidates, n_train, self.targets, planned, requests)
        if cfg.max_cost is not None:
            for role, lm in (("optimizer", self.prompt_lm), ("task", self.task_lm)):
                if token_prices(getattr(lm, "model", "")) is None:
                    warnings.warn(f"max_cost=${cfg.max_cost:g}: the {role} model {lm.model!r} has no known price, so "
                                  "its calls count as $0 and the cost is reported as unknown",
                                  stacklevel=user_stacklevel())
        self._progress = tqdm.tqdm(total=planned, initial=self.state.metric_calls, desc="OPRO evaluations",
                                   unit="eval", disable=None, leave=False)

    def _last_step_complete(self) -> bool:
        return not self.state.steps or self.state.steps[-1].complete

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
        """Score the program as given on every training example, or stop: every meta-prompt shows its instruction."""
        start = self.state.candidates[START_ID]
        if start.status == "pending":
            logger.info("Step -1: scoring the program as given on %d training examples", len(self.trainset))
            self._score([start], "train")
            if start.status == "unscored" and (start.reason or "").startswith(LM_FAILURES):
                logger.warning("Step -1: the program as given is unscored (%s); trying those examples once more",
                               start.reason)
                start.status, start.reason = "pending", None
                self._score([start], "train")
        if start.status != "scored":
            raise OPRORunError(
                f"the program as given could not be scored on every training example ({start.reason}), and every "
                "meta-prompt must show its instruction with its score. Fix the cause (the task model's provider, "
                "the budget) and compile again with the same log_dir to resume."
            )
        n_train = len(self.trainset)
        if len(start.failed) == n_train and start.errors:
            first = start.errors[0]
            raise ProgramError(
                f"the program as given raised on all {n_train} training examples; first, on example {first.example}: "
                f"{first.error}. No instruction can do better than a program that cannot run: fix the program "
                "(call it on one training example to see the traceback) and compile again."
            )
        logger.info("Step -1: training score %.1f", 100 * start.score)

    def _run_step(self, step: int) -> None:
        state, cfg = self.state, self.cfg
        record = state.steps[step] if step < len(state.steps) else None
        if record is None:
            predictor = self.targets[step % len(self.targets)]
            exemplar_indices = self._draw_exemplars(step)
            meta_prompt = gen_meta_prompt(
                self._history(predictor),
                self._exemplars(exemplar_indices, predictor) if cfg.num_exemplars else None,
                optimizer_family=cfg.optimizer_family, instruction_pos=cfg.instruction_pos,
                meta_prompt_type=cfg.meta_prompt_type, include_qa=cfg.include_qa, score_threshold=cfg.score_threshold,
                max_num_instructions=cfg.max_num_instructions, num_score_buckets=cfg.num_score_buckets,
                task_description=cfg.task_description)
            logger.info("Step %d: optimizing %r with exemplars %s", step, predictor, exemplar_indices)
            proposals = propose(self.prompt_lm, meta_prompt, num_candidates=cfg.num_candidates, step=step,
                                seed=cfg.seed, temperature=cfg.temperature, max_tokens=cfg.max_tokens,
                                num_threads=self.num_threads, ignores_n=self.ignores_n)
            self._record_usage("optimizer", proposals.usage)
            record = Step(step=step, predictor=predictor, exemplar_indices=exemplar_indices, meta_prompt=meta_prompt,
                          temperature=cfg.temperature, failed_calls=proposals.failed_calls, errors=proposals.errors)
            self._triage(record, proposals.replies)
            state.steps.append(record)
            self._save()
            self._check_empty_steps()
        new = [c for c in state.candidates if c.step == step and c.status == "pending"]
        fates = [reply.fate for reply in record.replies]
        logger.info("Step %d: %d replies, %d new, %d duplicates, %d skipped, %d failed calls", step, len(fates),
                    fates.count("new"), fates.count("duplicate"),
                    len(fates) - fates.count("new") - fates.count("duplicate"), record.failed_calls)
        self._score(new, "train")
        best = state.best()
        record.best_score = best.score if best is not None else None
        record.complete = state.status != "stopped"
        self._save()
        self._write_step_report(step)
        if best is not None:
            logger.info("Step %d: best training score so far %.1f", step, 100 * best.score)

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
    # Meta-prompt inputs

    def _history(self, predictor: str) -> list[tuple[str, float, int]]:
        history = []
        for candidate in self.state.scored():
            if candidate.predictor is None:
                history.append((candidate.instructions[predictor], candidate.score, -1))
            elif candidate.predictor == predictor:
                history.append((candidate.instruction, candidate.score, candidate.step))
        return history

    def _draw_exemplars(self, step: int) -> list[int]:
        cfg = self.cfg
        predictor = self.targets[step % len(self.targets)]
        best = self.state.best()
        # The authors draw from every training example; only one with neither a usable label nor a usable answer
        # (the best program's output the metric accepted, or the metric's feedback) has nothing to show.
        eligible = [i for i in range(len(self.trainset)) if self._has_answer(i, predictor, best)]
        k = min(cfg.num_exemplars, len(eligible))
        if cfg.exemplar_selection != "hard_diverse":
            return draw_exemplar_indices(eligible, k, step, seed=cfg.seed, criteria=cfg.exemplar_selection)
        from dspy_opro.diversity import QuestionFeatures

        difficulties = None
        scored = [c for c in self.state.scored() if c.scores]
        if step > 0 and scored:
            difficulties = []
            for i in eligible:
                values = [c.scores[i] for c in scored if c.scores[i] is not None]
                difficulties.append(1.0 - sum(values) / len(values) if values else 1.0)
        if not hasattr(self, "question_features"):  # tokenise the questions once per compile
            self.question_features = QuestionFeatures.build([self._question(i) for i in range(len(self.trainset))])
        selection = self.question_features.select(difficulties, k, subset=eligible, theta=cfg.diversity_theta)
        return sorted(eligible[j] for j in selection.indices)

    def _has_answer(self, index: int, predictor: str, best: Candidate | None) -> bool:
        if self._label_fields(index, predictor):
            return True
        answer = best.answers.get(index) if best is not None else None
        return bool(answer) and answer != NO_REFERENCE_NOTE

    def _question(self, index: int) -> str:
        return render_fields(dict(self.trainset[index].inputs().items()))

    def _label_fields(self, index: int, predictor: str) -> list[str]:
        if self.cfg.label_free:
            return []
        labels = set(self.label_keys[index])
        return [name for name in self.output_fields[predictor] if name in labels]

    def _exemplars(self, indices: list[int], predictor: str) -> list[tuple[str, str]]:
        best = self.state.best()
        pairs = []
        for i in indices:
            fields = self._label_fields(i, predictor)
            if fields:
                answer = render_fields({name: self.trainset[i][name] for name in fields})
            else:
                answer = (best.answers.get(i) if best is not None else None) or NO_REFERENCE_NOTE
            pairs.append((self._question(i), answer))
        return pairs

    def _triage(self, record: Step, replies: list[str]) -> None:
        """Extract, polish and de-duplicate the replies (:func:`triage_replies`); new ones become pending candidates."""
        cfg, state = self.cfg, self.state
        predictor = record.predictor
        seen = {instruction_md5(state.candidates[START_ID].instructions[predictor]): START_ID}
        seen.update({c.md5: c.id for c in state.candidates if c.predictor == predictor})
        best = state.best() or state.candidates[START_ID]
        for verdict in triage_replies(replies, seen, optimizer_family=cfg.optimizer_family,
                                      instruction_pos=cfg.instruction_pos, meta_prompt_type=cfg.meta_prompt_type,
                                      max_instruction_chars=cfg.max_instruction_chars):
            text, instruction, fate, reason = verdict.text, verdict.instruction, verdict.fate, verdict.reason
            if instruction is None or fate == "duplicate":
                record.replies.append(Reply(text=text, instruction=instruction, fate=fate,
                                            candidate_id=seen.get(verdict.md5) if verdict.md5 else None))
                continue
            candidate = Candidate(id=len(state.candidates), step=record.step, predictor=predictor,
                                  instruction=instruction, instructions={**best.instructions, predictor: instruction},
                                  md5=verdict.md5, status="skipped" if reason else "pending", reason=reason,
                                  scores=[] if reason else [None] * len(self.trainset))
            state.candidates.append(candidate)
            seen[verdict.md5] = candidate.id
            record.replies.append(Reply(text=text, instruction=instruction, fate=fate, candidate_id=candidate.id))

    # ------------------------------------------------------------------------------------------------------------
    # Scoring

    def _examples(self, split: str) -> list[dspy.Example]:
        return self.trainset if split == "train" else self.valset

    def _score(self, candidates: list[Candidate], split: str) -> None:
        """Score candidates on every example of a split that they have no score for; all candidates in parallel."""
        examples = self._examples(split)
        todo: list[tuple[Candidate, list[int]]] = []
        for candidate in candidates:
            if split == "val" and candidate.val_scores is None:
                candidate.val_scores = [None] * len(examples)
            scores = candidate.scores if split == "train" else candidate.val_scores
            missing = [i for i, value in enumerate(scores) if value is None]
            key = (split, candidate.id)
            self._remaining[key] = set(missing)
            self._infra_errors[key] = []
            if missing:
                todo.append((candidate, missing))
            else:
                self._finish(candidate, split)

        def jobs() -> Iterator[ExampleJob]:
            for candidate, missing in todo:
                program = with_instructions(self.base, candidate.instructions, instruction_pos=self.cfg.instruction_pos)
                metric = self.metric if candidate.id != START_ID or not self.cfg.label_free else None
                for i in missing:
                    yield ExampleJob(
                        candidate_id=candidate.id, index=i, program=program, example=examples[i], metric=metric,
                        failure_score=self.cfg.failure_score, settings=self.settings, split=split,
                        answer_fields=(self.label_keys[i] if not self.cfg.label_free else [])
                        if split == "train" and self.needs_answer[i] else None,
                        keep_trace=self.cfg.label_free, metric_takes_trace=self.metric_takes_trace,
                        judge_failures=self.cfg.label_free)

        stop_reason = self.evaluator.run(jobs(), self.budget, self._on_result)
        if stop_reason is not None:
            self._stop(stop_reason)
            for candidate, _ in todo:
                key = (split, candidate.id)
                if self._remaining.get(key):
                    if split == "train":
                        candidate.status = "unscored"
                        candidate.reason = f"cut short: {stop_reason}"
                    self._remaining.pop(key)
            self._save()

    def _on_result(self, result: ExampleResult) -> None:
        state = self.state
        candidate = state.candidates[result.candidate_id]
        split = result.split
        self._record_usage("task", result.usage)
        if self._progress is not None:
            self._progress.update(1)
        example = self._examples(split)[result.index]
        if result.outcome == "fatal":
            role, model = self._failing_model(result)
            raise FatalLMError(f"the {role} {model!r} failed in a way no retry can fix on "
                               f"{describe_failure(result, example)}. Check its API key (or environment variable), "
                               "permissions, billing and model name.")
        state.metric_calls += 1  # an evaluation that ran (a fatal one did not)
        if result.outcome == "metric_error":
            raise MetricError(f"the metric failed on {describe_failure(result, example)}. Fix the metric: it must "
                              "return a float in [0, 1], a bool, or dspy.Prediction(score=..., feedback=...).")
        if self.cfg.label_free and candidate.id == START_ID and result.outcome != "infra":
            self._store_anchor(split, result)  # an outage is no trajectory: the start is scored again instead
        if self.journal is not None:
            entry = {"c": result.candidate_id, "d": candidate.md5, "i": result.index, "o": result.outcome,
                     "s": result.score, "e": result.error, "a": result.answer, "split": split,
                     "u": {model: usage.model_dump() for model, usage in result.usage.items()}}
            if self.cfg.label_free and candidate.id == START_ID and result.outcome != "infra":
                entry["t"] = state.anchors[f"{split}:{result.index}"]
            self.journal.append(entry)
        self._store(state, candidate, result, split)
        key = (split, candidate.id)
        self._remaining[key].discard(result.index)
        if result.outcome == "infra":
            self._infra_errors[key].append(result.error or "unknown error")
        if not self._remaining[key]:
            self._remaining.pop(key)
            self._finish(candidate, split)
            self._save()

    def _failing_model(self, result: ExampleResult) -> tuple[str, str]:
        """Which model a fatal error came from: the task model, the label-free judge, or the metric's own LM."""
        if result.stage == "program":
            return "task model", getattr(self.task_lm, "model", repr(self.task_lm))
        if self.cfg.label_free:
            judge = self.judge_lm or self.task_lm
            return "judge model", getattr(judge, "model", repr(judge))
        return "model inside the metric", result.model or "unknown"

    def _record_usage(self, role: Literal["optimizer", "task"], usage: dict[str, ModelUsage]) -> None:
        self.state.usage.record(role, usage)
        roll_up(self.caller_tracker, usage)

    @staticmethod
    def _store(state: RunState, candidate: Candidate, result: ExampleResult, split: str) -> None:
        if result.outcome == "failed":
            _record_error(candidate, result, split)
        if split == "val":
            candidate.val_scores[result.index] = result.score
            return
        candidate.scores[result.index] = result.score
        if result.outcome == "failed" and result.index not in candidate.failed:
            candidate.failed.append(result.index)
        if result.answer is not None:
            candidate.answers[result.index] = result.answer

    def _finish(self, candidate: Candidate, split: str) -> None:
        self._warn_program_errors(candidate, split)
        errors = self._infra_errors.pop((split, candidate.id), [])
        scores = candidate.scores if split == "train" else candidate.val_scores
        complete = all(value is not None for value in scores)
        if split == "val":
            candidate.val_score = _mean(scores) if complete else None
            return
        if not complete:
            candidate.status = "unscored"
            last = errors[-1] if errors else ""
            candidate.reason = f"{LM_FAILURES} on {len(errors)} examples after a retry; last: {last}"
            logger.info("Candidate %d unscored: %s", candidate.id, candidate.reason)
            return
        candidate.status = "scored"
        candidate.score = _mean(scores)
        candidate.failed.sort()

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

    # ------------------------------------------------------------------------------------------------------------
    # Label-free scoring

    def _make_preference_metric(self) -> Any:
        from dspy_opro.labelfree import AnchorPreferenceMetric

        return AnchorPreferenceMetric(judge_lm=self.judge_lm, both_orders=self.cfg.both_orders)

    def _store_anchor(self, split: str, result: ExampleResult) -> None:
        from dspy_opro.labelfree import anchor_text

        self.state.anchors[f"{split}:{result.index}"] = anchor_text(result)
        self._restore_anchors()
        # The anchor against itself is "comparable": preference 0, score 0.5. A run the program failed keeps its
        # outcome, so the error is recorded on the start.
        result.score = 0.5

    def _restore_anchors(self) -> None:
        from dspy_opro.labelfree import example_key

        for key, text in self.state.anchors.items():
            split, index = key.split(":")
            self.metric.anchors[example_key(self._examples(split)[int(index)])] = text

    # ------------------------------------------------------------------------------------------------------------
    # Final selection

    def _select(self) -> None:
        state, cfg = self.state, self.cfg
        best = state.best()
        if best is None:
            raise OPRORunError("no candidate could be scored, not even the program as given; see the run record")
        if cfg.label_free:
            state.selection = selection.label_free_gate(best, *self._label_free_gate_score(best))
        elif cfg.select == "validation" or cfg.val_gate:
            self._score(selection.validation_contenders(state, top_k=cfg.top_k, val_gate=cfg.val_gate), "val")
            state.start_val_score = state.candidates[START_ID].val_score
            state.selection = selection.on_validation(state, best, top_k=cfg.top_k, val_gate=cfg.val_gate,
                                                      min_delta=cfg.min_delta)
        else:
            state.selection = selection.on_training(best)
        if state.status != "stopped":
            state.status = "finished"
        logger.info("OPRO selected candidate %d (%s)", state.selection.candidate_id, state.selection.reason)

    def _label_free_gate_score(self, best: Candidate) -> tuple[float | None, str]:
        """The best candidate's score for the label-free gate: on the valset when there is one."""
        if best.id == START_ID:
            return best.score, "training"
        if not self.valset:
            warnings.warn("label-free OPRO without a valset gates on the training examples, which the search "
                          "already selected on; pass a valset for an unbiased gate", stacklevel=user_stacklevel())
            return best.score, "training"
        self._score([self.state.candidates[START_ID]], "val")  # runs the starting program: the validation anchors
        self._score([best], "val")
        return best.val_score, "validation"

    # ------------------------------------------------------------------------------------------------------------
    # Output

    def _result(self) -> dspy.Module:
        state = self.state
        chosen = state.candidates[state.selection.candidate_id]
        program = with_instructions(self.base, chosen.instructions, instruction_pos=self.cfg.instruction_pos)
        ranked = sorted(state.scored(), key=lambda c: -c.score)
        program.candidate_programs = [
            {"score": c.score,
             "program": with_instructions(self.base, c.instructions, instruction_pos=self.cfg.instruction_pos),
             "instructions": dict(c.instructions), "step": c.step, "val_score": c.val_score}
            for c in ranked
        ]
        program.opro_run = state
        program._compiled = True
        return program

    def _save(self, *, final: bool = False) -> None:
        if not self.cfg.log_dir:
            return
        try:
            save_state(self.state, self.cfg.log_dir)
        except OSError as exc:  # the previous state.json is intact: the write goes to a temporary file first
            full = exc.errno == errno.ENOSPC
            raise LogDirError(
                f"cannot write the run record to {self.cfg.log_dir!r}: {exc.strerror or exc}. What was saved before "
                f"is kept; {'free disk space' if full else 'fix the folder'} and compile again with the same log_dir "
                "to resume."
            ) from exc
        if self.journal is not None:
            self.journal.clear()
        if final:
            try:
                from dspy_opro.report import write_run_report

                write_run_report(self.state, self.cfg.log_dir)
            except Exception as exc:  # a report must never cost the run
                logger.warning("Could not write the run report: %s", exc)

    def _write_step_report(self, step: int) -> None:
        if not self.cfg.log_dir:
            return
        try:
            from dspy_opro.report import write_step_files

            write_step_files(self.state, step, self.cfg.log_dir)
        except Exception as exc:
            logger.warning("Could not write the report of step %d: %s", step, exc)


def _record_error(candidate: Candidate, result: ExampleResult, split: str) -> None:
    """Count one program error on a candidate, keeping the first occurrence of each distinct error."""
    candidate.error_count += 1
    message = result.error or "unknown error"
    for record in candidate.errors:
        if record.error == message and record.split == split:
            record.count += 1
            if result.index < record.example:
                record.example = result.index
            return
    if len(candidate.errors) < MAX_ERROR_KINDS:
        candidate.errors.append(ErrorRecord(error=message, example=result.index, split=split))


__all__ = ["OPRORun"]
