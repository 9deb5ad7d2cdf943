"""A run's plan: the LM calls it will make and, where both models are priced, what they will cost.

Before its first LM call a run logs its plan, and :meth:`OPROTeleprompter.estimate
<dspy_opro.core.teleprompter.OPROTeleprompter.estimate>` returns the same :class:`RunPlan` without spending anything.
The plan counts what the run sends, as it will send it:

* optimizer requests: one per step asking for ``num_candidates`` choices (``n``) where the optimizer model takes
  ``n`` (:func:`~dspy_opro.core.proposals.honours_n`), otherwise ``num_candidates`` single-choice requests
  per step, and the plan says so; a failed request is retried once on top;
* evaluations (one program run plus the metric on one example): the program as given and each initial instruction
  on every training example, ``num_candidates`` new candidates per step on every training example, and the
  selection's validation evaluations; at most, since a duplicate or skipped reply is never scored and racing stops
  candidates early; capped by ``max_metric_calls``.

An evaluation makes as many task-model calls as the program makes (one for ``dspy.Predict`` and
``dspy.ChainOfThought``, one per iteration for ``dspy.ReAct``), so the cost is estimated per evaluation: from
tokens measured on the first evaluations of step -1 (the run logs it then), or from tokens the caller states
(``estimate(..., tokens_per_evaluation=...)``). An optimizer request is assumed to send
:data:`OPTIMIZER_PROMPT_TOKENS` prompt tokens and receive :data:`OPTIMIZER_COMPLETION_TOKENS` per choice, the
assumption the estimate states with it.

A run whose models all answer on this machine reads the bundled price maps (:func:`use_local_price_maps_offline`),
so an offline run prints no warning about a price list it cannot fetch.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlparse

from dspy_opro.core.proposals import honours_n
from dspy_opro.core.selection import SelectionPolicy
from dspy_opro.scoring.usage import token_prices
from dspy_opro.task.data import RunData

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
LOCAL_COST_MAP = "LITELLM_LOCAL_MODEL_COST_MAP"

OPTIMIZER_PROMPT_TOKENS = 1000
"""The assumed prompt of one optimizer request: a meta-prompt of 20 scored instructions and 3 problems."""
OPTIMIZER_COMPLETION_TOKENS = 150
"""The assumed length of one optimizer reply (an instruction of a few sentences in ``<INS>`` tags)."""


@dataclass(frozen=True)
class RunPlan:
    """The LM calls one run will make, and their estimated cost.

    Attributes:
        num_steps: Optimization steps.
        num_candidates: Choices asked of the optimizer per step.
        optimizer_requests: Optimizer requests, as they will be sent (retries of failed ones aside).
        honours_n: Whether one request asks for ``num_candidates`` choices (else one request per choice).
        optimizer_model: The optimizer model's name.
        task_model: The task model's name.
        train_evaluations: Training evaluations at most: the start and initial instructions, then every step.
        validation_evaluations: Validation evaluations at most, as the selection asks.
        evaluations: All evaluations at most, capped by ``max_metric_calls``.
        selected_on: ``"validation"`` or ``"train"``: what the selection reads.
        cost: Estimated USD for both models, where both are priced and the tokens known; else None.
        cost_assumption: What ``cost`` rests on, or why there is none.
    """

    num_steps: int
    num_candidates: int
    optimizer_requests: int
    honours_n: bool
    optimizer_model: str
    task_model: str
    train_evaluations: int
    validation_evaluations: int
    evaluations: int
    selected_on: str
    cost: float | None = None
    cost_assumption: str = "no token counts yet"

    def describe(self) -> str:
        """The plan on one line, with its cost when it has one (``estimate(..., tokens_per_evaluation=...)``)."""
        if self.honours_n:
            requests = f"{self.optimizer_requests} optimizer requests (one per step asking n={self.num_candidates})"
        else:
            per_step = f"{self.num_candidates} single-choice request{'s' if self.num_candidates != 1 else ''}"
            requests = (f"{self.optimizer_requests} optimizer requests ({per_step} per step: "
                        f"{self.optimizer_model!r} is not known to honour n)")
        evaluations = (f"at most {self.evaluations} program runs with the metric ({self.train_evaluations} on "
                       f"training, {self.validation_evaluations} on validation)")
        selection = "training" if self.selected_on == "train" else self.selected_on
        cost = f"; about ${self.cost:.4f} ({self.cost_assumption})" if self.cost is not None else ""
        return f"OPRO plan: {requests}; {evaluations}; selection on {selection}{cost}"

    def describe_cost(self) -> str:
        """The cost estimate with its assumption, on one line."""
        if self.cost is None:
            return f"OPRO cost estimate: unknown ({self.cost_assumption})"
        return f"OPRO cost estimate: about ${self.cost:.4f} ({self.cost_assumption})"

    def with_cost(self, *, prompt_tokens: float, completion_tokens: float, measured: str) -> RunPlan:
        """The plan with its cost, for the given task tokens per evaluation (``measured`` says where they come from).

        Where a model has no known price the cost stays None and the assumption says which.
        """
        optimizer_price, task_price = token_prices(self.optimizer_model), token_prices(self.task_model)
        unpriced = [name for name, price in ((self.optimizer_model, optimizer_price), (self.task_model, task_price))
                    if price is None]
        if unpriced:
            return replace(self, cost=None, cost_assumption=f"no known price for {', '.join(map(repr, unpriced))}")
        assert optimizer_price is not None and task_price is not None
        choices = self.num_steps * self.num_candidates
        optimizer = (self.optimizer_requests * OPTIMIZER_PROMPT_TOKENS * optimizer_price[0]
                     + choices * OPTIMIZER_COMPLETION_TOKENS * optimizer_price[1])
        task = self.evaluations * (prompt_tokens * task_price[0] + completion_tokens * task_price[1])
        assumption = (f"{prompt_tokens:.0f} prompt and {completion_tokens:.0f} completion tokens per evaluation "
                      f"({measured}); {OPTIMIZER_PROMPT_TOKENS} prompt tokens per optimizer request and "
                      f"{OPTIMIZER_COMPLETION_TOKENS} completion tokens per choice (assumed); every planned "
                      "evaluation run")
        return replace(self, cost=optimizer + task, cost_assumption=assumption)


def is_loopback_model(lm: Any) -> bool:
    """Whether ``lm`` is a LiteLLM model served on this machine (an ``api_base`` on 127.0.0.1 or localhost)."""
    kwargs = getattr(lm, "kwargs", None) or {}
    base = kwargs.get("api_base") or kwargs.get("base_url")
    return isinstance(base, str) and urlparse(base).hostname in LOOPBACK_HOSTS


def use_local_price_maps_offline(models: Iterable[Any]) -> bool:
    """Read LiteLLM's and DSPy's bundled price maps when every model is served on this machine.

    Without ``LITELLM_LOCAL_MODEL_COST_MAP=True``, importing LiteLLM and DSPy's first price lookup each try to fetch
    a price list from GitHub; offline, that prints a cost-map warning per attempt and waits seconds for each. A run
    whose models all answer on 127.0.0.1 (the simulated endpoint, a local server) needs no fresh prices, so the
    variable is set for it, unless the user set it; a run with any remote model is left alone.

    Returns:
        Whether the variable was set here.
    """
    present = [lm for lm in models if lm is not None]
    if os.environ.get(LOCAL_COST_MAP) is not None or not present or not all(map(is_loopback_model, present)):
        return False
    os.environ[LOCAL_COST_MAP] = "True"
    return True


@contextlib.contextmanager
def price_map_setting_restored() -> Iterator[None]:
    """Put ``LITELLM_LOCAL_MODEL_COST_MAP`` back as it was (set or not) when the block ends: a compile or an estimate
    that set it (:func:`use_local_price_maps_offline`) leaves the process's environment as it found it."""
    before = os.environ.get(LOCAL_COST_MAP)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(LOCAL_COST_MAP, None)
        else:
            os.environ[LOCAL_COST_MAP] = before


