"""The files of a run record: ``state.json``, the journal and the lock.

With a ``log_dir``, the run record (:class:`dspy_opro.state.RunState`) is kept on disk so that a crash at any
moment loses nothing paid for (:mod:`dspy_opro.record.recorder` decides when to write and how to resume):

* ``state.json`` is written atomically (temporary file, fsync, rename) before step -1's first evaluation, after
  each step's optimizer calls, after each step and at the end (the journal holds the evaluations in between); a
  damaged file is reported as corrupt (:class:`StateFileError`), never taken for a fresh start;
* ``progress.jsonl`` journals every finished evaluation between two snapshots, with the candidate's instruction
  digest and the usage it cost; on resume the entries are replayed into the snapshot (an entry whose digest does
  not match its candidate is ignored), so a SIGKILL repeats at most the evaluations in flight; it also journals
  each optimizer reply as it arrives (:func:`reply_entry`), with the step, the sample, the meta-prompt's digest
  and its usage, so a kill during a step's optimizer calls does not buy (and sample) the received replies again;
* ``run.lock`` (an OS lock) admits one run per ``log_dir``: a second process is refused at once.

A different configuration, dataset or program is refused by :func:`check_fingerprint`, naming what differs.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from pydantic import ValidationError

from dspy_opro.errors import LogDirError, RunInProgressError, StateFileError
from dspy_opro.state import (
    SCHEMA_VERSION,
    CandidateStatus,
    Fingerprint,
    ModelUsage,
    RunState,
    config_digest,
    metric_name,
)

STATE_FILE = "state.json"
PROGRESS_FILE = "progress.jsonl"
LOCK_FILE = "run.lock"
OUTCOMES = ("ok", "failed", "infra")  # the outcomes a journal entry records (fatal and metric errors stop the run)
REPLY_KIND = "reply"  # the "k" of a journaled optimizer reply (an evaluation's entry has no "k")
_FRESH = "Restore it from a backup, or delete the log_dir to start a fresh run."


def check_log_dir_is_folder(log_dir: str) -> None:
    """Refuse a ``log_dir`` that is a file, or whose ``run.lock`` is not a file, before any LM call."""
    path = Path(log_dir)
    if path.exists() and not path.is_dir():
        raise LogDirError(f"log_dir {str(path)!r} is a file, not a folder. Pass the path of a folder (it is created "
                          "if missing), or move the file away.")
    lock = path / LOCK_FILE
    if lock.exists() and not lock.is_file():
        raise LogDirError(f"{str(lock)!r} is not a file, so the run cannot take its lock there. Remove it (the run "
                          "creates the file), or choose another log_dir.")


def check_log_dir_writable(log_dir: str) -> None:
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


def save_state(state: RunState, log_dir: str | os.PathLike[str]) -> Path:
    """Write ``state.json`` atomically: a temporary file in the same folder, fsync, rename, fsync the folder."""
    folder = Path(log_dir)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / STATE_FILE
    payload = state.model_dump_json()
    # A new file, created with mode 0666 less the umask as every other file the run writes (``mkstemp`` would make
    # it 0600; reading the umask would change it, process-wide, for a moment).
    tmp = str(folder / f".state-{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:
        dir_fd = os.open(folder, os.O_RDONLY)
    except OSError:  # platforms without directory handles
        return target
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return target


def load_state(log_dir: str | os.PathLike[str]) -> RunState | None:
    """Read ``state.json`` from ``log_dir`` (None when absent); a corrupt file is an error, never a fresh start."""
    path = Path(log_dir) / STATE_FILE
    if not path.exists():
        return None
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise StateFileError(f"cannot read {path}: {exc}. Fix its permissions or choose another log_dir.") from exc
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StateFileError(f"{path} is corrupt ({exc}); it is not valid JSON. {_FRESH}") from exc
    if not isinstance(data, dict):
        raise StateFileError(f"{path} is corrupt: it holds JSON but not an OPRO run record. {_FRESH}")
    version = data.get("schema_version")
    if version == 1:  # dspy-opro 0.2's record
        data, version = _migrated_from_0_2(data, path), SCHEMA_VERSION
    if version != SCHEMA_VERSION:
        raise StateFileError(f"{path} has schema version {version!r}; this dspy-opro reads version {SCHEMA_VERSION}. "
                             "Use the dspy-opro version that wrote it, or choose another log_dir.")
    try:
        state = RunState.model_validate(data)
    except ValidationError as exc:
        raise StateFileError(f"{path} does not hold a valid OPRO run record: {exc}") from exc
    check_record(state, path)
    return state


def _migrated_from_0_2(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """A record of dspy-opro 0.2 (schema 1) as 0.3 writes it, so that a killed 0.2 run resumes and a finished one
    returns its result: a candidate a budget stopped (``unscored``, reason "cut short ...") is ``cut_short``; the
    settings 0.3 folded into option values (``racing_alpha``, ``diversity_theta``, ``min_delta``, ``both_orders``)
    are folded the same way. Label-free OPRO of 0.2 (``metric=None``) is refused: 0.3's metric is another one."""
    for candidate in data.get("candidates") or []:
        if (isinstance(candidate, dict) and candidate.get("status") == "unscored"
                and str(candidate.get("reason") or "").startswith("cut short")):
            candidate["status"] = "cut_short"
    fingerprint = data.get("fingerprint")
    for settings in (fingerprint.get("settings") if isinstance(fingerprint, dict) else None, data.get("config")):
        if not isinstance(settings, dict):
            continue
        if settings.get("label_free"):
            raise StateFileError(
                f"{path} was written by dspy-opro 0.2 for label-free OPRO (metric=None with judge_model), which 0.3 "
                "runs with another metric, metric=dspy_opro.PairwisePreference(judge_model=...): its scores cannot "
                "be resumed. Compile with a new log_dir (the 0.2 record stays readable by `python -m dspy_opro "
                "report`).")
        alpha, theta = settings.pop("racing_alpha", 0.05), settings.pop("diversity_theta", 0.7)
        min_delta = settings.pop("min_delta", 0.0)
        settings.pop("both_orders", None)  # a label-free setting: a run with labels never used it
        if settings.get("racing") is True:
            settings["racing"] = {"alpha": alpha}
        if settings.get("exemplar_selection") == "hard_diverse":
            settings["exemplar_selection"] = {"hard_diverse": {"theta": theta}}
        if settings.get("val_gate") is True:
            settings["val_gate"] = {"min_delta": min_delta}
    return {**data, "schema_version": SCHEMA_VERSION}


