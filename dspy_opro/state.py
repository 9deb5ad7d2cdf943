"""The run record of one OPRO compile: the pydantic models of everything a run pays for.

Every candidate instruction with its per-example training scores and its fate, one record per step (exemplars, the
meta-prompt, the optimizer's replies and what became of each), the usage of both models, and how the returned
program was selected. :mod:`dspy_opro.record.files` writes the record to disk and reads it back; reports and the plot
only read it. The one rule for "the best candidate" (highest training score, the earliest among ties) lives here,
beside the candidates, as :func:`best_candidate` and :func:`ranked_candidates`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

SCHEMA_VERSION = 2  # 2: a candidate a budget stopped is "cut_short" (version 1 said "unscored" with a reason)
START_ID = 0  # the program as given is always candidate 0 (step -1)

Split = Literal["train", "val"]


class CandidateStatus(str, Enum):
    """Where a candidate stands; the one place a candidate's state is kept (its ``reason`` only explains it)."""

    PENDING = "pending"
    """Not scored yet (or reopened to be scored again)."""
    SCORED = "scored"
    """Scored on every training example: its score is the training mean."""
    RACED_OUT = "raced_out"
    """Racing stopped it as worse than the best; its score is the partial mean over the examples it ran (shown in
    meta-prompts). It is never the best and never returned."""
    UNSCORED = "unscored"
    """Infrastructure failures (rate limits, server errors, timeouts) left examples without a score after a retry;
    compiling an unfinished run again with the same ``log_dir`` scores it again."""
    CUT_SHORT = "cut_short"
    """A budget stopped its scoring; a larger budget continues it."""
    SKIPPED = "skipped"
    """Never run: an empty or too long proposal, one containing ``INS``, or a repeated initial instruction."""

    def __str__(self) -> str:
        return self.value


ReplyFate = Literal["new", "unclosed", "duplicate", "empty", "too_long", "contains_ins", "no_instruction"]

# Scores are mostly a handful of values (0.0, 1.0, ...): sharing one float object per value (up to 4096 values)
# keeps a record of 1.6 million per-example scores at a pointer each instead of a pointer plus a float object.
_SHARED_SCORES: dict[float, float] = {}


class ModelUsage(BaseModel):
    """Calls, tokens and cost of one model (or of one role: optimizer, task); none of them can be negative."""

    calls: int = Field(default=0, ge=0)
    """Successful LM calls, cache hits included."""
    cache_hits: int = Field(default=0, ge=0)
    """Calls answered from DSPy's cache: no tokens and no cost."""
    prompt_tokens: int = Field(default=0, ge=0)
    """Prompt tokens the provider billed."""
    completion_tokens: int = Field(default=0, ge=0)
    """Completion tokens the provider billed."""
    cached_tokens: int = Field(default=0, ge=0)
    """Prompt tokens the provider served from its prompt cache (billed at a discount); part of `prompt_tokens`."""
    cost: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    """USD: LiteLLM's per-response cost where the response carries one, else LiteLLM's price map by the tokens."""
    unpriced_calls: int = Field(default=0, ge=0)
    """Calls of a model with no known price: `cost` is then a lower bound (`cost_known` is false)."""
    estimated_calls: int = Field(default=0, ge=0)
    """Calls whose reply said nothing usable of what was billed (no `usage`, or counts that cannot be true, such as
    negative ones): their tokens are estimated from the text sent and received, so `cost` is an estimate."""

    @property
    def cost_known(self) -> bool:
        return self.unpriced_calls == 0

    def add(self, other: ModelUsage) -> None:
        for name in ModelUsage.model_fields:
            setattr(self, name, getattr(self, name) + getattr(other, name))


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


class RaceLook(BaseModel):
    """One look of a candidate's race (``dspy_opro.extensions.racing.Look`` is this class): sign counts and critical
    value."""

    examples: int
    """Examples of the shared order scored at this look."""
    worse: int
    """Examples the candidate lost to the best (sign -1)."""
    better: int
    """Examples it won (sign +1)."""
    critical: int | None
    """Count of -1 signs at or above which it stops; None: no stop possible at this look."""
    spent: float
    """Alpha spent up to this look."""
    stop: bool
    """Whether this look stopped the candidate."""
    against: int | None = None
    """The candidate this look compared with: the step's incumbent, or the sibling that stopped it."""


