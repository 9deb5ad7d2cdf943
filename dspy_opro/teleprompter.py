"""OPRO (Optimization by PROmpting, Yang et al., ICLR 2024) as a DSPy teleprompter.

OPRO treats a language model as the optimizer of a program's instruction. At every step the optimizer model reads a
meta-prompt: the best instructions found so far with their training scores, in ascending order on a 0-100 scale,
followed by a few training problems with their answers, and a request for a new instruction that scores higher.
The meta-prompt is sent ``num_candidates`` times at temperature 1.0; each reply's instruction is extracted,
polished and de-duplicated, then scored by running the whole program on every training example and applying the
metric. The new scores join the history, so the next meta-prompt shows the optimizer what worked. After
``num_steps`` steps the best instruction on training (the paper's choice) or the best of the ``top_k`` on a
validation set is returned as part of the program.

In a program with several predictors, each step optimizes one of them, round-robin, keeping the others at the best
instructions found so far. The meta-prompt text, reply parsing, polishing and de-duplication are the authors' own,
ported byte for byte in :mod:`dspy_opro.meta_prompt` and checked against their outputs.

Example:
    ```python
    optimizer = OPROTeleprompter(metric=my_metric, prompt_model="openai/gpt-4o")
    compiled = optimizer.compile(program, trainset=train, valset=val)
    compiled.save("compiled.json")
    ```
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import math
import numbers
import os
from collections.abc import Callable, Sequence
from typing import Any, Literal

import dspy
from dspy.teleprompt.teleprompt import Teleprompter

from dspy_opro.meta_prompt import validate_meta_prompt_options
from dspy_opro.placement import check_instruction_pos
from dspy_opro.scoring import metric_takes_trace

logger = logging.getLogger(__name__)

ExemplarSelection = Literal["random", "constant", "hard_diverse"]


def _check_int(name: str, value: Any, *, minimum: int, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}{' or None' if allow_none else ''}; got {value!r}")


def _check_number(name: str, value: Any, *, low: float, high: float, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value) or not low <= value <= high:
        raise ValueError(f"{name} must be a number in [{low}, {high}]{' or None' if allow_none else ''}; got {value!r}")


class OPROTeleprompter(Teleprompter):
    """Optimize the instructions of a DSPy program's predictors with OPRO.

    Args:
        metric: ``metric(example, prediction, trace=None)`` or ``metric(example, prediction)`` (as for
            ``dspy.Evaluate``; ``trace`` is passed only where the metric takes it) returning a float in [0, 1], a
            bool, or a ``dspy.Prediction(score=..., feedback=...)``. ``None`` selects label-free OPRO, which needs
            ``judge_model``.

        prompt_model: The optimizer model: a ``dspy.LM`` or a LiteLLM model string (which becomes
            ``dspy.LM(model, engine="litellm")``). ``None``: ``dspy.settings.lm``.
        task_model: The model that runs the program while scoring: a ``dspy.LM`` or a LiteLLM model string.
            ``None``: ``dspy.settings.lm``.
        judge_model: Label-free OPRO only (``metric=None``): the model (``dspy.LM`` or LiteLLM model string)
            that compares a candidate's
            trajectories with the starting program's. Pass the task model to let it judge itself.

        num_steps: Optimization steps; each sends the meta-prompt ``num_candidates`` times.
        num_candidates: Optimizer samples per step (the authors' 8).
        num_exemplars: Training problems shown in each meta-prompt (the authors' 3); 0 shows none.
        exemplar_selection: ``"random"`` (the authors' default: a new draw per step), ``"constant"`` (the same
            draw every step) or ``"hard_diverse"`` (problems the instructions fail, spread out by a DPP).
        diversity_theta: ``"hard_diverse"`` only: 0 picks for diversity alone, 1 for difficulty alone.

        max_num_instructions: How many of the best instructions the meta-prompt shows (the authors' 20).
        score_threshold: Instructions scoring below this (0 to 1) are not shown; 0 disables it.
        num_score_buckets: Scores are shown as integers from 0 to this number; ``math.inf`` shows them rounded to
            three decimals.
        optimizer_family: ``"gpt"`` or ``"palm"``: which of the authors' meta-prompt wordings to use.
        instruction_pos: Where the instruction sits, in the meta-prompt's problems and in the program alike:
            ``"Q_begin"`` or ``"before_Q"`` (the predictor's instructions, before the inputs; ``"before_Q"`` needs
            ``include_qa=True``) or ``"Q_end"`` (an input field after the inputs). ``"A_begin"`` (the start of
            the answer) is refused: DSPy cannot start a model's answer with a given text.
        include_qa: Render exemplars with ``Q:``/``A:`` markers.
        meta_prompt_type: ``"both_instructions_and_exemplars"`` (the paper) or ``"instructions_only"``.
        task_description: The task words of an ``instructions_only`` meta-prompt, e.g. ``"grade school math"``.
        max_instruction_chars: Skip proposed instructions longer than this (the authors use 500); None: no limit.
        temperature: Sampling temperature of the optimizer model (the authors' 1.0).
        max_tokens: Maximum tokens of one optimizer reply.

        predictors: Names (as in ``program.named_predictors()``) of the predictors to optimize; None: all.

        select: ``"train"`` returns the best training score (the paper); ``"validation"`` scores the ``top_k``
            best on training on the valset and returns the best validation mean.
        top_k: Candidates scored on the valset by ``select="validation"`` and ``val_gate``.
        val_gate: Return the best candidate only if it beats the starting program on the valset by more than
            ``min_delta``; otherwise return the starting program unchanged.
        min_delta: The margin ``val_gate`` requires (0: strictly better).
        both_orders: Label-free OPRO only: judge each pair in both positions, cancelling position bias (two
            judge calls per example instead of one).

        max_metric_calls: Budget in evaluations (one program run plus its metric on one example), training and
            validation together; the run stops cleanly when the next evaluation would exceed it.
        max_cost: Budget in USD, from the recorded cost of both models; the run stops cleanly once reached.

        num_threads: Parallel evaluations (and optimizer calls); None: ``dspy.settings.num_threads`` or 1.
        executor: A ``concurrent.futures.Executor`` to run evaluations on instead of threads (for example
            ``distributed.Client(...).get_executor()``).
        failure_score: The score of a run whose program raised (other than an infrastructure failure).

        log_dir: Folder for the run record (``state.json``), step reports and the final report; compiling again
            with the same folder resumes the run.
        seed: Seeds exemplar draws and optimizer rollout ids; 0 reproduces the authors' exemplar draws.
    """

    def __init__(
        self,
        metric: Callable[..., Any] | None = None,
        *,
        # models
        prompt_model: dspy.BaseLM | str | None = None,
        task_model: dspy.BaseLM | str | None = None,
        judge_model: dspy.BaseLM | str | None = None,
        # search
        num_steps: int = 10,
        num_candidates: int = 8,
        num_exemplars: int = 3,
        exemplar_selection: ExemplarSelection = "random",
        diversity_theta: float = 0.7,
        # meta-prompt
        max_num_instructions: int = 20,
        score_threshold: float = 0.0,
        num_score_buckets: int | float = 100,
        optimizer_family: Literal["gpt", "palm"] = "gpt",
        instruction_pos: Literal["before_Q", "Q_begin", "Q_end", "A_begin"] = "Q_begin",
        include_qa: bool = False,
        meta_prompt_type: Literal["both_instructions_and_exemplars", "instructions_only"] = (
            "both_instructions_and_exemplars"
        ),
        task_description: str = "",
        max_instruction_chars: int | None = None,
        temperature: float = 1.0,
        max_tokens: int = 1024,
        # targets
        predictors: Sequence[str] | None = None,
        # final selection
        select: Literal["train", "validation"] = "train",
        top_k: int = 3,
        val_gate: bool = False,
        min_delta: float = 0.0,
        both_orders: bool = False,
        # budget
        max_metric_calls: int | None = None,
        max_cost: float | None = None,
        # execution
        num_threads: int | None = None,
        executor: cf.Executor | None = None,
        failure_score: float = 0.0,
        # record
        log_dir: str | os.PathLike[str] | None = None,
        seed: int = 0,
    ):
        super().__init__()
        if metric is None and judge_model is None:
            raise ValueError(
                "no metric: pass metric=my_metric (metric(example, prediction, trace=None) -> float in [0, 1]); "
                "for label-free OPRO pass metric=None with judge_model=<dspy.LM> (your task model may judge itself)"
            )
        if metric is not None and not callable(metric):
            raise TypeError(f"metric must be callable as metric(example, prediction, trace=None); got {metric!r}")
        if metric is not None:
            metric_takes_trace(metric)  # refuses a metric that cannot take (example, prediction)
        if metric is not None and judge_model is not None:
            raise ValueError("judge_model is for label-free OPRO (metric=None); drop it or drop the metric")
        for name, lm in (("prompt_model", prompt_model), ("task_model", task_model), ("judge_model", judge_model)):
            if lm is not None and not isinstance(lm, (dspy.BaseLM, str)):
                raise TypeError(
                    f"{name} must be a dspy.LM or a LiteLLM model string such as 'openai/gpt-4o'; got {lm!r}"
                )
            if isinstance(lm, str) and not lm.strip():
                raise ValueError(f"{name} is an empty string; pass a LiteLLM model string such as 'openai/gpt-4o'")
        _check_int("num_steps", num_steps, minimum=0)
        _check_int("num_candidates", num_candidates, minimum=1)
        _check_int("num_exemplars", num_exemplars, minimum=0)
        if exemplar_selection not in ("random", "constant", "hard_diverse"):
            raise ValueError(
                f"exemplar_selection must be 'random', 'constant' or 'hard_diverse'; got {exemplar_selection!r}"
            )
        _check_number("diversity_theta", diversity_theta, low=0.0, high=1.0)
        check_instruction_pos(instruction_pos)  # where the program can put the text; A_begin it cannot
        validate_meta_prompt_options(
            optimizer_family=optimizer_family,
            instruction_pos=instruction_pos,
            meta_prompt_type=meta_prompt_type,
            include_qa=include_qa,
            num_score_buckets=num_score_buckets,
            max_num_instructions=max_num_instructions,
            score_threshold=score_threshold,
        )
        _check_int("max_instruction_chars", max_instruction_chars, minimum=1, allow_none=True)
        _check_number("temperature", temperature, low=0.0, high=2.0)
        _check_int("max_tokens", max_tokens, minimum=1)
        if predictors is not None:
            if isinstance(predictors, str) or not all(isinstance(p, str) for p in predictors) or not predictors:
                raise TypeError(f"predictors must be a non-empty list of predictor names; got {predictors!r}")
        if select not in ("train", "validation"):
            raise ValueError(f"select must be 'train' or 'validation'; got {select!r}")
        _check_int("top_k", top_k, minimum=1)
        if metric is None and (select != "train" or val_gate):
            raise ValueError(
                "label-free OPRO (metric=None) selects by its own gate: the best candidate is returned only if its "
                "mean preference over the starting program on the valset is above 0; drop select and val_gate"
            )
        _check_number("min_delta", min_delta, low=0.0, high=1.0)
        _check_int("max_metric_calls", max_metric_calls, minimum=1, allow_none=True)
        _check_number("max_cost", max_cost, low=0.0, high=math.inf, allow_none=True)
        _check_int("num_threads", num_threads, minimum=1, allow_none=True)
        if executor is not None and not isinstance(executor, cf.Executor):
            raise TypeError(f"executor must be a concurrent.futures.Executor; got {executor!r}")
        _check_number("failure_score", failure_score, low=0.0, high=1.0)
        _check_int("seed", seed, minimum=0)

        self.metric = metric
        self.prompt_model = prompt_model
        self.task_model = task_model
        self.judge_model = judge_model
        self.num_steps = num_steps
        self.num_candidates = num_candidates
        self.num_exemplars = num_exemplars
        self.exemplar_selection = exemplar_selection
        self.diversity_theta = diversity_theta
        self.max_num_instructions = max_num_instructions
        self.score_threshold = score_threshold
        self.num_score_buckets = num_score_buckets
        self.optimizer_family = optimizer_family
        self.instruction_pos = instruction_pos
        self.include_qa = include_qa
        self.meta_prompt_type = meta_prompt_type
        self.task_description = task_description
        self.max_instruction_chars = max_instruction_chars
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.predictors = list(predictors) if predictors is not None else None
        self.select = select
        self.top_k = top_k
        self.val_gate = val_gate
        self.min_delta = min_delta
        self.both_orders = both_orders
        self.max_metric_calls = max_metric_calls
        self.max_cost = max_cost
        self.num_threads = num_threads
        self.executor = executor
        self.failure_score = failure_score
        self.log_dir = os.fspath(log_dir) if log_dir is not None else None
        self.seed = seed

    @property
    def label_free(self) -> bool:
        return self.metric is None

    def search_config(self) -> dict[str, Any]:
        """The settings that shape the search (recorded in the run record and fingerprinted for resume)."""
        return {
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
            "predictors": self.predictors,
            "select": self.select,
            "top_k": self.top_k,
            "val_gate": self.val_gate,
            "min_delta": self.min_delta,
            "label_free": self.label_free,
            "both_orders": self.both_orders,
            "failure_score": self.failure_score,
            "seed": self.seed,
        }

    def compile(
        self,
        student: dspy.Module,
        *,
        trainset: Sequence[dspy.Example],
        teacher: dspy.Module | None = None,
        valset: Sequence[dspy.Example] | None = None,
        **kwargs: Any,
    ) -> dspy.Module:
        """Optimize ``student``'s instructions on ``trainset``; the student itself is never changed.

        Args:
            student: The program to optimize.
            trainset: Examples (with inputs set by ``with_inputs``) that score every candidate instruction and
                supply the meta-prompt's problems.
            teacher: Not used by OPRO; must be None.
            valset: Held-out examples for ``select="validation"``, ``val_gate`` and the label-free gate; they
                never reach the meta-prompt.

        Returns:
            A copy of the program with the selected instructions, carrying ``candidate_programs`` (best first)
            and ``opro_run`` (the run record).
        """
        if teacher is not None:
            raise ValueError("OPRO optimizes instructions only and takes no teacher; call compile(..., teacher=None)")
        if kwargs:
            raise TypeError(f"compile() got unexpected arguments {sorted(kwargs)}; OPRO takes trainset and valset")
        from dspy_opro.run import OPRORun

        return OPRORun(self, student, trainset, valset).execute()


OPRO = OPROTeleprompter