def _bad_score(value: Any) -> bool:
    return value is not None and (math.isnan(value) or not 0.0 <= value <= 1.0)


def check_record(state: RunState, path: str | os.PathLike[str]) -> None:
    """Refuse a record that cannot be right: a candidate whose ``id`` is not its position, a reply or the selection
    naming a candidate the record does not hold, a new candidate whose instruction is not its reply's (swapped
    candidates), a score outside [0, 1] (or NaN), a score list whose length is not its split's size, a mean outside
    [0, 1]; the error names the file, the candidate and the field."""
    def refuse(candidate: int | str, field: str, problem: str) -> StateFileError:
        return StateFileError(f"{path}: candidate {candidate}, field {field}: {problem}. The record was changed "
                              "outside dspy-opro: restore it from a backup, or delete the log_dir to start afresh.")

    count = len(state.candidates)
    for position, candidate in enumerate(state.candidates):
        if candidate.id != position:
            raise refuse(position, "id", f"{candidate.id} is not its position {position} in candidates")
    for step in state.steps:
        for reply in step.replies:
            if reply.candidate_id is None:
                continue
            if not 0 <= reply.candidate_id < count:
                raise refuse(reply.candidate_id, f"steps[{step.step}].replies candidate_id",
                             f"the record has candidates 0 to {count - 1}")
            candidate = state.candidates[reply.candidate_id]
            if reply.fate in ("new", "unclosed") and reply.instruction is not None and \
                    candidate.instruction != reply.instruction:
                raise refuse(candidate.id, "instruction", f"{_shown(candidate.instruction)} is not the instruction "
                             f"of the reply of step {step.step} it came from, {_shown(reply.instruction)}")
    if state.selection is not None and not 0 <= state.selection.candidate_id < count:
        raise refuse(state.selection.candidate_id, "selection.candidate_id",
                     f"the record has candidates 0 to {count - 1}")
    for candidate in state.candidates:
        for field, size in {"scores": state.train_size, "val_scores": state.val_size}.items():
            values = getattr(candidate, field)
            if values is None or (field == "scores" and candidate.status == CandidateStatus.SKIPPED and not values):
                continue
            if len(values) != size:
                raise refuse(candidate.id, field, f"{len(values)} scores, but the split has {size} examples")
            for index, value in enumerate(values):
                if _bad_score(value):
                    raise refuse(candidate.id, f"{field}[{index}]", f"{value} is not a score in [0, 1]")
        for field in ("score", "val_score"):
            if _bad_score(getattr(candidate, field)):
                raise refuse(candidate.id, field, f"{getattr(candidate, field)} is not a score in [0, 1]")


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 100 else f"{text[:48]}...{text[-48:]}"  # the end of a metric's name is its digest