def plan_run(*, num_steps: int, num_candidates: int, models: Any, data: RunData, selection: SelectionPolicy,
             max_metric_calls: int | None, initial: int, ignores_n: set[str] | None = None) -> RunPlan:
    """The plan of a run from its resolved search, models, checked data and selection policy.

    Args:
        initial: How many initial instructions step -1 scores besides the program as given.
        ignores_n: Optimizer models already seen ignoring ``n``.
    """
    n_train, n_val = len(data.trainset), len(data.valset)
    takes_n = honours_n(models.prompt, ignores_n)
    train = n_train * (1 + initial + num_steps * num_candidates)
    validation = selection.planned_evaluations(n_val) if n_val else 0
    total = train + validation if max_metric_calls is None else min(train + validation, max_metric_calls)
    return RunPlan(num_steps=num_steps, num_candidates=num_candidates,
                   optimizer_requests=num_steps * (1 if takes_n else num_candidates), honours_n=takes_n,
                   optimizer_model=str(getattr(models.prompt, "model", models.prompt)),
                   task_model=str(getattr(models.task, "model", models.task)), train_evaluations=train,
                   validation_evaluations=validation, evaluations=total,
                   selected_on="validation" if selection.uses_valset and n_val else "train")


__all__ = [
    "OPTIMIZER_COMPLETION_TOKENS",
    "OPTIMIZER_PROMPT_TOKENS",
    "RunPlan",
    "is_loopback_model",
    "plan_run",
    "price_map_setting_restored",
    "use_local_price_maps_offline",
]
