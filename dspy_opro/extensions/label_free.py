"""Label-free OPRO: a metric that scores candidates by pairwise preference against the starting program's runs.

``metric=PairwisePreference(judge_model=...)`` runs OPRO without labels. The step loop scores the program as given
first with :meth:`PairwisePreference.anchor_metric`: each of its runs is rendered as a trajectory (the *anchor* of
that example), kept in the run record (so a resumed run reuses it) and handed back with
:meth:`PairwisePreference.add_anchor`; the program as given scores 0.5. Every candidate then runs on the same
examples, and the judge (:class:`dspy_opro.extensions.judge.PairwiseJudge`) says how much better its trajectory is
than the anchor, on the [0, 1] scale OPRO expects. :class:`LabelFreeGate` returns the best candidate only if it is
preferred over the program as given, on the valset when there is one. The metric is the seam
(:class:`dspy_opro.scoring.evaluation.AnchoredMetric`): nothing in the step loop imports this module.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import dspy

from dspy_opro.compat import user_stacklevel
from dspy_opro.core.selection import start_of
from dspy_opro.errors import clean_text
from dspy_opro.extensions.judge import PairwiseJudge, preference_to_score, render_inputs, render_trajectory
from dspy_opro.state import START_ID, Candidate, RunState, Selection, digest

ANCHOR_SCORE = 0.5  # the starting program against itself


def example_key(example: dspy.Example) -> str:
    """Identifies an example by its inputs alone (labels play no part in label-free OPRO)."""
    return digest(dict(example.inputs().items()))


def _record_anchor(example: dspy.Example, prediction: Any, trace: Any = None) -> dspy.Prediction:
    """The metric of the starting program's runs: renders each run as its example's anchor; scores 0.5."""
    if isinstance(prediction, BaseException):  # a run the program failed is an anchor too
        text = f"The program failed: {type(prediction).__name__}: {prediction}"
    else:
        text = render_trajectory(prediction, trace)
    return dspy.Prediction(score=ANCHOR_SCORE, anchor=clean_text(text))


class PairwisePreference:
    """Label-free OPRO's metric: a judge compares each candidate's run with the starting program's run.

    ``judge_model`` is a ``dspy.LM`` or a LiteLLM model string (None: the task model judges its own runs);
    ``both_orders`` judges each pair in both positions, cancelling position bias (two judge calls per example).

    Example:
        ```python
        optimizer = OPROTeleprompter(metric=PairwisePreference(judge_model=lm), prompt_model=lm)
        ```
    """

    def __init__(self, judge_model: dspy.BaseLM | str | None = None, *, both_orders: bool = False):
        if judge_model is not None and not isinstance(judge_model, (dspy.BaseLM, str)):
            raise TypeError(f"judge_model must be a dspy.LM or a LiteLLM model string such as 'openai/gpt-4o'; got "
                            f"{judge_model!r}")
        if isinstance(judge_model, str) and not judge_model.strip():
            raise ValueError("judge_model is an empty string; pass a LiteLLM model string such as 'openai/gpt-4o'")
        if not isinstance(both_orders, bool):
            raise ValueError(f"both_orders must be a bool (True or False); got {both_orders!r}")
        self.judge_model = dspy.LM(judge_model, engine="litellm") if isinstance(judge_model, str) else judge_model
        self.both_orders = both_orders
        self._judge = PairwiseJudge(self.judge_model, both_orders=both_orders)
        self._anchors: dict[str, str] = {}

    def __call__(self, example: dspy.Example, prediction: Any, trace: Any = None) -> dspy.Prediction:
        anchor = self._anchors.get(example_key(example))
        if anchor is None:
            raise KeyError("no anchor trajectory for this example: the starting program has not run on it")
        judgment = self._judge.compare(render_inputs(example), anchor, render_trajectory(prediction, trace))
        return dspy.Prediction(score=preference_to_score(judgment.preference), feedback=judgment.rationale,
                               preference=judgment.preference, parsed=judgment.parsed)

    # The AnchoredMetric seam -----------------------------------------------------------------------------------

    def anchor_metric(self) -> Callable[..., dspy.Prediction]:
        """The metric the starting program's runs are scored by."""
        return _record_anchor

    def add_anchor(self, example: dspy.Example, text: str) -> None:
        """Judge later runs on ``example`` against ``text``."""
        self._anchors[example_key(example)] = text

    def selection_policy(self) -> LabelFreeGate:
        return LabelFreeGate()

    def settings(self) -> dict[str, Any]:
        """What the run records and fingerprints of this metric."""
        return {"judge_model": getattr(self.judge_model, "model", None), "both_orders": self.both_orders}

    def __repr__(self) -> str:
        return f"PairwisePreference(judge_model={self.settings()['judge_model']!r}, both_orders={self.both_orders})"


class LabelFreeGate:
    """Return the best candidate only if its mean preference over the program as given (``20 * score - 10``) is
    above 0: on the valset, whose anchors are scored first, when there is one; else on training, with a warning."""

    uses_valset = True

    def planned_evaluations(self, n_val: int) -> int:
        return 2 * n_val  # the validation anchors and the best candidate

    def validation_phases(self, state: RunState, *, has_valset: bool) -> list[list[Candidate]]:
        best = state.best()
        if best is None or best.id == START_ID or not has_valset:
            return []
        return [[start_of(state)], [best]]  # the starting program's runs are the validation anchors

    def decide(self, state: RunState, *, has_valset: bool) -> Selection:
        best = state.best()
        if best is None or best.id == START_ID:
            return Selection(candidate_id=START_ID, selected_by="start",
                             reason="no candidate was preferred over the starting program on training")
        if not has_valset:
            warnings.warn("label-free OPRO without a valset gates on the training examples, which the search "
                          "already selected on; pass a valset for an unbiased gate", stacklevel=user_stacklevel())
            return label_free_gate(best, best.score, "training")
        return label_free_gate(best, best.val_score, "validation")


def label_free_gate(best: Candidate, gate_score: float | None, where: str) -> Selection:
    """Accept ``best`` only if its mean preference over the starting program (``20 * score - 10``) is above 0."""
    if gate_score is None:
        return Selection(candidate_id=START_ID, selected_by="start",
                         reason="the gate could not be evaluated (budget or LM failures)")
    mean_preference = 20 * gate_score - 10
    if mean_preference > 0:
        return Selection(candidate_id=best.id, selected_by="val_gate",
                         reason=f"mean {where} preference {mean_preference:+.2f} over the starting program is above 0")
    return Selection(candidate_id=START_ID, selected_by="start",
                     reason=f"mean {where} preference {mean_preference:+.2f} over the starting program is not above "
                            "0; returning the program unchanged")