def check_fingerprint(saved: RunState, fingerprint: Fingerprint, log_dir: str | os.PathLike[str]) -> None:
    """Refuse to resume a run whose configuration, data or program differ from the saved one.

    The refusal names each differing setting with its saved and its new value.
    """
    labels = {"config": "the optimizer configuration", "trainset": "the trainset", "valset": "the valset",
              "program": "the program's structure, instructions or demos"}
    differ = []
    for name, label in labels.items():
        old = getattr(saved.fingerprint, name)
        if name == "config" and saved.fingerprint.settings:  # as this version digests it (the metric by its name)
            old = config_digest(saved.fingerprint.settings)
        if old == getattr(fingerprint, name):
            continue
        if name == "config" and saved.fingerprint.settings:
            old, new = saved.fingerprint.settings, fingerprint.settings
            changes = [f"{key}: {_shown(old.get(key))} -> {_shown(new.get(key))}"
                       for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)]
            if changes:
                label = f"{label} ({'; '.join(changes)})"
        differ.append(label)
    if differ:
        saved_metric = metric_name(saved.fingerprint.settings.get("metric"))
        renamed = saved_metric != metric_name(fingerprint.settings.get("metric"))
        hint = (f" A metric of another name is another metric: resume with {saved_metric} (a fix of its body "
                "resumes, and what it failed is run again), or choose a new log_dir for the new one."
                if renamed and saved.fingerprint.settings.get("metric") is not None else "")
        raise StateFileError(
            f"{Path(log_dir) / STATE_FILE} belongs to a different run: {', '.join(differ)} differ(s) from the saved "
            f"run. Resume with the same settings, data and program, or choose a new log_dir.{hint}")


