"""The settings of an :class:`~dspy_opro.OPROTeleprompter`: their checks, the ``auto`` presets, and what a run
records and fingerprints of them.

The settings are the constructor's keyword arguments, kept as plain attributes of the teleprompter (as DSPy's
optimizers keep theirs), checked when it is made and again at ``compile``, so that one set afterwards
(``optimizer.num_threads = 8``) is checked before any LM call too. Everything else is derived from the constructor's
signature: each setting is of one kind,

* a *search* setting shapes the results: recorded in the run record (``state.config``) and fingerprinted, so a resumed
  run must have the same;
* a *continuable* one (:data:`CONTINUABLE`: the budgets, ``num_steps``, ``auto``, ``max_errors``) is recorded but not
  fingerprinted: a stopped or finished run continues under larger ones;
* an *execution* one (:data:`EXECUTION`: threads, executor, folder, progress bar) shapes no result and is neither.

The options beyond the authors become the run's policies here (:func:`scoring_policy`, :func:`exemplar_policy`,
:func:`selection_policy`), importing an extension's module only when it is used.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import dspy

from dspy_opro.checks import require_bool, require_choice, require_int, require_number
from dspy_opro.core.exemplars import ExemplarPolicy, UniformExemplars
from dspy_opro.core.initial import check_initial_instructions, initial_settings
from dspy_opro.core.meta_prompt import MetaPromptOptions
from dspy_opro.core.selection import OnTraining, OnValidation, SelectionPolicy
from dspy_opro.errors import LogDirError
from dspy_opro.extensions import HardDiverse, Racing, ValGate
from dspy_opro.scoring.evaluation import AnchoredMetric, metric_takes_trace
from dspy_opro.state import Fingerprint, config_digest, digest
from dspy_opro.task.placement import check_instruction_pos
from dspy_opro.task.programs import callable_fingerprint, dataset_fingerprint, program_fingerprint

DEFAULT_NUM_STEPS = 10
DEFAULT_NUM_CANDIDATES = 8
CONTINUABLE = ("auto", "num_steps", "max_metric_calls", "max_cost", "max_errors")
EXECUTION = ("num_threads", "executor", "timeout", "log_dir", "display_progress", "track_stats")
OBJECTS = ("metric", "prompt_model", "task_model", "executor")  # get_params() returns these as given
META_PROMPT = ("optimizer_family", "instruction_pos", "meta_prompt_type", "include_qa", "score_threshold",
               "max_num_instructions", "num_score_buckets", "task_description")


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


RACING_STEPS = 2  # a racing preset runs up to this many times its full-evaluation steps, in the same budget


def auto_plan(auto: str, n_train: int) -> tuple[int, int]:
    """``(num_steps, num_candidates)`` of an ``auto`` preset for ``n_train`` training examples, evaluated in full."""
    preset = AUTO_PRESETS[auto]
    steps = (preset.evaluations // max(n_train, 1) - 1) // preset.num_candidates
    return min(max(steps, preset.min_steps), preset.max_steps), preset.num_candidates


def races_a_preset(opt: Any) -> bool:
    """Whether an ``auto`` preset spends racing's savings: it races and sets the steps itself."""
    return opt.auto is not None and opt.num_steps is None and racing_options(opt.racing, auto=opt.auto) is not None


def resolved_search(opt: Any, n_train: int) -> tuple[int, int]:
    """``(num_steps, num_candidates)`` a run of ``n_train`` examples uses: explicit values, else the ``auto``
    preset's (up to :data:`RACING_STEPS` times more steps when it races, within the budget of full evaluation:
    :func:`resolved_budget`), else the authors' 10 and 8."""
    steps, candidates = auto_plan(opt.auto, n_train) if opt.auto is not None else (DEFAULT_NUM_STEPS,
                                                                                  DEFAULT_NUM_CANDIDATES)
    if races_a_preset(opt):
        steps *= RACING_STEPS
    return (opt.num_steps if opt.num_steps is not None else steps,
            opt.num_candidates if opt.num_candidates is not None else candidates)


def resolved_budget(opt: Any, n_train: int, validation: int) -> int | None:
    """The run's ``max_metric_calls``: the one given, else for a racing ``auto`` preset the evaluations its search
    would make evaluated in full (training, and ``validation`` ones), so that racing buys more steps, not a smaller
    bill; else None."""
    if opt.max_metric_calls is not None or not races_a_preset(opt):
        return opt.max_metric_calls
    steps, candidates = auto_plan(opt.auto, n_train)
    return n_train * (1 + steps * (opt.num_candidates or candidates)) + validation


