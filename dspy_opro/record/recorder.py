"""Opening, resuming and saving one run's record: when to write, what to replay, when a saved run continues.

:class:`RunRecorder` is the run's only way to the disk (:mod:`dspy_opro.record.files` holds the files). Without a
``log_dir`` it keeps nothing and every call is a no-op. With one, :meth:`RunRecorder.open` returns the run record:

* a finished run is returned as it is, without taking the lock, so a read-only folder still gives its result;
* otherwise the folder must be writable, the lock is taken (a second process is refused at once), the saved record
  is read again under the lock, checked against this compile's fingerprint, and the journal is replayed into it;
* a run stopped by its budget continues when the budget now allows more, a finished run continues from its last
  step when ``num_steps`` grew, a failed or interrupted run continues where it was, and candidates an outage left
  unscored (status ``unscored``, the one status infrastructure failures leave) are tried again, a finished run's too
  (its result is then selected anew);
* without a saved record, a new one is made.

Every finished evaluation is journaled with what it cost and the run's count of evaluations (:meth:`journal`), and
every snapshot clears the journal. On resume every journal line is checked, then replayed onto its candidate by
instruction digest and example whatever the candidate's saved status, and counted once. Each optimizer reply is
journaled as it arrives too (:meth:`reply_log`): a step whose optimizer calls a kill interrupted gets its received
replies back (:attr:`RunState.received_replies`, :meth:`received_replies`), counted once, and asks only for the rest.
:meth:`end` marks a run that an exception or Ctrl-C ended, saves it with its report and says how to resume.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from dspy_opro.errors import LogDirError, StateFileError, describe_exception
from dspy_opro.record import files
from dspy_opro.record.files import PROGRESS_FILE, STATE_FILE, save_state
from dspy_opro.state import (
    CandidateStatus,
    ReceivedReplies,
    budget_spent,
    forget_metric_errors,
    no_scores,
    record_result,
    validation_incomplete,
)

if TYPE_CHECKING:
    from dspy_opro.state import Candidate, Fingerprint, ModelUsage, RunState

logger = logging.getLogger(__name__)


def meta_prompt_md5(meta_prompt: str) -> str:
    """The digest that ties a journaled optimizer reply to the meta-prompt it answered."""
    return hashlib.md5(meta_prompt.encode("utf-8", "surrogatepass")).hexdigest()


class RunRecorder:
    """The run record's persistence for one compile (a no-op without ``log_dir``, the run's folder)."""

    def __init__(self, log_dir: str | None, *, num_steps: int, max_metric_calls: int | None,
                 max_cost: float | None):
        self.num_steps, self.max_metric_calls, self.max_cost = num_steps, max_metric_calls, max_cost
        self.log_dir = log_dir
        self._lock = files.LogDirLock(log_dir) if log_dir else None
        self._journal = files.ProgressJournal(log_dir) if log_dir else None
        # Replies journaled for a step the record does not hold yet: a snapshot taken before the step is recorded
        # (Ctrl-C or an error during its optimizer calls) keeps them in the journal it starts afresh.
        self._unrecorded_replies: list[tuple[int, dict[str, object]]] = []
        if log_dir:
            files.check_log_dir_is_folder(log_dir)

    def open(self, fingerprint: Fingerprint) -> RunState | None:
        """The saved run record (checked, replayed, reopened as the settings allow), or None for a new run.

        With a ``log_dir`` and no saved record, the lock is held for the new run all the same.
        """
        if not self.log_dir:
            return None
        saved = files.load_state(self.log_dir)
        finished = saved is not None and saved.selection is not None and not self._wants_more_steps(saved)
        if saved is not None and finished and not self._retries_outage(saved) \
                and not self._metric_fixed(saved, fingerprint):
            # A finished run: its result needs no lock, so a read-only log_dir still returns it.
            files.check_fingerprint(saved, fingerprint, self.log_dir)
            if not self._budget_allows_more(saved):
                if saved.fingerprint.settings.get("metric") != fingerprint.settings.get("metric"):
                    logger.warning("The metric changed since the saved run (%s -> %s): none of its evaluations "
                                   "raised in the metric, so the finished run's result is returned as the old metric "
                                   "scored it (a new log_dir scores everything with the new one)",
                                   saved.fingerprint.settings.get("metric"), fingerprint.settings.get("metric"))
                self._lock = None
                return saved
        try:
            files.check_log_dir_writable(self.log_dir)
        except LogDirError:
            if saved is None or not finished or self._budget_allows_more(saved):
                raise
            # A finished run with candidates an outage left unscored, in a folder that cannot be written: its
            # result as it is, rather than no result.
            files.check_fingerprint(saved, fingerprint, self.log_dir)
            logger.warning("The saved run has candidates an outage left unscored, but %s cannot be written; "
                           "returning its result without scoring them", self.log_dir)
            self._lock = None
            return saved
        assert self._lock is not None
        self._lock.acquire()
        try:
            saved = files.load_state(self.log_dir)  # read again under the lock: another run may have just written it
            if saved is None:
                return None
            files.check_fingerprint(saved, fingerprint, self.log_dir)
            self._replay_journal(saved)
            logger.info("Resuming the OPRO run in %s: %d candidates, %d steps recorded", self.log_dir,
                        len(saved.candidates), len(saved.steps))
            self._take_fixed_metric(saved, fingerprint)
            self._reopen(saved)
            return saved
        except BaseException:
            self.close()
            raise

    def _replay_journal(self, state: RunState) -> None:
        """Apply what finished after the last snapshot of ``state.json`` (the module docstring says how), once.

        A candidate reopened by a larger budget or after an outage takes a journaled score only where it has none;
        an evaluation numbered at or below the snapshot's count of evaluations, a reply of a step the record holds
        or of a sample already kept, is in the snapshot already (a crash between writing it and clearing the journal
        leaves such lines). Replies to another meta-prompt than the kept ones (a later attempt at the step) replace
        them; a score that contradicts the record is a :class:`StateFileError`.
        """
        assert self.log_dir is not None
        path = Path(self.log_dir) / PROGRESS_FILE
        for line, raw in files.ProgressJournal.read_numbered(self.log_dir):
            if raw.get("k") == files.REPLY_KIND:
                reply, kept = files.reply_entry(raw, state, path=path, line=line), state.received_replies
                if reply.step < len(state.steps):
                    continue  # the record holds its step
                if kept is None or kept.step != reply.step or kept.meta_prompt_md5 != reply.meta_prompt_md5:
                    kept = state.received_replies = ReceivedReplies(step=reply.step,
                                                                    meta_prompt_md5=reply.meta_prompt_md5)
                if reply.sample not in kept.replies:
                    kept.replies.update({reply.sample + offset: text for offset, text in enumerate(reply.replies)})
                    state.usage.record("optimizer", reply.usage)
                continue
            entry = files.journal_entry(raw, state, path=path, line=line)
            if entry is None:
                continue  # another instruction under this candidate's number: not this run's evaluation
            candidate = state.candidates[entry.candidate]
            scores = candidate.scores if entry.split == "train" else (candidate.val_scores or [])
            saved = scores[entry.index] if scores else None
            if saved is not None and entry.score is not None and saved != entry.score:
                raise StateFileError(
                    f"{path}, line {line}: candidate {candidate.id}, field s (score) of {entry.split} example "
                    f"{entry.index} is {entry.score}, but {STATE_FILE} records {saved}. The journal does not belong "
                    f"to this record: delete {PROGRESS_FILE} (its evaluations are run again) and compile again.")
            if (entry.count is not None and entry.count <= state.metric_calls) or (entry.count is None
                                                                                   and saved is not None):
                continue  # in the snapshot already
            if entry.split == "val" and candidate.val_scores is None:
                candidate.val_scores = no_scores(state.val_size)
            if entry.score is not None and saved is None:
                record_result(candidate, index=entry.index, split=entry.split, outcome=entry.outcome,
                              score=entry.score, error=entry.error, answer=entry.answer)
            if entry.anchor is not None:
                state.anchors[f"{entry.split}:{entry.index}"] = entry.anchor
            state.usage.record("task", entry.usage)
            state.metric_calls = max(state.metric_calls + 1, entry.count or 0)

    def received_replies(self, state: RunState, step: int, meta_prompt: str) -> dict[int, str]:
        """The replies a killed run received for ``step``'s ``meta_prompt``, by sample (empty when none).

        Replies to another meta-prompt are ignored, with a WARNING: they are not samples of this one, so the step
        asks for all its proposals (their cost stays counted: it was paid).
        """
        kept = state.received_replies
        if kept is None or kept.step != step:
            return {}
        if kept.meta_prompt_md5 != meta_prompt_md5(meta_prompt):
            logger.warning("Step %d: the %d optimizer replies received before the run was killed answered another "
                           "meta-prompt (the record changed since); they are not used, and the step asks for all its "
                           "proposals again", step, len(kept.replies))
            return {}
        logger.info("Step %d: %d optimizer replies received before the run was killed are used; asking for the rest",
                    step, len(kept.replies))
        return dict(kept.replies)

    @staticmethod
    def keep_replies(state: RunState, step: int, meta_prompt: str, replies: dict[int, str]) -> None:
        """Keep ``step``'s replies, whose usage the run has just counted, in the record until the step is recorded
        (:meth:`save` then drops them): a snapshot taken in between holds them with their usage, and the journal's
        copies of them are not counted again."""
        state.received_replies = ReceivedReplies(step=step, meta_prompt_md5=meta_prompt_md5(meta_prompt),
                                                 replies=dict(replies))

    @staticmethod
    def _retries_outage(state: RunState) -> bool:
        """Whether a finished run is opened again to score the candidates an outage left unscored."""
        return state.status == "finished" and (any(c.status == CandidateStatus.UNSCORED for c in state.candidates)
                                               or validation_incomplete(state))

    def _wants_more_steps(self, state: RunState) -> bool:
        return self.num_steps > len(state.steps) and state.status != "stopped"

    def _budget_allows_more(self, state: RunState) -> bool:
        """Whether a run its budget stopped continues now: the budget allows more than it had."""
        return state.status == "stopped" and budget_spent(state, max_metric_calls=self.max_metric_calls,
                                                          max_cost=self.max_cost) is None

    @staticmethod
    def _metric_fixed(state: RunState, fingerprint: Fingerprint) -> bool:
        """Whether the metric's body changed since the saved run (same name: the fingerprints agree) and some of
        the saved evaluations raised in it."""
        return (state.fingerprint.settings.get("metric") != fingerprint.settings.get("metric")
                and any(candidate.metric_errors for candidate in state.candidates))

    def _take_fixed_metric(self, state: RunState, fingerprint: Fingerprint) -> None:
        """A metric edited since the saved run: the evaluations it failed are run again with it, the rest kept; the
        record names the new metric from now on (and is saved at once, so the journal holds no stale score)."""
        old, new = state.fingerprint.settings.get("metric"), fingerprint.settings.get("metric")
        if old == new:
            return
        cleared = sum(forget_metric_errors(candidate) for candidate in state.candidates)
        state.fingerprint = fingerprint
        state.config["metric"] = new
        kept = sum(score is not None for candidate in state.candidates
                   for score in candidate.scores + (candidate.val_scores or []))
        logger.warning("The metric changed since the saved run (%s -> %s): its %d evaluations that raised in the "
                       "metric are run again with it; the %d other scores are kept, as the old metric gave them (a "
                       "new log_dir scores everything with the new one)", old, new, cleared, kept)
        if cleared:
            state.tolerated_errors = max(state.tolerated_errors - cleared, 0)
            if state.selection is not None:
                state.status, state.stop_reason, state.selection = "running", None, None
        self.save(state)

    def _reopen(self, state: RunState) -> None:
        """Let a saved run continue where the settings now allow it."""
        if self._budget_allows_more(state):
            logger.info("The saved run stopped (%s); the budget now allows more, so it continues", state.stop_reason)
            state.status, state.stop_reason, state.selection = "running", None, None
            for candidate in state.candidates:
                if candidate.status == CandidateStatus.CUT_SHORT:
                    candidate.status, candidate.reason = CandidateStatus.PENDING, None
        if state.selection is not None and self._wants_more_steps(state):
            logger.info("The saved run finished after %d steps; num_steps=%d continues it", len(state.steps),
                        self.num_steps)
            state.status, state.selection = "running", None
            state.config["num_steps"] = self.num_steps
        if state.selection is not None and self._retries_outage(state):
            logger.info("The saved run finished with candidates %s unscored (infrastructure); they are scored again "
                        "and the result selected anew",
                        [c.id for c in state.candidates if c.status == CandidateStatus.UNSCORED])
            state.status, state.stop_reason, state.selection = "running", None, None
        if state.status in ("failed", "interrupted") and state.selection is None:
            logger.info("The saved run was %s (%s); it continues", state.status, state.stop_reason)
            state.status, state.stop_reason = "running", None
        if state.selection is None:  # candidates an outage left unscored are tried again
            for candidate in state.candidates:
                if candidate.status == CandidateStatus.UNSCORED:
                    candidate.status, candidate.reason = CandidateStatus.PENDING, None

    def journal(self, candidate: Candidate, *, index: int, split: str, outcome: str, score: float | None,
                error: str | None, answer: str | None, usage: dict[str, ModelUsage], anchor: str | None,
                count: int | None = None) -> None:
        """Journal one finished evaluation: the candidate's instruction digest, the outcome and what it cost, and
        ``count``, the run's count of evaluations with it (on resume it tells the entries a snapshot holds)."""
        entry: dict[str, object] = {
            "c": candidate.id, "d": candidate.md5, "i": index, "o": outcome, "s": score, "e": error, "a": answer,
            "split": split, "u": {model: value.model_dump() for model, value in usage.items()}}
        self._append(entry | {key: value for key, value in (("m", count), ("t", anchor)) if value is not None})

    def reply_log(self, step: int, meta_prompt: str) -> Callable[[int, list[str], dict[str, ModelUsage]], None] | None:
        """What journals ``step``'s optimizer replies as each request returns: ``(sample, replies, usage)`` (None
        without a ``log_dir``)."""
        if self._journal is None:
            return None
        md5 = meta_prompt_md5(meta_prompt)
        return lambda sample, replies, usage: self.journal_replies(step=step, sample=sample, meta_prompt_md5=md5,
                                                                   replies=replies, usage=usage)

    def journal_replies(self, *, step: int, sample: int, meta_prompt_md5: str, replies: list[str],
                        usage: dict[str, ModelUsage]) -> None:
        """Journal one optimizer request's replies (its choices, from ``sample`` on) with what the request cost."""
        entry: dict[str, object] = {"k": files.REPLY_KIND, "step": step, "n": sample, "d": meta_prompt_md5,
                                    "r": replies, "u": {model: value.model_dump() for model, value in usage.items()}}
        if self._append(entry):
            self._unrecorded_replies.append((step, entry))

    def _append(self, entry: dict[str, object]) -> bool:
        """Append a journal line (False without a ``log_dir``); a full disk stops the run, which :meth:`end` saves."""
        if self._journal is None:
            return False
        try:
            self._journal.append(entry)
        except OSError as exc:
            raise self._write_error(exc) from exc
        return True

    def save_first(self, state: RunState) -> None:
        """The first snapshot, before anything is paid for: the journal entries of step -1 need it."""
        if self.log_dir and not (Path(self.log_dir) / STATE_FILE).exists():
            self.save(state)

    def save(self, state: RunState, *, final: bool = False) -> None:
        """Write ``state.json`` (and, when ``final``, ``report.md`` and the plot); the journal starts afresh, with
        the replies journaled for a step the record does not hold yet."""
        if state.received_replies is not None and state.received_replies.step < len(state.steps):
            state.received_replies = None  # the step's record holds them
        if not self.log_dir:
            return
        try:
            save_state(state, self.log_dir)
            if self._journal is not None:
                self._journal.clear()
                self._unrecorded_replies = [(step, entry) for step, entry in self._unrecorded_replies
                                            if step >= len(state.steps)]
                for _, entry in self._unrecorded_replies:
                    self._journal.append(entry)
        except OSError as exc:  # the previous state.json is intact: the write goes to a temporary file first
            raise self._write_error(exc) from exc
        if final:
            self._report(lambda report: report.write_run_report(state, self.log_dir), "the run report")

    def _write_error(self, exc: OSError) -> LogDirError:
        return LogDirError(
            f"cannot write the run record to {self.log_dir!r}: {exc.strerror or exc}. What was saved before is kept; "
            f"{'free disk space' if exc.errno == errno.ENOSPC else 'fix the folder'} and compile again with the same "
            "log_dir to resume.")

    def write_step_report(self, state: RunState, step: int) -> None:
        """``steps/NNN/``: the exact meta-prompt, the replies and the step's report."""
        if self.log_dir:
            self._report(lambda report: report.write_step_files(state, step, self.log_dir),
                         f"the report of step {step}")

    @staticmethod
    def _report(write: Callable[..., object], what: str) -> None:
        try:
            from dspy_opro.record import report  # matplotlib, when drawn, only here

            write(report)
        except Exception as exc:  # a report must never cost the run
            logger.warning("Could not write %s: %s", what, exc)

    def end(self, state: RunState, exc: BaseException) -> None:
        """Mark the record ``interrupted`` or ``failed``, save it with ``report.md``, and say how to resume."""
        interrupted = isinstance(exc, KeyboardInterrupt)
        state.status = "interrupted" if interrupted else "failed"
        state.stop_reason = "interrupted by the user (KeyboardInterrupt)" if interrupted else describe_exception(exc)
        reason = state.stop_reason.rstrip(".")
        if not self.log_dir:
            logger.error("OPRO run %s: %s. No log_dir was set, so nothing was saved; pass log_dir=... to be able "
                         "to resume.", state.status, reason)
            return
        where = os.path.abspath(self.log_dir)
        try:
            self.save(state, final=True)
        except Exception as save_exc:  # never hide the original error behind a failed save
            logger.error("Could not save the run record: %s", save_exc)
            logger.error("OPRO run %s: %s. The run record in %s holds what was saved before; compile again with the "
                         "same log_dir to resume from there.", state.status, reason, where)
            return
        logger.error("OPRO run %s: %s. The run record is in %s (report.md shows it); compile again with the same "
                     "log_dir to resume.", state.status, reason, where)

    def close(self) -> None:
        """Close the journal and release the lock, whatever the closing raises (a full disk: a
        :class:`~dspy_opro.errors.LogDirError`), so that the next compile on this folder can take it."""
        try:
            if self._journal is not None:
                self._journal.close()
        except OSError as exc:  # the buffered end of the journal could not be written
            raise self._write_error(exc) from exc
        finally:
            if self._lock is not None:
                self._lock.release()