class LogDirLock:
    """An OS lock (``fcntl.flock``) on ``log_dir/run.lock``, held for the whole compile: one run per ``log_dir``.

    The OS releases it when the process dies, so a killed run never leaves a stale lock behind.
    """

    def __init__(self, log_dir: str | os.PathLike[str]):
        self.path = Path(log_dir) / LOCK_FILE
        self._handle: Any = None

    def acquire(self) -> None:
        """Take the lock, or raise :class:`RunInProgressError` at once; an unwritable folder raises ``OSError``."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+b")  # noqa: SIM115 - held for the run
        if _try_lock(handle) is False:
            handle.close()
            raise RunInProgressError(
                f"an OPRO run is in progress in {self.path.parent} (another process, or another compile in this one, "
                f"holds {self.path}). Wait for it to finish, or give this compile another log_dir.") from None
        self._handle = handle

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing the file releases the lock
            self._handle = None


def lock_is_held(log_dir: str | os.PathLike[str]) -> bool | None:
    """Whether a process holds ``log_dir``'s run lock now (a run is alive there); None where it cannot be told.

    A record whose status is ``running`` with no process holding the lock was left by a process that died
    (``kill -9``, a crash, a power cut): the OS released its lock.
    """
    path = Path(log_dir) / LOCK_FILE
    if not path.exists():
        return False
    with open(path, "a+b") as handle:  # closing it releases the lock if it took it
        free = _try_lock(handle)
    return None if free is None else not free


def _try_lock(handle: Any) -> bool | None:
    """Take the OS lock of an open file without waiting: whether it was free (None without fcntl, on Windows)."""
    try:
        import fcntl
    except ImportError:
        return None
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


class ProgressJournal:
    """``progress.jsonl``, append-only between two snapshots of ``state.json`` (the module docstring says what for).

    Lines are flushed as they are written, so a killed process loses none (the OS keeps them). A torn last line,
    from a crash in the middle of a write (even of a multi-byte character), is ignored on reading, and the next
    append starts on a new line. The file is opened at the first append: a read-only finished run never writes.
    """

    def __init__(self, log_dir: str | os.PathLike[str]):
        self.path = Path(log_dir) / PROGRESS_FILE
        self._handle: Any = None

    def _open(self) -> Any:
        if self._handle is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = open(self.path, "ab")  # noqa: SIM115 - open for the run
            if self._handle.tell() > 0:
                with open(self.path, "rb") as existing:
                    existing.seek(-1, os.SEEK_END)
                    if existing.read(1) != b"\n":  # a torn last line: never glue an entry to it
                        self._handle.write(b"\n")
        return self._handle

    def append(self, entry: dict[str, Any]) -> None:
        handle = self._open()
        handle.write((json.dumps(entry, ensure_ascii=False) + "\n").encode("utf-8"))
        handle.flush()

    def clear(self) -> None:
        """Forget the entries: the snapshot just written holds them."""
        if self._handle is not None or self.path.exists():
            handle = self._open()
            handle.truncate(0)
            handle.seek(0)
            handle.flush()

    def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.close()  # once: a close that raised (a full disk) is not tried again

    @staticmethod
    def read(log_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
        """The entries, skipping lines that are not whole JSON objects in UTF-8 (a torn write at a crash)."""
        return [entry for _, entry in ProgressJournal.read_numbered(log_dir)]

    @staticmethod
    def read_numbered(log_dir: str | os.PathLike[str]) -> list[tuple[int, dict[str, Any]]]:
        """The entries with their line numbers (from 1), skipping lines that are not whole JSON objects."""
        try:
            data = (Path(log_dir) / PROGRESS_FILE).read_bytes()
        except FileNotFoundError:
            return []
        entries = []
        for number, line in enumerate(data.split(b"\n"), start=1):
            try:
                entry = json.loads(line.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                continue
            if isinstance(entry, dict):
                entries.append((number, entry))
        return entries


Refuse = Callable[[str, str], StateFileError]


def _refuser(path: str | os.PathLike[str], line: int, what: str, again: str) -> Refuse:
    """The error for a journal line changed outside dspy-opro: the file, the line, ``what`` it is, the field."""
    return lambda field, problem: StateFileError(
        f"{path}, line {line}: {what}, field {field}: {problem}. The journal was changed outside dspy-opro: delete "
        f"that line (or the whole file: {again}) and compile again.")


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _usage(raw: dict[str, Any], refuse: Refuse) -> dict[str, ModelUsage]:
    try:
        return {str(model): ModelUsage.model_validate(value) for model, value in (raw.get("u") or {}).items()}
    except (AttributeError, ValidationError) as exc:
        raise refuse("u (usage)", f"not a usage record ({exc})") from None


@dataclass(frozen=True)
class JournalEntry:
    """One journaled evaluation, checked against the record it is replayed into."""

    candidate: int
    index: int
    split: str
    outcome: str
    score: float | None
    error: str | None
    answer: str | None
    usage: dict[str, ModelUsage]
    anchor: str | None
    count: int | None  # the run's count of evaluations with this one; None from versions that did not write it


def journal_entry(raw: dict[str, Any], state: RunState, *, path: str | os.PathLike[str],
                  line: int) -> JournalEntry | None:
    """Check one journal line against ``state``: None when it names another instruction than the record's
    candidate of that number (not this run's), else the entry; anything else wrong is a :class:`StateFileError`
    naming the file, the line, the candidate and the field."""
    number = raw.get("c")
    refuse = _refuser(path, line, f"candidate {number!r}", "its evaluations are run again")
    if not _is_int(number) or not 0 <= number < len(state.candidates):
        raise refuse("c (candidate)", f"the record has candidates 0 to {len(state.candidates) - 1}")
    candidate = state.candidates[number]
    if raw.get("d") != candidate.md5:
        return None
    split = raw.get("split", "train")
    if split not in ("train", "val"):
        raise refuse("split", f"{split!r} is neither 'train' nor 'val'")
    index, size = raw.get("i"), state.train_size if split == "train" else state.val_size
    if not _is_int(index) or not 0 <= index < size:
        raise refuse("i (example)", f"{index!r} is not an example of the {split} split (0 to {size - 1})")
    if split == "train" and len(candidate.scores) != size:
        raise refuse("c (candidate)", f"candidate {number} is not scored on the training set ({candidate.status})")
    outcome = raw.get("o")
    if outcome not in OUTCOMES:
        raise refuse("o (outcome)", f"{outcome!r} is not one of {', '.join(OUTCOMES)}")
    score = raw.get("s")
    if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float)) or _bad_score(score)):
        raise refuse("s (score)", f"{score!r} is not a score in [0, 1]")
    if score is not None and outcome == "infra":
        raise refuse("s (score)", f"{score!r}, but an infrastructure failure has no score")
    count = raw.get("m")
    if count is not None and (not _is_int(count) or count < 1):
        raise refuse("m (evaluation count)", f"{count!r} is not a positive count")
    if count is not None and count > state.metric_calls + line:  # each line adds one evaluation at most
        raise refuse("m (evaluation count)", f"{count} is more than the record's {state.metric_calls} evaluations "
                                             f"and the {line} journal lines up to this one could hold")
    usage = _usage(raw, refuse)
    texts = {key: raw.get(key) for key in ("e", "a", "t")}
    for key, value in texts.items():
        if value is not None and not isinstance(value, str):
            raise refuse(key, f"{value!r} is not text")
    return JournalEntry(candidate=number, index=index, split=split, outcome=outcome,
                        score=None if score is None else float(score), error=texts["e"], answer=texts["a"],
                        usage=usage, anchor=texts["t"], count=count)


@dataclass(frozen=True)
class ReplyEntry:
    """One journaled optimizer request's replies: the step, the first sample, the meta-prompt's digest, the cost."""

    step: int
    sample: int  # the sample of the request's rollout id; an n request's choices are samples sample, sample + 1, ...
    meta_prompt_md5: str
    replies: list[str]
    usage: dict[str, ModelUsage]


def reply_entry(raw: dict[str, Any], state: RunState, *, path: str | os.PathLike[str], line: int) -> ReplyEntry:
    """Check one journaled optimizer reply (``"k": "reply"``) against ``state``; anything wrong is a
    :class:`StateFileError` naming the file, the line, the step and the field."""
    step = raw.get("step")
    refuse = _refuser(path, line, f"optimizer reply of step {step!r}", "those replies are asked for again")
    asked = len(state.steps)  # the step being asked: the record holds every earlier one
    if not _is_int(step) or not 0 <= step <= asked:
        raise refuse("step", f"the record has {asked} steps, so the step being asked is {asked}")
    replies = raw.get("r")
    if not isinstance(replies, list) or not replies or not all(isinstance(text, str) for text in replies):
        raise refuse("r (replies)", f"{_shown(replies)} is not a non-empty list of texts")
    sample, top = raw.get("n"), state.config.get("num_candidates")
    top = top if _is_int(top) else None
    if not _is_int(sample) or sample < 0 or (top is not None and sample + len(replies) > top):
        limit = f" (samples 0 to {top - 1} with num_candidates={top})" if top is not None else ""
        raise refuse("n (sample)", f"{sample!r} is not the sample of {len(replies)} replies{limit}")
    meta_prompt_md5 = raw.get("d")
    if not isinstance(meta_prompt_md5, str) or not meta_prompt_md5:
        raise refuse("d (meta-prompt digest)", f"{meta_prompt_md5!r} is not a digest")
    return ReplyEntry(step=step, sample=sample, meta_prompt_md5=meta_prompt_md5, replies=replies,
                      usage=_usage(raw, refuse))