# ---------------------------------------------------------------------------------------------------------------
# Checks


def _check_model(name: str, model: Any) -> None:
    if model is not None and not isinstance(model, (dspy.BaseLM, str)):
        raise TypeError(f"{name} must be a dspy.LM or a LiteLLM model string such as 'openai/gpt-4o'; got {model!r}")
    if isinstance(model, str) and not model.strip():
        raise ValueError(f"{name} is an empty string; pass a LiteLLM model string such as 'openai/gpt-4o'")


def meta_prompt_options(opt: Any) -> MetaPromptOptions:
    """The meta-prompt's options of ``opt``, checked (one value for the whole run)."""
    check_instruction_pos(opt.instruction_pos)  # where the program can put the text; A_begin it cannot
    return MetaPromptOptions(**{name: getattr(opt, name) for name in META_PROMPT})


def check_settings(opt: Any) -> None:
    """Refuse a bad setting of the teleprompter ``opt`` with an error that names it and the fix.

    Raises:
        TypeError, ValueError: The first bad setting.
    """
    metric = opt.metric
    if metric is None:
        raise ValueError("no metric: pass metric=my_metric (metric(example, prediction, trace=None) -> float in "
                         "[0, 1]); for label-free OPRO pass metric=dspy_opro.PairwisePreference(judge_model=...)")
    if not callable(metric):
        raise TypeError(f"metric must be callable as metric(example, prediction, trace=None); got {metric!r}")
    metric_takes_trace(metric)  # refuses a metric that cannot take (example, prediction)
    _check_model("prompt_model", opt.prompt_model)
    _check_model("task_model", opt.task_model)
    check_initial_instructions(opt.initial_instructions)
    if opt.auto is not None:
        require_choice("auto", opt.auto, tuple(AUTO_PRESETS), meaning=" or None")
    require_int("num_steps", opt.num_steps, minimum=0, allow_none=True)
    require_int("num_candidates", opt.num_candidates, minimum=1, allow_none=True)
    require_int("num_exemplars", opt.num_exemplars, minimum=0)
    if not isinstance(opt.exemplar_selection, HardDiverse):
        require_choice("exemplar_selection", opt.exemplar_selection, ("random", "constant", "hard_diverse"),
                       meaning=" or dspy_opro.HardDiverse(theta=...)")
    meta_prompt_options(opt)
    require_int("max_instruction_chars", opt.max_instruction_chars, minimum=1, allow_none=True)
    require_number("temperature", opt.temperature, low=0.0, high=2.0)
    require_int("max_tokens", opt.max_tokens, minimum=1)
    predictors = opt.predictors
    if predictors is not None and (isinstance(predictors, str) or not predictors
                                   or not all(isinstance(p, str) for p in predictors)):
        raise TypeError(f"predictors must be a non-empty list of predictor names; got {predictors!r}")
    require_choice("select", opt.select, ("auto", "train", "validation"))
    require_int("top_k", opt.top_k, minimum=1)
    if not isinstance(opt.val_gate, ValGate):
        require_bool("val_gate", opt.val_gate)
    if isinstance(metric, AnchoredMetric) and (opt.select not in ("auto", "train") or opt.val_gate):
        raise ValueError("label-free OPRO (metric=PairwisePreference(...)) selects by its own gate: the best "
                         "candidate is returned only if its mean preference over the starting program on the valset "
                         "is above 0; drop select and val_gate")
    require_int("max_metric_calls", opt.max_metric_calls, minimum=1, allow_none=True)
    require_number("max_cost", opt.max_cost, low=0.0, high=math.inf, allow_none=True)
    if opt.racing is not None and not isinstance(opt.racing, Racing):
        require_bool("racing", opt.racing)
    require_int("num_threads", opt.num_threads, minimum=1, allow_none=True)
    if opt.executor is not None and not isinstance(opt.executor, cf.Executor):
        raise TypeError(f"executor must be a concurrent.futures.Executor; got {opt.executor!r}")
    require_number("timeout", opt.timeout, low=0.0, high=math.inf, allow_none=True)
    if opt.timeout == 0:
        raise ValueError("timeout=0 would abandon every evaluation; pass seconds > 0, or None for no limit")
    require_number("failure_score", opt.failure_score, low=0.0, high=1.0)
    require_int("max_errors", opt.max_errors, minimum=0, allow_none=True, meaning=" (0 stops at the first)")
    log_dir = opt.log_dir
    if log_dir is not None and not isinstance(log_dir, (str, os.PathLike)):
        raise TypeError(f"log_dir must be a folder path (str or os.PathLike); got {log_dir!r}")
    if isinstance(log_dir, str) and not log_dir.strip():
        raise LogDirError(f"log_dir={log_dir!r} names no folder; pass a folder path (for example log_dir="
                          "'runs/opro') to keep a crash-safe run record, or log_dir=None to keep none")
    require_int("seed", opt.seed, minimum=0)
    require_bool("display_progress", opt.display_progress)
    require_bool("track_stats", opt.track_stats)


