"""The configuration of one OPRO run: every setting, documented, validated once and frozen.

:class:`OPROTeleprompter` is DSPy's face of the optimizer; it builds an :class:`OPROConfig` in its constructor, so a
bad setting fails there, before any LM call, with a message that names the fix. The run reads the configuration and
never the teleprompter.

The fields of :class:`OPROConfig` are the one source of the settings. Each field's metadata (:func:`setting`) holds
its documentation, its group and its kind; from them come the constructor's ``Args:`` (checked by a test against
:func:`settings_docstring`), the documentation's parameter table (checked the same way), and what a run records and
fingerprints:

* ``search`` settings shape the results: recorded in the run record (``state.config``) and fingerprinted, so a
  resumed run must have the same;
* ``continuable`` settings (``num_steps`` and the budgets) are recorded but not fingerprinted: a stopped or finished
  run continues under larger ones;
* ``execution`` settings (threads, executor, folder, progress bar) shape no result and are neither.

The configuration also turns the options into the run's policies (:meth:`OPROConfig.scoring_policy`,
:meth:`~OPROConfig.exemplar_policy`, :meth:`~OPROConfig.selection_policy`), importing an extension only when it is
used.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import dspy

from dspy_opro.checks import require_bool, require_choice, require_int, require_number
from dspy_opro.errors import LogDirError
from dspy_opro.extensions import HardDiverse, Racing, ValGate
from dspy_opro.proposing.initial import InitialInstructions, check_initial_instructions, initial_settings
from dspy_opro.proposing.meta_prompt import validate_meta_prompt_options
from dspy_opro.proposing.step_inputs import ExemplarPolicy, UniformExemplars
from dspy_opro.record.state import Fingerprint, digest
from dspy_opro.scoring.evaluation import AnchoredMetric, metric_takes_trace
from dspy_opro.scoring.scorer import ScoringPolicy
from dspy_opro.selection import OnTraining, OnValidation, SelectionPolicy
from dspy_opro.task.placement import check_instruction_pos
from dspy_opro.task.programs import callable_fingerprint, dataset_fingerprint, program_fingerprint

ExemplarSelection = Literal["random", "constant", "hard_diverse"]
Auto = Literal["light", "medium", "heavy"]
DEFAULT_NUM_STEPS = 10
DEFAULT_NUM_CANDIDATES = 8
# Settings get_params() returns as given: objects, not JSON.
OBJECT_SETTINGS = ("metric", "prompt_model", "task_model", "executor")


@dataclass(frozen=True)
class AutoPreset:
    """One ``auto`` preset: ``num_candidates`` samples per step, and as many steps as bring the evaluations of a run
    (``n_train * (1 + num_steps * num_candidates)``) nearest to ``evaluations`` without passing it, within
    ``min_steps``..``max_steps``."""

    num_candidates: int
    evaluations: int
    min_steps: int
    max_steps: int


# Like MIPROv2's and GEPA's presets, a budget that grows from light to heavy; OPRO spends it on steps of the
# authors' 8 candidates (4 for light, so that a small budget still sees several steps).
AUTO_PRESETS: dict[str, AutoPreset] = {
    "light": AutoPreset(num_candidates=4, evaluations=400, min_steps=2, max_steps=10),
    "medium": AutoPreset(num_candidates=8, evaluations=2000, min_steps=4, max_steps=25),
    "heavy": AutoPreset(num_candidates=8, evaluations=8000, min_steps=8, max_steps=100),
}


def auto_plan(auto: str, n_train: int) -> tuple[int, int]:
    """``(num_steps, num_candidates)`` of an ``auto`` preset for ``n_train`` training examples."""
    preset = AUTO_PRESETS[auto]
    steps = (preset.evaluations // max(n_train, 1) - 1) // preset.num_candidates
    return min(max(steps, preset.min_steps), preset.max_steps), preset.num_candidates
EXEMPLAR_SELECTIONS = ("random", "constant", "hard_diverse")
SELECTIONS = ("auto", "train", "validation")
DEFAULT_MAX_ERRORS = 10
SettingKind = Literal["search", "continuable", "execution"]

GROUPS = ("metric", "models", "search", "meta-prompt", "targets", "final selection", "budget", "execution",
          "record", "observing")


def setting(default: Any = dataclasses.MISSING, *, doc: str, group: str, kind: SettingKind = "search",
            compare: bool = True) -> Any:
    """A field of :class:`OPROConfig` with its documentation (the constructor's ``Args:`` text), group and kind."""
    metadata = {"doc": " ".join(doc.split()), "group": group, "kind": kind}
    if default is dataclasses.MISSING:
        return field(metadata=metadata, compare=compare)
    return field(default=default, metadata=metadata, compare=compare)


def _check_model(name: str, model: Any) -> None:
    if model is None:
        return
    if not isinstance(model, (dspy.BaseLM, str)):
        raise TypeError(f"{name} must be a dspy.LM or a LiteLLM model string such as 'openai/gpt-4o'; got {model!r}")
    if isinstance(model, str) and not model.strip():
        raise ValueError(f"{name} is an empty string; pass a LiteLLM model string such as 'openai/gpt-4o'")


def resolve_model(model: dspy.BaseLM | str | None) -> dspy.BaseLM | None:
    """A LiteLLM model string becomes ``dspy.LM(model, engine="litellm")``; an LM or None stays as it is."""
    return dspy.LM(model, engine="litellm") if isinstance(model, str) else model


def model_name(model: Any) -> str | None:
    """The name a run records for a model (``dspy.LM.model``), or None."""
    return getattr(model, "model", None) if model is not None else None


@dataclass(frozen=True)
class Models:
    """The three models of a run, resolved at ``compile`` time (``None`` settings fall back to ``dspy.settings``)."""

    prompt: dspy.BaseLM
    task: dspy.BaseLM
    judge: dspy.BaseLM | None

    def named(self) -> dict[str, str | None]:
        """The model names the run records and fingerprints."""
        return {"prompt_model": model_name(self.prompt), "task_model": model_name(self.task),
                "judge_model": model_name(self.judge)}


@dataclass(frozen=True, kw_only=True)
class OPROConfig:
    """Every setting of one OPRO run; see :class:`dspy_opro.OPROTeleprompter` for the constructor."""

    metric: Callable[..., Any] = setting(
        group="metric",
        doc="""``metric(example, prediction, trace=None)`` or ``metric(example, prediction)`` (as for
        ``dspy.Evaluate``; ``trace`` is passed only where the metric takes it) returning a float in [0, 1], a bool,
        or a ``dspy.Prediction(score=..., feedback=...)``. For label-free OPRO (no labels, no metric) pass
        ``dspy_opro.PairwisePreference(judge_model=...)``.""")
    # models
    prompt_model: dspy.BaseLM | str | None = setting(
        None, group="models",
        doc="""The optimizer model: a ``dspy.LM`` or a LiteLLM model string (which becomes
        ``dspy.LM(model, engine="litellm")``). ``None``: ``dspy.settings.lm``.""")
    task_model: dspy.BaseLM | str | None = setting(
        None, group="models",
        doc="""The model that runs the program while scoring: a ``dspy.LM`` or a LiteLLM model string. ``None``:
        ``dspy.settings.lm``.""")
    # search
    initial_instructions: Sequence[str] | Mapping[str, Sequence[str]] | None = setting(
        None, group="search",
        doc="""Extra starting instructions, scored on the training set at step -1 beside the program's own (the
        authors' list of initial instructions): each enters the meta-prompt history with its score and can be
        selected like any candidate. A list is for a program with one target predictor; with several, a mapping
        ``{predictor name: [instructions]}``. A repeat of the predictor's own instruction or of an earlier text is
        recorded as skipped, not scored. None: only the program's own.""")
    auto: Auto | None = setting(
        None, group="search", kind="continuable",
        doc="""``"light"``, ``"medium"`` or ``"heavy"``: a preset of ``num_steps`` and ``num_candidates`` scaled by
        the training set's size (see the table of presets in the documentation), resolved at ``compile`` and
        recorded; an explicit ``num_steps`` or ``num_candidates`` wins over it. None: no preset.""")
    num_steps: int | None = setting(
        None, group="search", kind="continuable",
        doc="""Optimization steps; each sends the meta-prompt ``num_candidates`` times. None: 10, or the ``auto``
        preset's.""")
    num_candidates: int | None = setting(
        None, group="search", doc="Optimizer samples per step (the authors' 8). None: 8, or the ``auto`` preset's.")
    num_exemplars: int = setting(
        3, group="search", doc="Training problems shown in each meta-prompt (the authors' 3); 0 shows none.")
    exemplar_selection: ExemplarSelection | HardDiverse = setting(
        "random", group="search",
        doc="""``"random"`` (the authors' default: a new draw per step), ``"constant"`` (the same draw every step)
        or ``"hard_diverse"`` (problems the instructions fail, spread out by a DPP); ``HardDiverse(theta=...)``
        sets the DPP's trade-off (0: diversity alone, 1: difficulty alone; the default 0.7).""")
    # meta-prompt
    max_num_instructions: int = setting(
        20, group="meta-prompt", doc="How many of the best instructions the meta-prompt shows (the authors' 20).")
    score_threshold: float = setting(
        0.0, group="meta-prompt", doc="Instructions scoring below this (0 to 1) are not shown; 0 disables it.")
    num_score_buckets: int | float = setting(
        100, group="meta-prompt",
        doc="""Scores are shown as integers from 0 to this number; ``math.inf`` shows them rounded to three
        decimals.""")
    optimizer_family: Literal["gpt", "palm"] = setting(
        "gpt", group="meta-prompt",
        doc="``\"gpt\"`` or ``\"palm\"``: which of the authors' meta-prompt wordings to use.")
    instruction_pos: Literal["before_Q", "Q_begin", "Q_end"] = setting(
        "Q_begin", group="meta-prompt",
        doc="""Where the instruction sits, in the meta-prompt's problems and in the program alike: ``"Q_begin"``
        or ``"before_Q"`` (the predictor's instructions, before the inputs; ``"before_Q"`` needs
        ``include_qa=True``) or ``"Q_end"`` (an input field after the inputs). The authors' ``"A_begin"`` (the start
        of the answer) is refused: DSPy cannot start a model's answer with a given text.""")
    include_qa: bool = setting(False, group="meta-prompt", doc="Render exemplars with ``Q:``/``A:`` markers.")
    meta_prompt_type: Literal["both_instructions_and_exemplars", "instructions_only"] = setting(
        "both_instructions_and_exemplars", group="meta-prompt",
        doc="``\"both_instructions_and_exemplars\"`` (the paper) or ``\"instructions_only\"``.")
    task_description: str = setting(
        "", group="meta-prompt",
        doc="The task words of an ``instructions_only`` meta-prompt, e.g. ``\"grade school math\"``.")
    max_instruction_chars: int | None = setting(
        None, group="meta-prompt",
        doc="Skip proposed instructions longer than this (the authors use 500); None: no limit.")
    temperature: float = setting(
        1.0, group="meta-prompt", doc="Sampling temperature of the optimizer model (the authors' 1.0).")
    max_tokens: int = setting(1024, group="meta-prompt", doc="Maximum tokens of one optimizer reply.")
    # targets
    predictors: Sequence[str] | None = setting(
        None, group="targets",
        doc="Names (as in ``program.named_predictors()``) of the predictors to optimize; None: all.")
    # final selection
    select: Literal["auto", "train", "validation"] = setting(
        "auto", group="final selection",
        doc="""``"train"`` returns the best training score (the paper's setting); ``"validation"`` scores the
        ``top_k`` best on training on the valset and returns the best validation mean; ``"auto"`` is
        ``"validation"`` when ``compile`` gets a valset and ``"train"`` otherwise (as MIPROv2 and GEPA use a
        valset); the log says which.""")
    top_k: int = setting(
        3, group="final selection",
        doc="Candidates scored on the valset by ``select=\"validation\"`` and ``val_gate``.")
    val_gate: bool | ValGate = setting(
        False, group="final selection",
        doc="""Return the best candidate only if it beats the starting program on the valset (``True``, or
        ``ValGate(min_delta=...)`` to ask for a margin, in [0, 1]: 0, the default, asks for strictly better);
        otherwise return the starting program unchanged.""")
    # budget
    max_metric_calls: int | None = setting(
        None, group="budget", kind="continuable",
        doc="""Budget in evaluations (one program run plus its metric on one example), training and validation
        together; the run stops cleanly when the next evaluation would exceed it.""")
    max_cost: float | None = setting(
        None, group="budget", kind="continuable",
        doc="Budget in USD, from the recorded cost of both models; the run stops cleanly once reached.")
    racing: bool | Racing = setting(
        False, group="budget",
        doc="""Score a step's new candidates block by block in one seeded order of the training examples and stop
        a candidate once an exact sequential test says its training mean is below the bar: the best at the start
        of its step, raised by the step's leaders (the front-runners after the third and fourth looks, run in full
        first). ``True``, or ``Racing(alpha=...)`` for the test's level (the probability of stopping a
        candidate at least as good as every bar; the default 0.05). A stopped candidate is recorded ``raced_out``
        with its partial mean, which the meta-prompts show; only fully scored candidates can be returned.""")
    # execution
    num_threads: int | None = setting(
        None, group="execution", kind="execution",
        doc="Parallel evaluations (and optimizer calls); None: ``dspy.settings.num_threads`` or 1.")
    executor: cf.Executor | None = setting(
        None, group="execution", kind="execution", compare=False,
        doc="""A ``concurrent.futures.Executor`` to run evaluations on instead of threads (for example
        ``distributed.Client(...).get_executor()``).""")
    timeout: float | None = setting(
        900.0, group="execution", kind="execution",
        doc="""Seconds an evaluation (the program and its metric on one example) may take before it is abandoned
        as an infrastructure failure: retried once, then its candidate is left unscored, and compiling again scores
        it. The default, 15 minutes, lets a long agent run (dozens of tool-calling turns, each LM call bounded by
        the client's own request timeout, LiteLLM's 10 minutes) finish, and still ends a hung request or a program
        that never returns. None: no limit.""")
    failure_score: float = setting(
        0.0, group="execution",
        doc="The score of a run whose program raised (other than an infrastructure failure).")
    max_errors: int | None = setting(
        DEFAULT_MAX_ERRORS, group="execution", kind="continuable",
        doc="""How many errors one ``compile`` tolerates before it stops (as in ``dspy.Evaluate`` and MIPROv2,
        whose default, 10, it keeps): exceptions of the metric and of the program, except a task model's answer
        DSPy could not parse (the instruction's doing, scored ``failure_score`` like any wrong answer). A
        tolerated error scores ``failure_score`` and is logged and recorded; the next one stops the run with
        everything kept. 10 lets a rare bad example (a missing label, an odd input) cost one score instead of a
        paid run, while a systematic bug stops within a few evaluations; 0 stops at the first; None: no limit.""")
    # record
    log_dir: str | os.PathLike[str] | None = setting(
        None, group="record", kind="execution",
        doc="""Folder for the run record (``state.json``), step reports and the final report; compiling again with
        the same folder resumes the run.""")
    seed: int = setting(
        0, group="record",
        doc="Seeds exemplar draws and optimizer rollout ids; 0 reproduces the authors' exemplar draws.")
    # observing
    display_progress: bool = setting(
        True, group="observing", kind="execution",
        doc="""Show a progress bar per scoring phase (as ``dspy.Evaluate``'s switch), on a terminal or in a
        notebook; output to a file or pipe shows none either way.""")
    track_stats: bool = setting(
        False, group="observing", kind="execution",
        doc="""Attach the whole run record to the returned program wherever it goes (as GEPA's
        ``detailed_results``): ``program.save(path, save_program=True)`` then carries every meta-prompt and
        score. False: the saved program carries a short summary (``OPRORunSummary``: the selected candidate, its
        score and step, the record's folder), and the record stays in ``log_dir``.""")

    def __post_init__(self) -> None:
        # Normalise before checking, so that the frozen values are the ones checked.
        if self.auto is None:  # without a preset, None is the authors' value
            if self.num_steps is None:
                object.__setattr__(self, "num_steps", DEFAULT_NUM_STEPS)
            if self.num_candidates is None:
                object.__setattr__(self, "num_candidates", DEFAULT_NUM_CANDIDATES)
        if self.predictors is not None and not isinstance(self.predictors, str):
            object.__setattr__(self, "predictors", tuple(self.predictors))
        # Checked and frozen here: a list becomes a tuple, a mapping a dict of tuples.
        object.__setattr__(self, "initial_instructions", check_initial_instructions(self.initial_instructions))
        if isinstance(self.log_dir, os.PathLike):
            object.__setattr__(self, "log_dir", os.fspath(self.log_dir))
        self._check()

    def _check(self) -> None:
        metric = self.metric
        if metric is None:
            raise ValueError(
                "no metric: pass metric=my_metric (metric(example, prediction, trace=None) -> float in [0, 1]); "
                "for label-free OPRO pass metric=dspy_opro.PairwisePreference(judge_model=...)"
            )
        if not callable(metric):
            raise TypeError(f"metric must be callable as metric(example, prediction, trace=None); got {metric!r}")
        metric_takes_trace(metric)  # refuses a metric that cannot take (example, prediction)
        for name in ("prompt_model", "task_model"):
            _check_model(name, getattr(self, name))
        if self.auto is not None:
            require_choice("auto", self.auto, tuple(AUTO_PRESETS), meaning=" or None")
        require_int("num_steps", self.num_steps, minimum=0, allow_none=True)
        require_int("num_candidates", self.num_candidates, minimum=1, allow_none=True)
        require_int("num_exemplars", self.num_exemplars, minimum=0)
        if not isinstance(self.exemplar_selection, HardDiverse):
            require_choice("exemplar_selection", self.exemplar_selection, EXEMPLAR_SELECTIONS,
                           meaning=" or dspy_opro.HardDiverse(theta=...)")
        check_instruction_pos(self.instruction_pos)  # where the program can put the text; A_begin it cannot
        validate_meta_prompt_options(
            optimizer_family=self.optimizer_family, instruction_pos=self.instruction_pos,
            meta_prompt_type=self.meta_prompt_type, include_qa=self.include_qa,
            num_score_buckets=self.num_score_buckets, max_num_instructions=self.max_num_instructions,
            score_threshold=self.score_threshold)
        if not isinstance(self.task_description, str):
            raise TypeError(f"task_description must be a string; got {self.task_description!r}")
        require_int("max_instruction_chars", self.max_instruction_chars, minimum=1, allow_none=True)
        require_number("temperature", self.temperature, low=0.0, high=2.0)
        require_int("max_tokens", self.max_tokens, minimum=1)
        predictors = self.predictors
        if predictors is not None and (isinstance(predictors, str) or not predictors
                                       or not all(isinstance(p, str) for p in predictors)):
            raise TypeError(f"predictors must be a non-empty list of predictor names; got {predictors!r}")
        require_choice("select", self.select, SELECTIONS)
        require_int("top_k", self.top_k, minimum=1)
        if not isinstance(self.val_gate, ValGate):
            require_bool("val_gate", self.val_gate)
        if self.label_free and (self.select not in ("auto", "train") or self.val_gate):
            raise ValueError(
                "label-free OPRO (metric=PairwisePreference(...)) selects by its own gate: the best candidate is "
                "returned only if its mean preference over the starting program on the valset is above 0; drop "
                "select and val_gate"
            )
        require_int("max_metric_calls", self.max_metric_calls, minimum=1, allow_none=True)
        require_number("max_cost", self.max_cost, low=0.0, high=math.inf, allow_none=True)
        if not isinstance(self.racing, Racing):
            require_bool("racing", self.racing)
        require_int("num_threads", self.num_threads, minimum=1, allow_none=True)
        if self.executor is not None and not isinstance(self.executor, cf.Executor):
            raise TypeError(f"executor must be a concurrent.futures.Executor; got {self.executor!r}")
        require_number("timeout", self.timeout, low=0.0, high=math.inf, allow_none=True)
        if self.timeout == 0:
            raise ValueError("timeout=0 would abandon every evaluation; pass seconds > 0, or None for no limit")
        require_number("failure_score", self.failure_score, low=0.0, high=1.0)
        require_int("max_errors", self.max_errors, minimum=0, allow_none=True, meaning=" (0 stops at the first)")
        if self.log_dir is not None and not isinstance(self.log_dir, str):
            raise TypeError(f"log_dir must be a folder path (str or os.PathLike); got {self.log_dir!r}")
        if isinstance(self.log_dir, str) and not self.log_dir.strip():
            raise LogDirError(f"log_dir={self.log_dir!r} names no folder; pass a folder path (for example "
                              "log_dir='runs/opro') to keep a crash-safe run record, or log_dir=None to keep none")
        require_int("seed", self.seed, minimum=0)
        require_bool("display_progress", self.display_progress)
        require_bool("track_stats", self.track_stats)

    # ------------------------------------------------------------------------------------------------------------
    # The auto presets

    def for_trainset(self, n_train: int) -> OPROConfig:
        """The configuration a run of ``n_train`` training examples uses: the ``auto`` preset resolved into
        ``num_steps`` and ``num_candidates`` (explicit values kept). Without a preset, the configuration itself."""
        if self.auto is None:
            return self
        steps, candidates = auto_plan(self.auto, n_train)
        return dataclasses.replace(self, num_steps=self.num_steps if self.num_steps is not None else steps,
                                   num_candidates=self.num_candidates if self.num_candidates is not None
                                   else candidates)

    @property
    def steps(self) -> int:
        """``num_steps``, resolved (:meth:`for_trainset`)."""
        if self.num_steps is None:
            raise ValueError("num_steps is not resolved: call for_trainset(len(trainset)) first")
        return self.num_steps

    @property
    def candidates(self) -> int:
        """``num_candidates``, resolved (:meth:`for_trainset`)."""
        if self.num_candidates is None:
            raise ValueError("num_candidates is not resolved: call for_trainset(len(trainset)) first")
        return self.num_candidates

    def params(self) -> dict[str, Any]:
        """The settings by name, as ``OPROTeleprompter.get_params()`` returns them: the metric, the models and the
        executor as given, every other setting JSON-serialisable (an option object as its fields)."""
        params: dict[str, Any] = {}
        for spec in dataclasses.fields(self):
            value = getattr(self, spec.name)
            if spec.name in OBJECT_SETTINGS:
                params[spec.name] = value
            elif dataclasses.is_dataclass(value) and not isinstance(value, type):
                params[spec.name] = dataclasses.asdict(value)
            else:
                params[spec.name] = _recorded(spec.name, value)
        return params

    # ------------------------------------------------------------------------------------------------------------
    # What the options mean

    @property
    def folder(self) -> str | None:
        """``log_dir`` as a string path (it is normalised at construction)."""
        return os.fspath(self.log_dir) if self.log_dir is not None else None

    @property
    def initial(self) -> InitialInstructions | None:
        """``initial_instructions`` as frozen at construction: a tuple of texts, or a dict of tuples per predictor."""
        return check_initial_instructions(self.initial_instructions)

    @property
    def label_free(self) -> bool:
        """Label-free OPRO: the metric judges runs against the starting program's (an anchored metric)."""
        return isinstance(self.metric, AnchoredMetric)

    @property
    def racing_options(self) -> Racing | None:
        return Racing() if self.racing is True else (self.racing or None)  # type: ignore[return-value]

    @property
    def hard_diverse_options(self) -> HardDiverse | None:
        if isinstance(self.exemplar_selection, HardDiverse):
            return self.exemplar_selection
        return HardDiverse() if self.exemplar_selection == "hard_diverse" else None

    @property
    def val_gate_options(self) -> ValGate | None:
        return ValGate() if self.val_gate is True else (self.val_gate or None)  # type: ignore[return-value]

    @property
    def valset_needed_by(self) -> str | None:
        """The setting that needs a valset, if one does."""
        if self.val_gate_options is not None:
            return "val_gate=True"
        if self.select == "validation":
            return "select='validation'"
        return None

    def scoring_policy(self) -> ScoringPolicy | None:
        """The policy of a step's new candidates' scoring: racing's, or None for the paper's full scoring."""
        options = self.racing_options
        if options is None:
            return None
        from dspy_opro.extensions.racing import RacingPolicy  # numpy, and only when racing

        return RacingPolicy(alpha=options.alpha, seed=self.seed)

    def exemplar_policy(self) -> ExemplarPolicy:
        """Which problems the meta-prompts show: the authors' uniform draw, or the hard-and-diverse DPP."""
        options = self.hard_diverse_options
        if options is None:
            return UniformExemplars(criteria=str(self.exemplar_selection), seed=self.seed)
        from dspy_opro.extensions.hard_diverse import HardDiverseExemplars

        return HardDiverseExemplars(theta=options.theta)

    def resolved_select(self, *, has_valset: bool) -> Literal["train", "validation"]:
        """``select`` with ``"auto"`` resolved: validation when there is a valset to select on, else training.

        A gate (``val_gate``, label-free OPRO) selects by its own rule, so ``"auto"`` resolves to the paper's
        ``"train"`` there, as before the setting existed.
        """
        if self.select != "auto":
            return self.select
        return "validation" if has_valset and not self.label_free and self.val_gate_options is None else "train"

    def selection_policy(self, *, has_valset: bool = False) -> SelectionPolicy:
        """How the result is chosen: the anchored metric's gate, the validation gate, validation, or training.

        Args:
            has_valset: Whether ``compile`` got a valset (``select="auto"`` selects on it then).
        """
        if isinstance(self.metric, AnchoredMetric):
            return self.metric.selection_policy()
        gate = self.val_gate_options
        if gate is not None:
            from dspy_opro.extensions.val_gate import ValGatePolicy

            return ValGatePolicy(top_k=self.top_k, min_delta=gate.min_delta)
        if self.resolved_select(has_valset=has_valset) == "validation":
            return OnValidation(top_k=self.top_k)
        return OnTraining()

    def resolve_models(self) -> Models:
        """The run's models: strings become LiteLLM models, ``None`` the LM of ``dspy.configure``."""
        task = resolve_model(self.task_model) or dspy.settings.lm
        if task is None:
            raise ValueError("no task model: pass task_model=... or dspy.configure(lm=...)")
        prompt = resolve_model(self.prompt_model) or dspy.settings.lm
        if prompt is None:
            raise ValueError("no optimizer model: pass prompt_model=... or dspy.configure(lm=...)")
        judge = self.metric.judge_model if isinstance(self.metric, AnchoredMetric) else None
        return Models(prompt=prompt, task=task, judge=judge)

    # ------------------------------------------------------------------------------------------------------------
    # What a run records and fingerprints, derived from the fields' kinds

    def recorded_settings(self, models: Models, targets: Sequence[str], *, has_valset: bool = False) -> dict[str, Any]:
        """What the run record stores as its configuration: every search and continuable setting, the resolved
        model names, the targets and the metric's fingerprint. ``select="auto"`` is recorded resolved, so that a
        run fingerprints as the explicit setting it amounts to."""
        settings: dict[str, Any] = {}
        for spec in dataclasses.fields(self):
            if spec.metadata["kind"] != "execution":
                settings[spec.name] = _recorded(spec.name, getattr(self, spec.name))
        # An option object and its shorthand record alike (racing=True is racing=Racing()).
        racing, gate, diverse = self.racing_options, self.val_gate_options, self.hard_diverse_options
        settings["racing"] = dataclasses.asdict(racing) if racing is not None else False
        settings["val_gate"] = dataclasses.asdict(gate) if gate is not None else False
        if diverse is not None:
            settings["exemplar_selection"] = {"hard_diverse": dataclasses.asdict(diverse)}
        settings["select"] = self.resolved_select(has_valset=has_valset)
        settings.update(models.named())
        settings["label_free"] = self.label_free
        settings["targets"] = list(targets)
        return json.loads(json.dumps(settings, default=str))  # numpy numbers and the like as JSON has them

    def fingerprint(self, models: Models, targets: Sequence[str], *, trainset: Sequence[dspy.Example],
                    valset: Sequence[dspy.Example], program: dspy.Module) -> Fingerprint:
        """What decides the run's results; resuming under a different fingerprint is refused."""
        continuable = {spec.name for spec in dataclasses.fields(self) if spec.metadata["kind"] == "continuable"}
        has_valset = bool(valset)
        settings = {key: value for key, value in self.recorded_settings(models, targets, has_valset=has_valset).items()
                    if key not in continuable}
        uses_valset = self.selection_policy(has_valset=has_valset).uses_valset
        return Fingerprint(config=digest(settings), trainset=dataset_fingerprint(trainset),
                           valset=dataset_fingerprint(valset if uses_valset else []),
                           program=program_fingerprint(program), settings=settings)


def _recorded(name: str, value: Any) -> Any:
    """A setting as the run record stores it (JSON-able)."""
    if name == "metric":
        if isinstance(value, AnchoredMetric):  # its settings, not its judge's object identity
            kind = type(value)
            return f"{kind.__module__}.{kind.__qualname__}#{digest(value.settings())}"
        return callable_fingerprint(value)
    if name in ("prompt_model", "task_model"):
        return value if isinstance(value, str) or value is None else model_name(value)
    if name == "initial_instructions":
        return initial_settings(value)
    if name == "num_score_buckets" and value == math.inf:
        return "inf"
    if isinstance(value, tuple):
        return list(value)
    return value


def settings_docstring() -> str:
    """The constructor's ``Args:`` section, from the fields' documentation, grouped as the constructor is."""
    lines = ["Args:"]
    group = None
    for spec in dataclasses.fields(OPROConfig):
        if group is not None and spec.metadata["group"] != group:
            lines.append("")
        group = spec.metadata["group"]
        lines.append(f"{spec.name}: {spec.metadata['doc']}")
    return "\n".join(lines)


# Settings that may change between a run and its resumption: budgets stop a run cleanly and a larger one continues
# it, and a larger num_steps continues a finished run from its last step.
CONTINUABLE_SETTINGS = tuple(spec.name for spec in dataclasses.fields(OPROConfig)
                             if spec.metadata["kind"] == "continuable")

__all__ = ["AUTO_PRESETS", "CONTINUABLE_SETTINGS", "AutoPreset", "Models", "OPROConfig", "auto_plan", "model_name",
           "resolve_model", "settings_docstring"]
