"""Opening, resuming and saving one run's record: when to write, what to replay, when a saved run continues.

:class:`RunRecorder` is the run's only way to the disk (:mod:`dspy_opro.record.files` holds the files). Without a
``log_dir`` it keeps nothing and every call is a no-op. With one, :meth:`RunRecorder.open` returns the run record:

* a finished run is returned as it is, without taking the lock, so a read-only folder still gives its result;
* otherwise the folder must be writable, the lock is taken (a second process is refused at once), the saved record
  is read again under the lock, checked against this compile's fingerprint, and the journal is replayed into it;
* a run stopped by its budget continues when the budget now allows more, a finished run continues from its last
  step when ``num_steps`` grew, a failed or interrupted run continues where it was, and candidates an outage left
  unscored (:func:`infrastructure_unscored`) are tried again, a finished run's too (its result is then selected
  anew);
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
from pathlib import Path

from dspy_opro.errors import LogDirError, StateFileError, describe_exception
from dspy_opro.record.files import (
    PROGRESS_FILE,
    REPLY_KIND,
    STATE_FILE,
    LogDirLock,
    ProgressJournal,
    ReplyEntry,
    check_fingerprint,
    check_log_dir_is_folder,
    check_log_dir_writable,
    journal_entry,
    load_state,
    reply_entry,
    save_state,
)
from dspy_opro.record.state import (
    Candidate,
    CandidateStatus,
    Fingerprint,
    ModelUsage,
    ReceivedReplies,
    RunState,
    budget_spent,
    no_scores,
    record_result,
)

logger = logging.getLogger(__name__)


def meta_prompt_md5(meta_prompt: str) -> str:
    """The digest that ties a journaled optimizer reply to the meta-prompt it answered."""
    return hashlib.md5(meta_prompt.encode("utf-8", "surrogatepass")).hexdigest()


def infrastructure_unscored(candidate: Candidate) -> bool:
    """Whether infrastructure failures (an outage, a timeout) left ``candidate`` unscored: compiling again with
    the same ``log_dir`` scores exactly these candidates, once the provider is back."""
    return candidate.status == CandidateStatus.UNSCORED  # the one status infrastructure failures leave


class RunRecorder:
    """The run record's persistence for one compile (a no-op without ``log_dir``).

    Args:
        log_dir: The run's folder, or None.
        num_steps: The run's steps (a finished run with fewer continues).
        max_metric_calls: The evaluation budget (a run it stopped continues when it grew).
        max_cost: The cost budget (likewise).
    """

    def __init__(self, log_dir: str | None, *, num_steps: int, max_metric_calls: int | None,
                 max_cost: float | None):
        self.num_steps, self.max_metric_calls, self.max_cost = num_steps, max_metric_calls, max_cost
        self.log_dir = log_dir
        self._lock = LogDirLock(self.log_dir) if self.log_dir else None
        self._journal = ProgressJournal(self.log_dir) if self.log_dir else None
        # Replies journaled for a step the record does not hold yet: a snapshot taken before the step is recorded
        # (Ctrl-C or an error during its optimizer calls) keeps them in the journal it starts afresh.
        self._unrecorded_replies: list[tuple[int, dict[str, object]]] = []
        if self.log_dir:
            check_log_dir_is_folder(self.log_dir)

    # ------------------------------------------------------------------------------------------------------------
    # Opening

    def open(self, fingerprint: Fingerprint) -> RunState | None:
        """The saved run record (checked, replayed, reopened as the settings allow), or None for a new run.

        With a ``log_dir`` and no saved record, the lock is held for the new run all the same.
        """
        if not self.log_dir:
            return None
        saved = load_state(self.log_dir)
        if (saved is not None and saved.selection is not None and not self._wants_more_steps(saved)
                and not self._retries_outage(saved)):
            # A finished run: its result needs no lock, so a read-only log_dir still returns it.
            check_fingerprint(saved, fingerprint, self.log_dir)
            if not self._budget_allows_more(saved):
                self._lock = None
                return saved
        try:
            check_log_dir_writable(self.log_dir)
        except LogDirError:
            if saved is None or saved.selection is None or self._wants_more_steps(saved) \
                    or self._budget_allows_more(saved):
                raise
            # A finished run with candidates an outage left unscored, in a folder that cannot be written: its
            # result as it is, rather than no result.
            check_fingerprint(saved, fingerprint, self.log_dir)
            logger.warning("The saved run has candidates an outage left unscored, but %s cannot be written; "
                           "returning its result without scoring them", self.log_dir)
            self._lock = None
            return saved
        assert self._lock is not None
        self._lock.acquire()
        try:
            saved = load_state(self.log_dir)  # read again under the lock: another run may have just written it
            if saved is None:
                return None
            check_fingerprint(saved, fingerprint, self.log_dir)
            self._replay_journal(saved)
            logger.info("Resuming the OPRO run in %s: %d candidates, %d steps recorded", self.log_dir,
                        len(saved.candidates), len(saved.steps))
            self._reopen(saved)
            return saved
        except BaseException:
            self.close()
            raise

    def _replay_journal(self, state: RunState) -> None:
        """Apply evaluations that finished after the last snapshot of ``state.json``, with what they cost.

        Every entry (:func:`~dspy_opro.record.files.journal_entry`, checked as it is read) counts once: its usage
        and its evaluation are added, and its score goes onto the candidate with the same instruction digest,
        whatever that candidate's saved status (a candidate reopened by a larger budget or after an outage is
        scored again only where it has no score). An entry numbered at or below the snapshot's count of
        evaluations is already in it (a crash between writing the snapshot and clearing the journal leaves such
        entries); a score that contradicts the record is a :class:`StateFileError`.
        """
        assert self.log_dir is not None
        path = Path(self.log_dir) / PROGRESS_FILE
        for line, raw in ProgressJournal.read_numbered(self.log_dir):
            if raw.get("k") == REPLY_KIND:
                self._replay_reply(reply_entry(raw, state, path=path, line=line), state)
                continue
            entry = journal_entry(raw, state, path=path, line=line)
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
            already = entry.count is not None and entry.count <= state.metric_calls
            if already or (entry.count is None and saved is not None):
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

    @staticmethod
    def _replay_reply(entry: ReplyEntry, state: RunState) -> None:
        """Keep a journaled optimizer reply for its step (``state.received_replies``) and count its usage, once.

        A reply of a step the record holds, or of a sample already kept, is in the snapshot already (a crash
        between writing the snapshot and clearing the journal leaves such entries). Replies to another meta-prompt
        than the kept ones (a later attempt at the step) replace them.
        """
        if entry.step < len(state.steps):
            return
        kept = state.received_replies
        if kept is None or kept.step != entry.step or kept.meta_prompt_md5 != entry.meta_prompt_md5:
            kept = state.received_replies = ReceivedReplies(step=entry.step, meta_prompt_md5=entry.meta_prompt_md5)
        if entry.sample in kept.replies:
            return
        for offset, text in enumerate(entry.replies):
            kept.replies[entry.sample + offset] = text
        state.usage.record("optimizer", entry.usage)

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
        return state.status == "finished" and any(infrastructure_unscored(c) for c in state.candidates)

    def _wants_more_steps(self, state: RunState) -> bool:
        return self.num_steps > len(state.steps) and state.status != "stopped"

    def _budget_allows_more(self, state: RunState) -> bool:
        """Whether a run its budget stopped continues now: the budget allows more than it had."""
        if state.status != "stopped":
            return False
        return budget_spent(state, max_metric_calls=self.max_metric_calls, max_cost=self.max_cost) is None

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
            unscored = [c.id for c in state.candidates if infrastructure_unscored(c)]
            logger.info("The saved run finished with candidates %s unscored (infrastructure); they are scored again "
                        "and the result selected anew", unscored)
            state.status, state.stop_reason, state.selection = "running", None, None
        if state.status in ("failed", "interrupted") and state.selection is None:
            logger.info("The saved run was %s (%s); it continues", state.status, state.stop_reason)
            state.status, state.stop_reason = "running", None
        if state.selection is None:  # candidates an outage left unscored are tried again
            for candidate in state.candidates:
                if infrastructure_unscored(candidate):
                    candidate.status, candidate.reason = CandidateStatus.PENDING, None

    # ------------------------------------------------------------------------------------------------------------
    # Writing

    def journal(self, candidate: Candidate, *, index: int, split: str, outcome: str, score: float | None,
                error: str | None, answer: str | None, usage: dict[str, ModelUsage], anchor: str | None,
                count: int | None = None) -> None:
        """Journal one finished evaluation: the candidate's instruction digest, the outcome and what it cost.

        ``count`` is the run's count of evaluations with this one (``metric_calls``): on resume it tells the
        entries a snapshot already holds from the ones it does not.
        """
        if self._journal is None:
            return
        entry: dict[str, object] = {
            "c": candidate.id, "d": candidate.md5, "i": index, "o": outcome, "s": score, "e": error, "a": answer,
            "split": split, "u": {model: value.model_dump() for model, value in usage.items()}}
        if count is not None:
            entry["m"] = count
        if anchor is not None:
            entry["t"] = anchor
        try:
            self._journal.append(entry)
        except OSError as exc:  # a full disk: the run stops, and end() saves state.json if it still can
            raise self._write_error(exc) from exc

    def reply_log(self, step: int, meta_prompt: str) -> StepReplyJournal | None:
        """What journals ``step``'s optimizer replies as they arrive (None without a ``log_dir``)."""
        if self._journal is None:
            return None
        return StepReplyJournal(self, step=step, meta_prompt_md5=meta_prompt_md5(meta_prompt))

    def journal_replies(self, *, step: int, sample: int, meta_prompt_md5: str, replies: list[str],
                        usage: dict[str, ModelUsage]) -> None:
        """Journal one optimizer request's replies (its choices, from ``sample`` on) with what the request cost."""
        if self._journal is None:
            return
        entry: dict[str, object] = {
            "k": REPLY_KIND, "step": step, "n": sample, "d": meta_prompt_md5, "r": replies,
            "u": {model: value.model_dump() for model, value in usage.items()}}
        try:
            self._journal.append(entry)
        except OSError as exc:  # a full disk: the run stops, and end() saves state.json if it still can
            raise self._write_error(exc) from exc
        self._unrecorded_replies.append((step, entry))

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
            try:
                from dspy_opro.record.report import write_run_report  # matplotlib, when drawn, only here

                write_run_report(state, self.log_dir)
            except Exception as exc:  # a report must never cost the run
                logger.warning("Could not write the run report: %s", exc)

    def _write_error(self, exc: OSError) -> LogDirError:
        full = exc.errno == errno.ENOSPC
        return LogDirError(
            f"cannot write the run record to {self.log_dir!r}: {exc.strerror or exc}. What was saved before is kept; "
            f"{'free disk space' if full else 'fix the folder'} and compile again with the same log_dir to resume.")

    def write_step_report(self, state: RunState, step: int) -> None:
        """``steps/NNN/``: the exact meta-prompt, the replies and the step's report."""
        if not self.log_dir:
            return
        try:
            from dspy_opro.record.report import write_step_files

            write_step_files(state, step, self.log_dir)
        except Exception as exc:  # a report must never cost the run
            logger.warning("Could not write the report of step %d: %s", step, exc)

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
        """Close the journal and release the lock."""
        if self._journal is not None:
            self._journal.close()
        if self._lock is not None:
            self._lock.release()


class StepReplyJournal:
    """Journals one step's optimizer replies as they arrive (the ``reply_log`` that ``propose`` takes).

    Args:
        recorder: The run's recorder.
        step: The step being asked.
        meta_prompt_md5: The digest of its meta-prompt (:func:`meta_prompt_md5`).
    """

    def __init__(self, recorder: RunRecorder, *, step: int, meta_prompt_md5: str):
        self.recorder, self.step, self.meta_prompt_md5 = recorder, step, meta_prompt_md5

    def record(self, sample: int, replies: list[str], usage: dict[str, ModelUsage]) -> None:
        self.recorder.journal_replies(step=self.step, sample=sample, meta_prompt_md5=self.meta_prompt_md5,
                                      replies=replies, usage=usage)


__all__ = ["RunRecorder", "StepReplyJournal", "infrastructure_unscored", "meta_prompt_md5"]
