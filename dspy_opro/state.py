"""The run record of one OPRO compile: pydantic models, atomic JSON persistence and resume checks.

Everything an OPRO run pays for lives here: every candidate instruction with its per-example training scores and
its fate, one record per step (exemplars, the meta-prompt, the optimizer's replies and what became of each) and the
usage of both models. With a ``log_dir`` the record is written to ``state.json`` atomically (temporary file, fsync,
rename) after every scored candidate, and every finished (candidate, example) evaluation is appended to
``progress.jsonl`` as it completes, so that a crash at any moment loses nothing that was paid for. Compiling again
with the same ``log_dir`` rebuilds the run from these two files; a fingerprint of the configuration, the data and
the program guards against resuming a different run.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator

SCHEMA_VERSION = 1
STATE_FILE = "state.json"
PROGRESS_FILE = "progress.jsonl"
LOCK_FILE = "run.lock"

CandidateStatus = Literal["pending", "scored", "unscored", "skipped"]
ReplyFate = Literal["new", "duplicate", "empty", "too_long", "contains_ins", "no_instruction"]

# Scores are mostly a handful of values (0.0, 1.0, ...): sharing one float object per value keeps a record of
# 1.6 million per-example scores at a pointer each instead of a pointer plus a float object.
_SHARED_SCORES: dict[float, float] = {}


def _share(value: float | None) -> float | None:
    if value is None:
        return None
    if len(_SHARED_SCORES) < 4096:
        return _SHARED_SCORES.setdefault(value, value)
    return value


class StateFileError(RuntimeError):
    """The state file under ``log_dir`` cannot be read or does not belong to this run."""


class ModelUsage(BaseModel):
    """Calls, tokens and cost of one model (or of one role: optimizer, task)."""

    calls: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the provider served from its prompt cache (billed at a discount)
    cost: float = 0.0
    unpriced_calls: int = 0  # calls made with no price known: the cost is then a lower bound

    @property
    def cost_known(self) -> bool:
        return self.unpriced_calls == 0

    def add(self, other: ModelUsage) -> None:
        self.calls += other.calls
        self.cache_hits += other.cache_hits
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.cached_tokens += other.cached_tokens
        self.cost += other.cost
        self.unpriced_calls += other.unpriced_calls


class UsageRecord(BaseModel):
    """Usage of the optimizer model and of everything run while scoring (task model, judges inside the metric)."""

    optimizer: ModelUsage = Field(default_factory=ModelUsage)
    task: ModelUsage = Field(default_factory=ModelUsage)
    by_model: dict[str, ModelUsage] = Field(default_factory=dict)

    def record(self, role: Literal["optimizer", "task"], per_model: dict[str, ModelUsage]) -> None:
        for model, usage in per_model.items():
            getattr(self, role).add(usage)
            self.by_model.setdefault(model, ModelUsage()).add(usage)

    @property
    def total_cost(self) -> float:
        return self.optimizer.cost + self.task.cost


class ErrorRecord(BaseModel):
    """One distinct exception the program raised while a candidate was evaluated (infrastructure failures aside)."""

    error: str  # "Type: message" of its first occurrence
    example: int  # the first example it was raised on
    split: Literal["train", "val"] = "train"
    count: int = 1  # evaluations that raised exactly this


MAX_ERROR_KINDS = 20  # distinct errors kept per candidate; further ones only count in error_count


class Candidate(BaseModel):
    """One program configuration that was (or was to be) scored on the training set."""

    id: int
    step: int  # -1: the program as given
    predictor: str | None  # the predictor whose instruction this candidate changes; None for the starting program
    instruction: str  # that predictor's new instruction ("" for the starting program)
    instructions: dict[str, str]  # every target predictor's instruction in the evaluated program
    md5: str
    status: CandidateStatus = "pending"
    reason: str | None = None
    scores: list[float | None] = Field(default_factory=list)  # per training example; None: not run
    failed: list[int] = Field(default_factory=list)  # training indices whose run raised (scored failure_score)
    answers: dict[int, str] = Field(default_factory=dict)  # exemplar answers for examples without usable labels
    error_count: int = 0  # evaluations whose program raised (not counting infrastructure failures)
    errors: list[ErrorRecord] = Field(default_factory=list)  # the first occurrence of each distinct error
    score: float | None = None  # training mean, set when scored
    val_scores: list[float | None] | None = None
    val_score: float | None = None

    @field_validator("scores", "val_scores", mode="after")
    @classmethod
    def _share_scores(cls, value: list[float | None] | None) -> list[float | None] | None:
        return None if value is None else [_share(v) for v in value]


class Reply(BaseModel):
    """One optimizer reply and what became of it."""

    text: str
    instruction: str | None  # extracted and polished; None when the reply held no instruction
    fate: ReplyFate
    candidate_id: int | None = None  # the candidate it became (new) or repeated (duplicate)


class Step(BaseModel):
    """One OPRO step: the meta-prompt for one predictor, the optimizer's replies, the candidates they became."""

    step: int
    predictor: str
    exemplar_indices: list[int]
    meta_prompt: str
    temperature: float
    replies: list[Reply] = Field(default_factory=list)
    failed_calls: int = 0
    errors: list[str] = Field(default_factory=list)
    complete: bool = False
    best_score: float | None = None  # best training score after this step


