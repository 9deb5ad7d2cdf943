"""The configuration of one OPRO run: every setting, validated once and frozen.

:class:`OPROTeleprompter` is DSPy's face of the optimizer; it builds an :class:`OPROConfig` in its constructor, so a
bad setting fails there, before any LM call, with a message that names the fix. The run reads the configuration and
never the teleprompter. The configuration alone says what a run records about its settings and what its resume
fingerprint covers:

* :meth:`OPROConfig.recorded_settings` is the JSON-able dictionary stored in the run record (``state.config``);
* :meth:`OPROConfig.fingerprint` digests what decides a run's results: the search settings (budgets and
  ``num_steps`` excepted, so that a stopped or finished run can continue), the resolved models, the metric's code,
  the trainset, the valset where the run uses it, and the program's structure, instructions and demos.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import dspy

from dspy_opro.checks import require_bool, require_choice, require_int, require_number
from dspy_opro.scoring.evaluation import metric_takes_trace
from dspy_opro.proposing.initial import InitialInstructions, check_initial_instructions, initial_settings
from dspy_opro.proposing.meta_prompt import validate_meta_prompt_options
from dspy_opro.task.placement import check_instruction_pos
from dspy_opro.task.programs import callable_fingerprint, dataset_fingerprint, program_fingerprint
from dspy_opro.record.state import Fingerprint, digest

ExemplarSelection = Literal["random", "constant", "hard_diverse"]
EXEMPLAR_SELECTIONS = ("random", "constant", "hard_diverse")
SELECTIONS = ("train", "validation")

# Settings that may change between a run and its resumption: budgets stop a run cleanly and a larger one continues
# it, and a larger num_steps continues a finished run from its last step.
CONTINUABLE_SETTINGS = ("num_steps", "max_metric_calls", "max_cost")


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


@dataclass(frozen=True)
class Models:
    """The three models of a run, resolved at ``compile`` time (``None`` settings fall back to ``dspy.settings``)."""

    prompt: dspy.BaseLM
    task: dspy.BaseLM
    judge: dspy.BaseLM | None

    def named(self) -> dict[str, str | None]:
        """The model names the run records and fingerprints."""
        return {"prompt_model": getattr(self.prompt, "model", None), "task_model": getattr(self.task, "model", None),
                "judge_model": getattr(self.judge, "model", None) if self.judge is not None else None}


@dataclass(frozen=True, kw_only=True)
class OPROConfig:
    """Every setting of one OPRO run; see :class:`dspy_opro.OPROTeleprompter` for what each one means."""

    metric: Callable[..., Any] | None = None
    # models
    prompt_model: dspy.BaseLM | str | None = None
    task_model: dspy.BaseLM | str | None = None
    judge_model: dspy.BaseLM | str | None = None
    # search
    initial_instructions: InitialInstructions | None = None
    num_steps: int = 10
    num_candidates: int = 8
    num_exemplars: int = 3
    exemplar_selection: ExemplarSelection = "random"
    diversity_theta: float = 0.7
    # meta-prompt
    max_num_instructions: int = 20
    score_threshold: float = 0.0
    num_score_buckets: int | float = 100
    optimizer_family: Literal["gpt", "palm"] = "gpt"
    instruction_pos: Literal["before_Q", "Q_begin", "Q_end"] = "Q_begin"
    include_qa: bool = False
    meta_prompt_type: Literal["both_instructions_and_exemplars", "instructions_only"] = (
        "both_instructions_and_exemplars"
    )
    task_description: str = ""
    max_instruction_chars: int | None = None
    temperature: float = 1.0
    max_tokens: int = 1024
    # targets
    predictors: tuple[str, ...] | None = None
    # final selection
    select: Literal["train", "validation"] = "train"
    top_k: int = 3
    val_gate: bool = False
    min_delta: float = 0.0
    both_orders: bool = False
    # budget
    max_metric_calls: int | None = None
    max_cost: float | None = None
    racing: bool = False
    racing_alpha: float = 0.05
    # execution
    num_threads: int | None = None
    executor: cf.Executor | None = field(default=None, compare=False)
    failure_score: float = 0.0
    # record
    log_dir: str | None = None
    seed: int = 0
    # observing (shapes no result: kept out of the search settings and the fingerprint)
    display_progress: bool = True

    def __post_init__(self) -> None:
        # Normalise before checking, so that the frozen values are the ones checked.
        if self.predictors is not None and not isinstance(self.predictors, str):
            object.__setattr__(self, "predictors", tuple(self.predictors))
        # Checked and frozen here: a list becomes a tuple, a mapping a dict of tuples.
        object.__setattr__(self, "initial_instructions", check_initial_instructions(self.initial_instructions))
        if isinstance(self.log_dir, os.PathLike):
            object.__setattr__(self, "log_dir", os.fspath(self.log_dir))
        self._check()

    def _check(self) -> None:
        metric = self.metric
        if metric is None and self.judge_model is None:
            raise ValueError(
                "no metric: pass metric=my_metric (metric(example, prediction, trace=None) -> float in [0, 1]); "
                "for label-free OPRO pass metric=None with judge_model=<dspy.LM> (your task model may judge itself)"
            )
        if metric is not None:
            if not callable(metric):
                raise TypeError(f"metric must be callable as metric(example, prediction, trace=None); got {metric!r}")
            metric_takes_trace(metric)  # refuses a metric that cannot take (example, prediction)
            if self.judge_model is not None:
                raise ValueError("judge_model is for label-free OPRO (metric=None); drop it or drop the metric")
        for name in ("prompt_model", "task_model", "judge_model"):
            _check_model(name, getattr(self, name))
        require_int("num_steps", self.num_steps, minimum=0)
        require_int("num_candidates", self.num_candidates, minimum=1)
        require_int("num_exemplars", self.num_exemplars, minimum=0)
        require_choice("exemplar_selection", self.exemplar_selection, EXEMPLAR_SELECTIONS)
        require_number("diversity_theta", self.diversity_theta, low=0.0, high=1.0)
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
        require_bool("val_gate", self.val_gate)
        if metric is None and (self.select != "train" or self.val_gate):
            raise ValueError(
                "label-free OPRO (metric=None) selects by its own gate: the best candidate is returned only if its "
                "mean preference over the starting program on the valset is above 0; drop select and val_gate"
            )
        require_number("min_delta", self.min_delta, low=0.0, high=1.0)
        require_bool("both_orders", self.both_orders)
        require_int("max_metric_calls", self.max_metric_calls, minimum=1, allow_none=True)
        require_number("max_cost", self.max_cost, low=0.0, high=math.inf, allow_none=True)
        require_bool("racing", self.racing)
        from dspy_opro.extensions.racing import check_alpha  # racing needs numpy, which `import dspy_opro` must not load

        check_alpha(self.racing_alpha)
        require_int("num_threads", self.num_threads, minimum=1, allow_none=True)
        if self.executor is not None and not isinstance(self.executor, cf.Executor):
            raise TypeError(f"executor must be a concurrent.futures.Executor; got {self.executor!r}")
        require_number("failure_score", self.failure_score, low=0.0, high=1.0)
        if self.log_dir is not None and not isinstance(self.log_dir, str):
            raise TypeError(f"log_dir must be a folder path (str or os.PathLike); got {self.log_dir!r}")
        require_int("seed", self.seed, minimum=0)
        require_bool("display_progress", self.display_progress)

    # ------------------------------------------------------------------------------------------------------------

    @property
    def label_free(self) -> bool:
        """Label-free OPRO: no metric; candidates are judged against the starting program."""
        return self.metric is None

    @property
    def uses_valset(self) -> bool:
        """Whether the run reads the valset at all (it then counts in the resume fingerprint)."""
        return self.select == "validation" or self.val_gate or self.label_free

    def resolve_models(self) -> Models:
        """The run's models: strings become LiteLLM models, ``None`` the LM of ``dspy.configure``."""
        task = resolve_model(self.task_model) or dspy.settings.lm
        if task is None:
            raise ValueError("no task model: pass task_model=... or dspy.configure(lm=...)")
        prompt = resolve_model(self.prompt_model) or dspy.settings.lm
        if prompt is None:
            raise ValueError("no optimizer model: pass prompt_model=... or dspy.configure(lm=...)")
        return Models(prompt=prompt, task=task, judge=resolve_model(self.judge_model))

    def search_settings(self, models: Models, targets: Sequence[str]) -> dict[str, Any]:
        """The JSON-able settings that shape the search, with the resolved models, targets and metric."""
        settings = {
            "initial_instructions": initial_settings(self.initial_instructions),
            "num_steps": self.num_steps,
            "num_candidates": self.num_candidates,
            "num_exemplars": self.num_exemplars,
            "exemplar_selection": self.exemplar_selection,
            "diversity_theta": self.diversity_theta,
            "max_num_instructions": self.max_num_instructions,
            "score_threshold": self.score_threshold,
            "num_score_buckets": "inf" if self.num_score_buckets == math.inf else self.num_score_buckets,
            "optimizer_family": self.optimizer_family,
            "instruction_pos": self.instruction_pos,
            "include_qa": self.include_qa,
            "meta_prompt_type": self.meta_prompt_type,
            "task_description": self.task_description,
            "max_instruction_chars": self.max_instruction_chars,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "predictors": list(self.predictors) if self.predictors is not None else None,
            "select": self.select,
            "top_k": self.top_k,
            "val_gate": self.val_gate,
            "min_delta": self.min_delta,
            "label_free": self.label_free,
            "both_orders": self.both_orders,
            "failure_score": self.failure_score,
            "racing": self.racing,
            "racing_alpha": self.racing_alpha,
            "seed": self.seed,
            **models.named(),
            "targets": list(targets),
            "metric": callable_fingerprint(self.metric),
        }
        return json.loads(json.dumps(settings, default=str))  # numpy numbers and the like as JSON has them

    def recorded_settings(self, models: Models, targets: Sequence[str]) -> dict[str, Any]:
        """What the run record stores as its configuration: the search settings and the budgets."""
        return {**self.search_settings(models, targets), "max_metric_calls": self.max_metric_calls,
                "max_cost": self.max_cost}

    def fingerprint(self, models: Models, targets: Sequence[str], *, trainset: Sequence[dspy.Example],
                    valset: Sequence[dspy.Example], program: dspy.Module) -> Fingerprint:
        """What decides the run's results; resuming under a different fingerprint is refused."""
        settings = {key: value for key, value in self.search_settings(models, targets).items()
                    if key not in CONTINUABLE_SETTINGS}
        return Fingerprint(config=digest(settings), trainset=dataset_fingerprint(trainset),
                           valset=dataset_fingerprint(valset if self.uses_valset else []),
                           program=program_fingerprint(program), settings=settings)


__all__ = ["CONTINUABLE_SETTINGS", "Models", "OPROConfig", "resolve_model"]