class RaceRecord(BaseModel):
    """A candidate's race against the best at the start of its step (``racing=True``)."""

    against: int
    """The id of the best candidate it raced against."""
    examples: int
    """Examples its decision rests on (n when it completed)."""
    n: int
    """The training examples."""
    looks: list[RaceLook] = Field(default_factory=list)
    """Every look taken, in order."""
    stopped_at: int | None = None
    """The examples of the look that stopped it; None: it ran all n."""
    stopped_by: int | None = None
    """The id of the candidate it lost to (the incumbent or a sibling of its step); None: it ran all n."""


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
    status: CandidateStatus = CandidateStatus.PENDING
    """`"pending"` (not scored yet), `"scored"`, `"raced_out"` (stopped by racing), `"unscored"` (infrastructure
    failures on some examples after a retry), `"cut_short"` (stopped by a budget) or `"skipped"` (empty, too long, a
    repeat, or containing `INS`: never run)."""
    reason: str | None = None
    """Why it is `raced_out`, `unscored`, `cut_short` or `skipped`, in words."""
    scores: list[float | None] = Field(default_factory=list)
    """One score in [0, 1] per training example, in trainset order; `None`: not run (or no result yet)."""
    failed: list[int] = Field(default_factory=list)
    """Training indices whose program run raised; they scored `failure_score`."""
    answers: dict[int, str] = Field(default_factory=dict)
    """Exemplar answers shown in meta-prompts for training examples without usable labels (the program's output,
    the metric's feedback or a note), by training index."""
    error_count: int = 0
    """Evaluations whose program raised (infrastructure failures not counted)."""
    metric_errors: list[str] = Field(default_factory=list)
    """The evaluations whose metric raised (``"train:3"``, ``"val:0"``), in `failed` and `errors` too: a fixed metric
    runs them again on resume."""
    errors: list[ErrorRecord] = Field(default_factory=list)
    """The first occurrence of each distinct error (at most 20 kinds; further ones count only in `error_count`)."""
    score: float | None = None
    """The training mean in [0, 1], set once every training example is scored (raced out: the mean over the
    examples it ran)."""
    race: RaceRecord | None = None
    """`racing=True`: how its race went (the best it raced, the looks, where it stopped)."""
    val_scores: list[float | None] | None = None
    """One score per validation example; `None` for a candidate never scored on the valset."""
    val_score: float | None = None
    """The validation mean, once every validation example is scored."""

    @field_validator("scores", "val_scores", mode="after")
    @classmethod
    def _share_scores(cls, value: list[float | None] | None) -> list[float | None] | None:
        if value is None:
            return None
        shared = _SHARED_SCORES
        return [v if v is None or len(shared) >= 4096 else shared.setdefault(v, v) for v in value]


class Reply(BaseModel):
    """One optimizer reply and what became of it."""

    text: str
    """The reply as the optimizer model wrote it (lone surrogates replaced by U+FFFD)."""
    instruction: str | None
    """The instruction extracted from it and polished; `None` when the reply held none."""
    fate: ReplyFate
    """`"new"` (a new candidate), `"unclosed"` (a new candidate from a reply whose closing tag never came: the
    authors' extraction took the rest of the reply, and it is scored as theirs would be), `"duplicate"` (an
    instruction already proposed), `"empty"`, `"too_long"`, `"contains_ins"` (holds `INS`) or `"no_instruction"`."""
    unclosed: bool = False
    """The reply opened the tag the instruction is taken from (`<INS>`, `<Start>`, `[`, `<TEXT>`) and never closed
    it, whatever its fate."""
    candidate_id: int | None = None
    """The candidate it became (`new`, `unclosed`; `empty`, `too_long` and `contains_ins` become skipped candidates) or
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
    skipped_calls: int = 0
    """Proposals not asked for because the request's worst-case cost did not fit in what was left of `max_cost`."""
    skip_reason: str | None = None
    """Why they were not asked for (the bound and the money left)."""
    complete: bool = False
    """Whether every new candidate of the step was scored (false while running, or when a budget cut it short)."""
    best_score: float | None = None
    """The best training score of the run after this step."""
    race_against: int | None = None
    """`racing=True`: the best candidate at the start of the step, which the step's candidates race."""
    started_at: float | None = None
    """When the step began (seconds since the epoch, UTC), as its optimizer calls were sent."""
    ended_at: float | None = None
    """When its last candidate was scored; None while it runs or when it was cut short."""


