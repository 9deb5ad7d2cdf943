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
    """Successful LM calls, cache hits included."""
    cache_hits: int = 0
    """Calls answered from DSPy's cache: no tokens and no cost."""
    prompt_tokens: int = 0
    """Prompt tokens the provider billed."""
    completion_tokens: int = 0
    """Completion tokens the provider billed."""
    cached_tokens: int = 0
    """Prompt tokens the provider served from its prompt cache (billed at a discount); part of `prompt_tokens`."""
    cost: float = 0.0
    """USD: LiteLLM's per-response cost where the response carries one, else LiteLLM's price map by the tokens."""
    unpriced_calls: int = 0
    """Calls of a model with no known price: `cost` is then a lower bound (`cost_known` is false)."""

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
    """The optimizer model's calls: the meta-prompt requests."""
    task: ModelUsage = Field(default_factory=ModelUsage)
    """Every call made while scoring: the program's (on any thread it starts) and the metric's (an LLM judge)."""
    by_model: dict[str, ModelUsage] = Field(default_factory=dict)
    """The same calls by model name (as `dspy.LM.model` gives it), both roles together."""

    def record(self, role: Literal["optimizer", "task"], per_model: dict[str, ModelUsage]) -> None:
        for model, usage in per_model.items():
            getattr(self, role).add(usage)
            self.by_model.setdefault(model, ModelUsage()).add(usage)

    @property
    def total_cost(self) -> float:
        return self.optimizer.cost + self.task.cost


class ErrorRecord(BaseModel):
    """One distinct exception the program raised while a candidate was evaluated (infrastructure failures aside)."""

    error: str
    """`"Type: message"` of its first occurrence."""
    example: int
    """The index of the first example it was raised on, in the trainset or the valset (`split`)."""
    split: Literal["train", "val"] = "train"
    """Where `example` is: `"train"` or `"val"`."""
    count: int = 1
    """Evaluations that raised exactly this error."""


MAX_ERROR_KINDS = 20  # distinct errors kept per candidate; further ones only count in error_count


class Candidate(BaseModel):
    """One program configuration that was (or was to be) scored on the training set."""

    id: int
    """Its position in `RunState.candidates`; 0 is the program as given."""
    step: int
    """The step that proposed it; -1 for the program as given."""
    predictor: str | None
    """The predictor whose instruction it changes (as `named_predictors()` names it); `None` for the program as
    given."""
    instruction: str
    """That predictor's new instruction (`""` for the program as given)."""
    instructions: dict[str, str]
    """Every target predictor's instruction in the evaluated program, by predictor name."""
    md5: str
    """The de-duplication key: the MD5 of `instruction` as the authors compute it (for the program as given, a
    digest of `instructions`)."""
    status: CandidateStatus = "pending"
    """`"pending"` (not scored yet), `"scored"`, `"unscored"` (LM failures on some examples after a retry, or cut
    short by a budget) or `"skipped"` (empty, too long, or containing `INS`: never run)."""
    reason: str | None = None
    """Why it is `unscored` or `skipped`."""
    scores: list[float | None] = Field(default_factory=list)
    """One score in [0, 1] per training example, in trainset order; `None`: not run (or no result yet)."""
    failed: list[int] = Field(default_factory=list)
    """Training indices whose program run raised; they scored `failure_score`."""
    answers: dict[int, str] = Field(default_factory=dict)
    """Exemplar answers shown in meta-prompts for training examples without usable labels (the program's output,
    the metric's feedback or a note), by training index."""
    error_count: int = 0
    """Evaluations whose program raised (infrastructure failures not counted)."""
    errors: list[ErrorRecord] = Field(default_factory=list)
    """The first occurrence of each distinct error (at most 20 kinds; further ones count only in `error_count`)."""
    score: float | None = None
    """The training mean in [0, 1], set once every training example is scored."""
    val_scores: list[float | None] | None = None
    """One score per validation example; `None` for a candidate never scored on the valset."""
    val_score: float | None = None
    """The validation mean, once every validation example is scored."""

    @field_validator("scores", "val_scores", mode="after")
    @classmethod
    def _share_scores(cls, value: list[float | None] | None) -> list[float | None] | None:
        return None if value is None else [_share(v) for v in value]


