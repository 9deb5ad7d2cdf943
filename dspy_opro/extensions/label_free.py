"""Label-free OPRO: score candidates by pairwise preference against the starting program's trajectories.

The run scores the starting program first with no metric: each of its runs is rendered as a trajectory and kept as
the anchor of that example (in the run record, so a resumed run reuses it). Every candidate then runs on the same
examples, and :class:`AnchorPreferenceMetric` - used where a metric would be - asks the judge how much better the
candidate's trajectory is than the anchor, mapping the preference from [-10, 10] onto the [0, 1] score OPRO expects.
The anchor itself scores 0.5 (comparable to itself), so the meta-prompt and the rest of the loop are unchanged.
:class:`Anchors` keeps the anchors in the run record (``state.anchors``) and hands them to the metric.
"""

from __future__ import annotations

from typing import Any

import dspy

from dspy_opro.task.data import RunData
from dspy_opro.errors import clean_text
from dspy_opro.scoring.evaluation import ExampleResult
from dspy_opro.extensions.judge import PairwiseJudge, preference_to_score, render_inputs, render_trajectory
from dspy_opro.record.state import RunState, digest


def example_key(example: dspy.Example) -> str:
    """Identifies an example by its inputs alone (labels play no part in label-free OPRO)."""
    return digest(dict(example.inputs().items()))


def anchor_text(result: ExampleResult) -> str:
    """The rendered trajectory of one run of the starting program (cleaned of lone surrogates).

    Only a run that answered or that the program itself failed (``ok``, ``failed``) makes an anchor; an outage
    (``infra``) is no trajectory, and the caller scores the start again instead of storing it.
    """
    if result.outcome == "failed":
        return clean_text(f"The program failed: {result.error}")
    if result.outcome != "ok":
        raise ValueError(f"a {result.outcome!r} run is no anchor: {result.error}")
    return clean_text(render_trajectory(result.prediction, result.trace))


class AnchorPreferenceMetric:
    """A metric that judges a candidate's run against the starting program's run on the same example.

    Args:
        judge_lm: The LM that judges; None: the task model in the current DSPy context.
        both_orders: Judge each pair in both positions (two judge calls instead of one).
    """

    def __init__(self, *, judge_lm: dspy.BaseLM | None = None, both_orders: bool = False):
        self.judge = PairwiseJudge(judge_lm, both_orders=both_orders)
        self.anchors: dict[str, str] = {}

    def __call__(self, example: dspy.Example, prediction: Any, trace: Any = None) -> dspy.Prediction:
        anchor = self.anchors.get(example_key(example))
        if anchor is None:
            raise KeyError("no anchor trajectory for this example: the starting program has not run on it")
        judgment = self.judge.compare(render_inputs(example), anchor, render_trajectory(prediction, trace))
        return dspy.Prediction(score=preference_to_score(judgment.preference), feedback=judgment.rationale,
                               preference=judgment.preference, parsed=judgment.parsed)


class Anchors:
    """The starting program's trajectories: stored in the run record, handed to the preference metric.

    Args:
        state: The run record (``state.anchors`` maps ``"split:index"`` to the anchor text).
        data: The run's examples, to key each anchor by its example's inputs.
        metric: The preference metric that judges candidates against the anchors.
    """

    def __init__(self, state: RunState, data: RunData, metric: AnchorPreferenceMetric):
        self.state, self.data, self.metric = state, data, metric
        for key, text in state.anchors.items():  # a resumed run judges against the anchors it recorded
            split, index = key.split(":")
            metric.anchors[example_key(data.examples(split)[int(index)])] = text

    def store(self, result: ExampleResult) -> str:
        """Keep the starting program's run ``result`` as its example's anchor; it scores 0.5 against itself.

        A run the program failed keeps its outcome, so the error is recorded on the start.
        """
        text = anchor_text(result)
        self.state.anchors[f"{result.split}:{result.index}"] = text
        self.metric.anchors[example_key(self.data.examples(result.split)[result.index])] = text
        result.score = 0.5
        return text