class ReceivedReplies(BaseModel):
    """The optimizer replies of a step the record does not hold yet, with their usage counted in the record.

    Replayed from the journal (each reply is journaled as it arrives) after a kill during the step's optimizer
    calls, or kept between those calls and the step's record (a snapshot then, at Ctrl-C or an error, holds them).
    The resumed run hands them to the step's optimizer calls, which ask only for the samples not among them.
    Cleared when the step is recorded.
    """

    step: int
    """The step whose optimizer calls they answered."""
    meta_prompt_md5: str
    """The digest of the meta-prompt they answered: they are replayed only onto the same meta-prompt."""
    replies: dict[int, str] = Field(default_factory=dict)
    """The replies by sample number (the sample of the request's rollout id), as the optimizer model wrote them."""


class Session(BaseModel):
    """One ``compile`` of the run: the first, then each resumption."""

    started_at: float
    """When the compile began (seconds since the epoch, UTC)."""
    ended_at: float | None = None
    """When it ended; None if the process died (``kill -9``, a crash) before it could say."""
    end: str | None = None
    """How it ended: the run's status then (`"finished"`, `"stopped"`, `"interrupted"`, `"failed"`)."""


class Phase(BaseModel):
    """One stretch of a run's work, timed: step -1's scoring, a step's optimizer calls or its scoring, validation."""

    name: str
    """What it was (`"step -1 scoring"`, `"step 3 proposals"`, `"step 3 scoring"`, `"validation"`)."""
    started_at: float
    """When it began (seconds since the epoch, UTC)."""
    ended_at: float | None = None
    """When it ended; None when the run stopped inside it."""


class Selection(BaseModel):
    """How the returned program was chosen."""

    candidate_id: int
    """The returned candidate's `id`."""
    selected_by: Literal["train", "validation", "val_gate", "start"]
    """The rule: `"train"` (best training score, the paper's), `"validation"` (best validation mean of the `top_k`),
    `"val_gate"` (a candidate that passed the gate) or `"start"` (the program unchanged: the gate refused)."""
    reason: str
    """The decision in words, with the scores it compared."""


FELL_BACK = "validation could not be completed (budget or LM failures); fell back to the best training score"
"""The start of a `Selection.reason` on training where the valset was to select."""


def validation_incomplete(state: RunState) -> bool:
    """Whether a run that was to select on the valset selected on training because validation could not finish."""
    return state.selection is not None and state.selection.selected_by == "train" and \
        state.selection.reason.startswith(FELL_BACK)


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
    optimizer_single_choice: dict[str, str] = Field(default_factory=dict)
    """Optimizer models asked one choice per request, by model name, with why: the model answered an `n` request
    with fewer choices, or refused it (an HTTP 400 naming `n`). A resumed run never sends them an `n` request."""
    optimizer_usage_undercount: dict[str, str] = Field(default_factory=dict)
    """Optimizer models whose `usage` counted fewer completion tokens than their choices hold (a server that counts
    only the first of `n` choices), by model name, with the first such finding: their recorded tokens and cost are
    too low."""
    received_replies: ReceivedReplies | None = None
    """The optimizer replies received by a step not yet recorded (one a kill, Ctrl-C or an error interrupted), until
    the step is recorded; None otherwise."""
    anchors: dict[str, str] = Field(default_factory=dict)
    """Label-free OPRO: the starting program's trajectory on each example (`"split:index"`), judged against."""
    selection: Selection | None = None
    """How the returned candidate was chosen; `None` until the search ends."""
    tolerated_errors: int = 0
    """Metric and program errors that `max_errors` counted and the run went on after (each scored `failure_score`
    and is in its candidate's `errors`)."""
    sessions: list[Session] = Field(default_factory=list)
    """Every compile of the run, in order: a resumption opens a new one; one without an end was killed."""
    phases: list[Phase] = Field(default_factory=list)
    """Every timed phase, in order."""

    def scored(self) -> list[Candidate]:
        """The candidates scored on every training example."""
        return [c for c in self.candidates if c.status == CandidateStatus.SCORED]

    def with_scores(self) -> list[Candidate]:
        """The candidates a meta-prompt shows: the fully scored ones and the raced-out ones (partial means)."""
        shown = (CandidateStatus.SCORED, CandidateStatus.RACED_OUT)
        return [c for c in self.candidates if c.status in shown and c.score is not None]

    def best(self) -> Candidate | None:
        """The best scored candidate on training; the earliest wins a tie (``best_candidate``)."""
        return best_candidate(self.candidates)