# ---------------------------------------------------------------------------------------------------------------
# What the options mean


def racing_options(value: bool | Racing | None, *, auto: str | None = None) -> Racing | None:
    """Racing's options, or None for full evaluation. ``None`` (the default) races under an ``auto`` preset (ours,
    not the paper's setting) and evaluates in full otherwise."""
    if value is None:
        return Racing() if auto is not None else None
    return Racing() if value is True else value or None


def val_gate_options(value: bool | ValGate) -> ValGate | None:
    return ValGate() if value is True else value or None


def hard_diverse_options(value: str | HardDiverse) -> HardDiverse | None:
    return value if isinstance(value, HardDiverse) else HardDiverse() if value == "hard_diverse" else None


def valset_needed_by(opt: Any) -> str | None:
    """The setting that needs a valset, if one does."""
    if val_gate_options(opt.val_gate) is not None:
        return "val_gate=True"
    return "select='validation'" if opt.select == "validation" else None


def resolved_select(opt: Any, *, has_valset: bool) -> Literal["train", "validation"]:
    """``select`` with ``"auto"`` resolved: validation when there is a valset to select on, else training (a gate,
    ``val_gate`` or label-free OPRO, selects by its own rule, so ``"auto"`` is the paper's ``"train"`` there)."""
    if opt.select != "auto":
        return opt.select  # type: ignore[no-any-return]
    gated = isinstance(opt.metric, AnchoredMetric) or val_gate_options(opt.val_gate) is not None
    return "validation" if has_valset and not gated else "train"


def selection_policy(opt: Any, *, has_valset: bool) -> SelectionPolicy:
    """How the result is chosen: the anchored metric's gate, the validation gate, validation, or training."""
    if isinstance(opt.metric, AnchoredMetric):
        return opt.metric.selection_policy()
    gate = val_gate_options(opt.val_gate)
    if gate is not None:
        from dspy_opro.extensions.val_gate import ValGatePolicy

        return ValGatePolicy(top_k=opt.top_k, min_delta=gate.min_delta)
    if resolved_select(opt, has_valset=has_valset) == "validation":
        return OnValidation(top_k=opt.top_k)
    return OnTraining()


def scoring_policy(opt: Any) -> Any:
    """Racing's scoring policy, or None for the paper's full scoring."""
    options = racing_options(opt.racing, auto=opt.auto)
    if options is None:
        return None
    from dspy_opro.extensions.racing import RacingPolicy  # numpy, and only when racing

    return RacingPolicy(alpha=options.alpha, seed=opt.seed)


def exemplar_policy(opt: Any) -> ExemplarPolicy:
    """Which problems the meta-prompts show: the authors' uniform draw, or the hard-and-diverse DPP."""
    options = hard_diverse_options(opt.exemplar_selection)
    if options is None:
        return UniformExemplars(criteria=str(opt.exemplar_selection), seed=opt.seed)
    from dspy_opro.extensions.hard_diverse import HardDiverseExemplars

    return HardDiverseExemplars(theta=options.theta)


# ---------------------------------------------------------------------------------------------------------------
# Models


def model_name(model: Any) -> str | None:
    """The name a run records for a model (``dspy.LM.model``), or None."""
    return getattr(model, "model", None) if model is not None else None