class Reply(BaseModel):
    """One optimizer reply and what became of it."""

    text: str
    """The reply as the optimizer model wrote it (lone surrogates replaced by U+FFFD)."""
    instruction: str | None
    """The instruction extracted from it and polished; `None` when the reply held none."""
    fate: ReplyFate
    """`"new"` (a new candidate), `"duplicate"` (an instruction already proposed), `"empty"`, `"too_long"`,
    `"contains_ins"` (holds `INS`) or `"no_instruction"`."""
    candidate_id: int | None = None
    """The candidate it became (`new`; `empty`, `too_long` and `contains_ins` become skipped candidates) or
    repeated (`duplicate`); `None` for `no_instruction`."""


class Step(BaseModel):
    """One OPRO step: the meta-prompt for one predictor, the optimizer's replies, the candidates they became."""

    step: int
    """Its number, from 0 (its position in `RunState.steps`)."""
    predictor: str
    """The predictor whose instruction this step optimizes (round-robin over the targets)."""
    exemplar_indices: list[int]
    """The training examples shown in the meta-prompt, by index."""
    meta_prompt: str
    """The exact meta-prompt sent to the optimizer model."""
    temperature: float
    """The optimizer's sampling temperature."""
    replies: list[Reply] = Field(default_factory=list)
    """Every reply, in the order received, with its fate."""
    failed_calls: int = 0
    """Optimizer requests that failed after their retry (their proposals are lost)."""
    errors: list[str] = Field(default_factory=list)
    """The errors of those failed requests."""
    complete: bool = False
    """Whether every new candidate of the step was scored (false while running, or when a budget cut it short)."""
    best_score: float | None = None
    """The best training score of the run after this step."""


class Selection(BaseModel):
    """How the returned program was chosen."""

    candidate_id: int
    """The returned candidate's `id`."""
    selected_by: Literal["train", "validation", "val_gate", "start"]
    """The rule: `"train"` (best training score, the paper's), `"validation"` (best validation mean of the `top_k`),
    `"val_gate"` (a candidate that passed the gate) or `"start"` (the program unchanged: the gate refused)."""
    reason: str
    """The decision in words, with the scores it compared."""


class Fingerprint(BaseModel):
    """Digests of what decides a run's results, and the settings themselves so a refusal can name what changed."""

    config: str
    """Digest of `settings`."""
    trainset: str
    """Digest of the trainset: every example's fields, values and input keys."""
    valset: str
    """Digest of the valset where the run uses it (`select="validation"`, `val_gate`, label-free); else of an
    empty set, so another valset resumes the run."""
    program: str
    """Digest of the program as given: its class, and each predictor's name, fields, instructions and demos'
    content."""
    settings: dict[str, Any] = Field(default_factory=dict)
    """Everything that shapes the search (not the budgets, `num_steps`, `num_threads`, `executor`), with the
    optimizer, task and judge model names and the metric (its qualified name and code digest)."""


class RunState(BaseModel):
    """The whole record of one OPRO run."""

    schema_version: int = SCHEMA_VERSION
    """The version of this record's layout."""
    fingerprint: Fingerprint
    """What a resumed run must match."""
    config: dict[str, Any]
    """The run's settings as it started: the search settings, models and metric, and the budgets."""
    predictors: list[str]
    """The target predictors, by name, in round-robin order."""
    train_size: int
    """Examples in the trainset."""
    val_size: int
    """Examples in the valset (0 without one)."""
    candidates: list[Candidate] = Field(default_factory=list)
    """Every candidate in the order proposed; the program as given first."""
    steps: list[Step] = Field(default_factory=list)
    """Every step in order."""
    usage: UsageRecord = Field(default_factory=UsageRecord)
    """Calls, tokens and cost of both roles, equal to what the providers served (an evaluation cut off by a crash
    is not counted)."""
    metric_calls: int = 0
    """Evaluations that ran (program and metric on one example), training and validation; `max_metric_calls`
    counts these."""
    status: Literal["running", "finished", "stopped", "interrupted", "failed"] = "running"
    """`"running"`, `"finished"`, `"stopped"` (a budget or the optimizer's silence ended it), `"failed"` (an
    exception did: `stop_reason` says which) or `"interrupted"` (Ctrl-C). Compiling again with the same `log_dir`
    resumes the last three."""
    stop_reason: str | None = None
    """Why it stopped, failed or was interrupted (`"ErrorType: message"` for an exception)."""
    start_val_score: float | None = None
    """The program as given's validation mean, where the run scored it."""
    anchors: dict[str, str] = Field(default_factory=dict)
    """Label-free OPRO: the starting program's trajectory on each example (`"split:index"`), judged against."""
    selection: Selection | None = None
    """How the returned candidate was chosen; `None` until the search ends."""

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