class Selection(BaseModel):
    """How the returned program was chosen."""

    candidate_id: int
    selected_by: Literal["train", "validation", "val_gate", "start"]
    reason: str


class Fingerprint(BaseModel):
    """Digests of what decides a run's results, and the settings themselves so a refusal can name what changed."""

    config: str
    trainset: str
    valset: str
    program: str
    settings: dict[str, Any] = Field(default_factory=dict)


class RunState(BaseModel):
    """The whole record of one OPRO run."""

    schema_version: int = SCHEMA_VERSION
    fingerprint: Fingerprint
    config: dict[str, Any]
    predictors: list[str]
    train_size: int
    val_size: int
    candidates: list[Candidate] = Field(default_factory=list)
    steps: list[Step] = Field(default_factory=list)
    usage: UsageRecord = Field(default_factory=UsageRecord)
    metric_calls: int = 0
    # "stopped": a budget or the optimizer's silence ended it; "failed": an exception did (stop_reason says which);
    # "interrupted": Ctrl-C. Compiling again with the same log_dir resumes all three.
    status: Literal["running", "finished", "stopped", "interrupted", "failed"] = "running"
    stop_reason: str | None = None
    start_val_score: float | None = None
    anchors: dict[str, str] = Field(default_factory=dict)  # label-free OPRO: "split:index" -> anchor trajectory
    selection: Selection | None = None

    def scored(self) -> list[Candidate]:
        return [c for c in self.candidates if c.status == "scored"]

    def best(self) -> Candidate | None:
        """The best scored candidate on training; the earliest wins a tie."""
        best: Candidate | None = None
        for candidate in self.scored():
            if best is None or candidate.score > best.score:  # type: ignore[operator]
                best = candidate
        return best


def digest(value: Any) -> str:
    """A short stable digest of a JSON-able value."""
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _default_file_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


_FILE_MODE = _default_file_mode()


def save_state(state: RunState, log_dir: str | os.PathLike[str]) -> Path:
    """Write ``state.json`` atomically: a temporary file in the same folder, fsync, rename, fsync the folder."""
    folder = Path(log_dir)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / STATE_FILE
    payload = state.model_dump_json()
    fd, tmp = tempfile.mkstemp(prefix=".state-", suffix=".tmp", dir=folder)
    try:
        os.chmod(tmp, _FILE_MODE)  # mkstemp creates 0600; state.json gets the mode of every other file written
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
        raise StateFileError(
            f"{path} is corrupt ({exc}); it is not valid JSON. Restore it from a backup, or delete the log_dir "
            "to start a fresh run."
        ) from exc
    if not isinstance(data, dict):
        raise StateFileError(f"{path} is corrupt: it holds JSON but not an OPRO run record. Restore it from a backup, "
                             "or delete the log_dir to start a fresh run.")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise StateFileError(
            f"{path} has schema version {version!r}; this dspy-opro reads version {SCHEMA_VERSION}. "
            "Use the dspy-opro version that wrote it, or choose another log_dir."
        )
    try:
        return RunState.model_validate(data)
    except ValidationError as exc:
        raise StateFileError(f"{path} does not hold a valid OPRO run record: {exc}") from exc


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 100 else f"{text[:48]}...{text[-48:]}"  # the end of a metric's name is its digest