@dataclass(frozen=True)
class Models:
    """The three models of a run, resolved at ``compile`` (``None`` settings fall back to ``dspy.settings.lm``)."""

    prompt: dspy.BaseLM
    task: dspy.BaseLM
    judge: dspy.BaseLM | None

    @classmethod
    def resolve(cls, opt: Any) -> Models:
        """A LiteLLM model string becomes ``dspy.LM(model, engine="litellm")``; None the LM of ``dspy.configure``."""
        def resolve(model: Any) -> Any:
            return (dspy.LM(model, engine="litellm") if isinstance(model, str) else model) or dspy.settings.lm

        task, prompt = resolve(opt.task_model), resolve(opt.prompt_model)
        if task is None:
            raise ValueError("no task model: pass task_model=... or dspy.configure(lm=...)")
        if prompt is None:
            raise ValueError("no optimizer model: pass prompt_model=... or dspy.configure(lm=...)")
        judge = opt.metric.judge_model if isinstance(opt.metric, AnchoredMetric) else None
        return cls(prompt=prompt, task=task, judge=judge)

    def named(self) -> dict[str, str | None]:
        return {"prompt_model": model_name(self.prompt), "task_model": model_name(self.task),
                "judge_model": model_name(self.judge)}


# ---------------------------------------------------------------------------------------------------------------
# What a run records and fingerprints


def setting_value(name: str, value: Any) -> Any:
    """A setting as the run record and ``get_params()`` hold it (JSON-able; an option object as its fields)."""
    if name == "metric":
        if isinstance(value, AnchoredMetric):  # its settings, not its judge's object identity
            return f"{type(value).__module__}.{type(value).__qualname__}#{digest(value.settings())}"
        return callable_fingerprint(value)
    if name in ("prompt_model", "task_model"):
        return value if isinstance(value, str) or value is None else model_name(value)
    if name == "initial_instructions":
        return initial_settings(check_initial_instructions(value))
    if name == "num_score_buckets" and value == math.inf:
        return "inf"
    if name == "log_dir" and value is not None:
        return os.fspath(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return list(value) if isinstance(value, tuple | list) else value


def recorded_settings(opt: Any, names: Sequence[str], *, num_steps: int, num_candidates: int, models: Models,
                      targets: Sequence[str], has_valset: bool) -> dict[str, Any]:
    """What the run record stores as its configuration: every search and continuable setting (``num_steps`` and
    ``num_candidates`` resolved), the model names, the targets and the metric's fingerprint. An option and its
    shorthand record alike (``racing=True`` is ``racing=Racing()``); ``select="auto"`` is recorded resolved, so that
    a run fingerprints as the explicit setting it amounts to."""
    settings = {name: setting_value(name, getattr(opt, name)) for name in names if name not in EXECUTION}
    settings.update(num_steps=num_steps, num_candidates=num_candidates)
    racing, gate, diverse = racing_options(opt.racing, auto=opt.auto), val_gate_options(opt.val_gate), \
        hard_diverse_options(opt.exemplar_selection)
    settings["racing"] = dataclasses.asdict(racing) if racing is not None else False
    settings["val_gate"] = dataclasses.asdict(gate) if gate is not None else False
    if diverse is not None:
        settings["exemplar_selection"] = {"hard_diverse": dataclasses.asdict(diverse)}
    settings["select"] = resolved_select(opt, has_valset=has_valset)
    settings.update(models.named(), label_free=isinstance(opt.metric, AnchoredMetric), targets=list(targets))
    return json.loads(json.dumps(settings, default=str))  # numpy numbers and the like as JSON has them


def fingerprint(settings: dict[str, Any], *, trainset: Sequence[dspy.Example], valset: Sequence[dspy.Example],
                uses_valset: bool, program: dspy.Module) -> Fingerprint:
    """What decides the run's results (the recorded settings less the continuable ones); resuming under a different
    fingerprint is refused."""
    shaping = {key: value for key, value in settings.items() if key not in CONTINUABLE}
    return Fingerprint(config=config_digest(shaping), trainset=dataset_fingerprint(trainset),
                       valset=dataset_fingerprint(valset if uses_valset else []),
                       program=program_fingerprint(program), settings=shaping)


__all__ = ["AUTO_PRESETS", "CONTINUABLE", "EXECUTION", "RACING_STEPS", "AutoPreset", "Models", "auto_plan",
           "check_settings", "fingerprint", "meta_prompt_options", "races_a_preset", "recorded_settings",
           "resolved_budget", "resolved_search", "selection_policy"]