def budget_spent(state: RunState, *, max_metric_calls: int | None, max_cost: float | None,
                 in_flight: int = 0) -> str | None:
    """Why the budget allows no further evaluation, with ``in_flight`` evaluations running; None while it does.

    The one budget rule: the record's count of evaluations (``metric_calls``) and its recorded cost against the
    limits.
    """
    if max_metric_calls is not None and state.metric_calls + in_flight >= max_metric_calls:
        return f"max_metric_calls={max_metric_calls} reached"
    cost = state.usage.total_cost
    if max_cost is not None and cost >= max_cost:
        return f"max_cost=${max_cost:g} reached (spent ${cost:.4f})"
    return None


def digest(value: Any) -> str:
    """A short stable digest of a JSON-able value."""
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def config_digest(settings: dict[str, Any]) -> str:
    """The digest of a run's shaping settings, the metric counted by its qualified name only: a metric whose body
    was edited (a fix) resumes the run and runs again what it failed; another metric is another run. (Label-free
    OPRO's metric counts by its settings too: another judge is another run.)"""
    metric = settings.get("metric")
    if isinstance(metric, str) and not settings.get("label_free"):
        settings = {**settings, "metric": metric_name(metric)}
    return digest(settings)


def metric_name(fingerprint: Any) -> str:
    """The qualified name of a recorded metric (``module.qualname#digest``), without its code digest."""
    return str(fingerprint).split("#", 1)[0]


def best_candidate(candidates: Iterable[Candidate]) -> Candidate | None:
    """The one rule for the best candidate: the highest training score among the scored ones, the earliest (lowest
    id, i.e. proposed first) among ties; None when none is scored."""
    ranked = ranked_candidates(candidates)
    return ranked[0] if ranked else None


def ranked_candidates(candidates: Iterable[Candidate]) -> list[Candidate]:
    """The scored candidates, best first by :func:`best_candidate`'s rule."""
    scored = [c for c in candidates if c.status == CandidateStatus.SCORED and c.score is not None]
    return sorted(scored, key=lambda c: (-(c.score or 0.0), c.id))


def record_result(candidate: Candidate, *, index: int, split: str, outcome: str, score: float | None,
                  error: str | None, answer: str | None) -> None:
    """Store one evaluation's result on its candidate: the score, a program error, the exemplar answer.

    The live run and the replay of the journal on resume both store results through this one function.
    """
    if outcome == "failed":  # one program error: the first occurrence of each distinct error is kept
        candidate.error_count += 1
        if (error or "").startswith(METRIC_ERROR_PREFIX):
            candidate.metric_errors.append(f"{split}:{index}")
        message = error or "unknown error"
        same = next((r for r in candidate.errors if r.error == message and r.split == split), None)
        if same is not None:
            same.count, same.example = same.count + 1, min(same.example, index)
        elif len(candidate.errors) < MAX_ERROR_KINDS:
            candidate.errors.append(ErrorRecord(error=message, example=index, split=split))  # type: ignore[arg-type]
    if split == "val":
        candidate.val_scores[index] = score  # type: ignore[index]
        return
    candidate.scores[index] = score
    if outcome == "failed" and index not in candidate.failed:
        candidate.failed.append(index)
    if answer is not None:
        candidate.answers[index] = answer


METRIC_ERROR_PREFIX = "metric: "  # an evaluation whose metric raised records its error so


def forget_metric_errors(candidate: Candidate) -> int:
    """Undo the evaluations whose metric raised, so that they are run again (a fixed metric); return how many.

    Their scores become None, their errors leave `failed`, `errors` and `error_count`, and the candidate is
    pending again (its means are recomputed once it is scored).
    """
    cleared = list(candidate.metric_errors)
    if not cleared:
        return 0
    for key in cleared:
        split, _, position = key.partition(":")
        index = int(position)
        if split == "val" and candidate.val_scores is not None:
            candidate.val_scores[index] = None
        elif split == "train":
            candidate.scores[index] = None
            candidate.answers.pop(index, None)
            if index in candidate.failed:
                candidate.failed.remove(index)
    candidate.errors = [e for e in candidate.errors if not e.error.startswith(METRIC_ERROR_PREFIX)]
    candidate.error_count = max(candidate.error_count - len(cleared), 0)
    candidate.metric_errors = []
    if any(key.startswith("train:") for key in cleared):
        candidate.score, candidate.status, candidate.reason = None, CandidateStatus.PENDING, None
    if any(key.startswith("val:") for key in cleared):
        candidate.val_score = None
    return len(cleared)


def no_scores(n: int) -> list[float | None]:
    """The scores of ``n`` examples none of which is scored yet."""
    return [None] * n


def mean_score(values: list[float | None]) -> float:
    """The mean over a split's examples (a missing score counts as 0; callers check completeness first)."""
    return sum(v for v in values if v is not None) / len(values)