def check_fingerprint(saved: RunState, fingerprint: Fingerprint, log_dir: str | os.PathLike[str]) -> None:
    """Refuse to resume a run whose configuration, data or program differ from the saved one.

    The refusal names each differing setting with its saved and its new value.
    """
    labels = {
        "config": "the optimizer configuration",
        "trainset": "the trainset",
        "valset": "the valset",
        "program": "the program's structure, instructions or demos",
    }
    differ = []
    for name, label in labels.items():
        if getattr(saved.fingerprint, name) == getattr(fingerprint, name):
            continue
        if name == "config" and saved.fingerprint.settings:
            old, new = saved.fingerprint.settings, fingerprint.settings
            changes = [f"{key}: {_shown(old.get(key))} -> {_shown(new.get(key))}"
                       for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)]
            if changes:
                label = f"{label} ({'; '.join(changes)})"
        differ.append(label)
    if differ:
        raise StateFileError(
            f"{Path(log_dir) / STATE_FILE} belongs to a different run: {', '.join(differ)} differ(s) from the saved "
            "run. Resume with the same settings, data and program, or choose a new log_dir."
        )


class RunInProgressError(RuntimeError):
    """Another process (or another compile in this one) is running an OPRO run in the same ``log_dir``."""


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
        try:
            import fcntl
        except ImportError:  # no fcntl (Windows): no lock
            self._handle = handle
            return
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            raise RunInProgressError(
                f"an OPRO run is in progress in {self.path.parent} (another process, or another compile in this one, "
                f"holds {self.path}). Wait for it to finish, or give this compile another log_dir."
            ) from None
        self._handle = handle

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing the file releases the lock
            self._handle = None


class ProgressJournal:
    """Append-only log of finished (candidate, example) evaluations between two snapshots of ``state.json``.

    Each entry carries the candidate's instruction digest and the evaluation's usage, so a resumed run applies it
    only to the same instruction and knows what was spent. Lines are flushed as they are written, so a killed
    process loses none (the OS keeps them). A torn last line, from a crash in the middle of a write (even in the
    middle of a multi-byte character), is ignored on reading, and the next append starts on a new line. The file is
    opened at the first append, so a finished run in a read-only ``log_dir`` never needs to write.
    """

    def __init__(self, log_dir: str | os.PathLike[str]):
        self.path = Path(log_dir) / PROGRESS_FILE
        self._handle: Any = None

    def _open(self) -> Any:
        if self._handle is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(self.path, "ab")  # noqa: SIM115 - open for the run
            if handle.tell() > 0:
                with open(self.path, "rb") as existing:
                    existing.seek(-1, os.SEEK_END)
                    if existing.read(1) != b"\n":  # a torn last line: never glue an entry to it
                        handle.write(b"\n")
            self._handle = handle
        return self._handle

    def append(self, entry: dict[str, Any]) -> None:
        handle = self._open()
        handle.write((json.dumps(entry, ensure_ascii=False) + "\n").encode("utf-8"))
        handle.flush()

    def clear(self) -> None:
        """Forget the entries: the snapshot just written holds them."""
        if self._handle is None and not self.path.exists():
            return
        handle = self._open()
        handle.truncate(0)
        handle.seek(0)
        handle.flush()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    @staticmethod
    def read(log_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
        """The entries, skipping lines that are not whole JSON objects in UTF-8 (a torn write at a crash)."""
        path = Path(log_dir) / PROGRESS_FILE
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return []
        entries = []
        for line in data.split(b"\n"):
            try:
                entry = json.loads(line.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                continue
            if isinstance(entry, dict):
                entries.append(entry)
        return entries
