"""The run record of one OPRO compile: the pydantic models of everything a run pays for.

Every candidate instruction with its per-example training scores and its fate, one record per step (exemplars, the
meta-prompt, the optimizer's replies and what became of each), the usage of both models, and how the returned
program was selected. :mod:`dspy_opro.record` writes the record to disk and reads it back; reports and the plot
only read it. The one rule for "the best candidate" (highest training score, the earliest among ties) lives here,
beside the candidates, as :func:`best_candidate` and :func:`ranked_candidates`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

SCHEMA_VERSION = 1
START_ID = 0  # the program as given is always candidate 0 (step -1)

# "raced_out": racing stopped the candidate once it was significantly worse than the best; its score is the partial
# mean over the examples it ran (shown in meta-prompts), and it can never be the best or be returned.
CandidateStatus = Literal["pending", "scored", "unscored", "skipped", "raced_out"]
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


class RaceLook(BaseModel):
    """One look of a candidate's race (:class:`dspy_opro.racing.Look`): the sign counts and the critical value."""

    examples: int  # examples of the shared order scored at this look
    worse: int  # examples the candidate lost to the best (sign -1)
    better: int  # examples it won (sign +1)
    critical: int | None  # count of -1 signs at or above which it stops; None: no stop possible at this look
    spent: float  # alpha spent up to this look
    stop: bool


class RaceRecord(BaseModel):
    """A candidate's race against the best at the start of its step (``racing=True``)."""

    against: int  # the id of the best candidate it raced against
    examples: int  # examples its decision rests on (n when it completed)
    n: int
    looks: list[RaceLook] = Field(default_factory=list)
    stopped_at: int | None = None  # the examples of the look that stopped it; None: it ran all n

    @property
    def reason(self) -> str | None:
        return f"raced out after {self.stopped_at} of {self.n}" if self.stopped_at is not None else None


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
    score: float | None = None  # training mean, set when scored (raced out: the mean over the examples it ran)
    race: RaceRecord | None = None  # racing=True: how its race went
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
    race_against: int | None = None  # racing=True: the best at the start of the step, which its candidates race


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

    def with_scores(self) -> list[Candidate]:
        """The candidates a meta-prompt shows: the fully scored ones and the raced-out ones (partial means)."""
        return [c for c in self.candidates if c.status in ("scored", "raced_out") and c.score is not None]

    def best(self) -> Candidate | None:
        """The best scored candidate on training; the earliest wins a tie (:func:`best_candidate`)."""
        return best_candidate(self.candidates)


def digest(value: Any) -> str:
    """A short stable digest of a JSON-able value."""
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def best_candidate(candidates: Iterable[Candidate]) -> Candidate | None:
    """The one rule for the best candidate: the highest training score among the scored ones, the earliest (lowest
    id, i.e. proposed first) among ties; None when none is scored."""
    ranked = ranked_candidates(candidates)
    return ranked[0] if ranked else None


def ranked_candidates(candidates: Iterable[Candidate]) -> list[Candidate]:
    """The scored candidates, best first by :func:`best_candidate`'s rule."""
    return sorted((c for c in candidates if c.status == "scored"), key=lambda c: (-c.score, c.id))  # type: ignore[operator]


def record_result(candidate: Candidate, *, index: int, split: str, outcome: str, score: float | None,
                  error: str | None, answer: str | None) -> None:
    """Store one evaluation's result on its candidate: the score, a program error, the exemplar answer.

    The live run and the replay of the journal on resume both store results through this one function.
    """
    if outcome == "failed":
        _record_error(candidate, index=index, split=split, error=error)
    if split == "val":
        candidate.val_scores[index] = score  # type: ignore[index]
        return
    candidate.scores[index] = score
    if outcome == "failed" and index not in candidate.failed:
        candidate.failed.append(index)
    if answer is not None:
        candidate.answers[index] = answer


def _record_error(candidate: Candidate, *, index: int, split: str, error: str | None) -> None:
    """Count one program error on a candidate, keeping the first occurrence of each distinct error."""
    candidate.error_count += 1
    message = error or "unknown error"
    for record in candidate.errors:
        if record.error == message and record.split == split:
            record.count += 1
            record.example = min(record.example, index)
            return
    if len(candidate.errors) < MAX_ERROR_KINDS:
        candidate.errors.append(ErrorRecord(error=message, example=index, split=split))  # type: ignore[arg-type]


def mean_score(values: list[float | None]) -> float:
    """The mean over a split's examples (a missing score counts as 0; callers check completeness first)."""
    return sum(v for v in values if v is not None) / len(values)
