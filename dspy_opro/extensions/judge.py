"""Label-free scoring of candidate instructions by the task model's own pairwise preference.

OPRO needs a score for every instruction it proposes. Without labels there is no metric to compute one, so a
candidate is scored the way retrospective harness optimization accepts a change to an agent's harness: by asking a
model whether the work done with the change is better than the work done without it. The starting program's
trajectories on the probe examples are a fixed anchor; a judge -- by default the task model itself -- compares each
candidate trajectory with the anchor trajectory of the same example, answering with an integer preference in
[-10, 10] (+10: an unacceptable result became excellent, 0: comparable, -10: a severe regression) and a one-sentence
rationale. A candidate's score is its mean preference mapped linearly onto [0, 1], so the anchor scores 0.5.

The price is one judge call per probe example per candidate, on top of running the candidate itself. With
``both_orders=True`` it is two: each pair is judged once with the anchor in position A and once with the candidate
in position A, and the preference is half the difference of the two answers. Language-model judges are known to
favour one position (often the second) regardless of content; a judge that always says "B is better by 6" then
nets 0 instead of handing every candidate a free +6, while a judge that tracks the content nets its full preference.
When a judgment cannot be parsed it counts as 0 (no preference), is logged at WARNING, and is flagged on the
:class:`Judgment`, so a flaky judge pulls scores toward 0.5 rather than failing the run. Errors of the LM itself
(:class:`dspy.utils.exceptions.LMError`) propagate for the caller to classify.

Labels must never reach the judge: :func:`render_inputs` shows only an example's input fields, and
:func:`render_trajectory` renders what the program did without reading the example at all.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import dspy

from dspy_opro.compat import BaseCallback, is_adapter_parse_error

logger = logging.getLogger(__name__)

PREFERENCE_MIN = -10.0
PREFERENCE_MAX = 10.0

_REACT_KEY = re.compile(r"^(thought|tool_name|tool_args|observation)_(\d+)$")
_REACT_LABELS = {"thought": "Thought", "tool_name": "Tool", "tool_args": "Arguments", "observation": "Observation"}
_UNPARSEABLE_RATIONALE = "(the judgment could not be parsed; counted as no preference)"


class JudgePreference(dspy.Signature):
    """You compare two trajectories of the same task, produced by two versions of the same program on the same input.

    Each trajectory shows the program's steps (reasoning, tool calls and their observations, intermediate outputs)
    and its final outputs, or the error it failed with. Judge trajectory B relative to trajectory A: how much better
    (or worse) is the work done in B?

    Answer with an integer from -10 to 10:
      +10: A was unacceptable (wrong, failed, or unusable) and B is excellent.
      +5: B is clearly better, e.g. it fixes a real mistake in A or reaches a sounder result.
      0: the two are comparable in quality, or they differ only in ways that do not matter.
      -5: B is clearly worse, e.g. it introduces a real mistake that A did not make.
      -10: a severe regression: A was good and B is wrong, failed, or unusable.
    Use the values in between for differences in between.

    Judge the quality of the work -- correctness, soundness of the reasoning, sensible use of tools, faithfulness to
    the observations, and whether the task was actually accomplished -- not length, verbosity, formatting, or style.
    A longer trajectory is not better for being longer. Give a one-sentence rationale before the preference.
    """

    task_input: str = dspy.InputField(desc="the inputs of the task both trajectories worked on")
    trajectory_a: str = dspy.InputField(desc="trajectory A")
    trajectory_b: str = dspy.InputField(desc="trajectory B")
    rationale: str = dspy.OutputField(desc="one sentence")
    preference: int = dspy.OutputField(desc="integer from -10 to 10: how much better B is than A")


@dataclass(frozen=True)
class Judgment:
    """The judge's verdict on one candidate trajectory against the anchor trajectory of the same example.

    Attributes:
        preference: How much better the candidate is than the anchor, in [-10, 10] (with ``both_orders``, half the
            difference of the two judgments). ``rationale``: the judge's one sentence (both, labelled).
        parsed: False if any judgment in it could not be parsed (that judgment counted as 0).
        calls: Judge LM calls made: 1 per judgment (2 with ``both_orders``), plus any retry an adapter made on its
            own (DSPy's ChatAdapter retries an unparseable reply once with its JSONAdapter).
    """

    preference: float
    rationale: str
    parsed: bool
    calls: int


def _format_value(value: Any) -> str:
    """Render one field value as text: strings verbatim, containers and pydantic models as JSON."""
    if isinstance(value, str):
        return value
    if hasattr(value, "model_dump"):
        try:
            value = value.model_dump(mode="json")
        except Exception:  # a rendering must never fail
            return str(value)
    if isinstance(value, (dict, list, tuple)):
        try:
            return json.dumps(value, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def _truncate_middle(text: str, limit: int) -> str:
    """Keep the head and tail of ``text`` so that the result, marker included, has at most ``limit`` characters."""
    if limit <= 0:
        return ""
    if len(text) <= limit:
        return text
    omitted = len(text) - limit
    while True:  # the marker's length depends on the count it reports; this settles in two or three rounds
        marker = f" … [{omitted} chars omitted] … "
        keep = limit - len(marker)
        if keep < 2:
            return text[:limit]
        if len(text) - keep == omitted:
            return text[: keep - keep // 2] + marker + text[len(text) - keep // 2 :]
        omitted = len(text) - keep


def _field_lines(fields: Sequence[tuple[str, Any]], value_limit: int | None = None) -> list[str]:
    texts = [(name, _format_value(value)) for name, value in fields]
    return [f"{name}: {text if value_limit is None else _truncate_middle(text, value_limit)}" for name, text in texts]


def _prediction_fields(prediction: Any, exclude: Collection[str] = ()) -> list[tuple[str, Any]] | None:
    """The output fields of a prediction (or a dict), or None when it is neither."""
    if isinstance(prediction, (dspy.Prediction, dict)):
        return [(str(k), v) for k, v in prediction.items() if k not in exclude]
    return None


def render_inputs(example: dspy.Example) -> str:
    """Render an example's input fields, one ``name: value`` line each, for the judge's ``task_input``.

    Only the keys designated by ``example.with_inputs(...)`` are shown; the example's labels never are. Raises
    ``ValueError`` if the example has no designated input keys (so inputs cannot be told from labels).
    """
    return "\n".join(_field_lines(list(example.inputs().items())))


def render_trajectory(prediction: Any, trace: Sequence[Any] | None = None, *, label_fields: Collection[str] = (),
                      max_chars: int = 4000, max_observation_chars: int = 600) -> str:
    """Render what a program did on one example, for the judge.

    A ``dspy.ReAct`` prediction (one whose ``trajectory`` is ReAct's dict of ``thought_i``, ``tool_name_i``,
    ``tool_args_i`` and ``observation_i``) is rendered step by step, then its final outputs. Any other program is
    rendered from its DSPy ``trace`` -- the ``(predictor, inputs, outputs)`` tuples DSPy records under
    ``dspy.context(trace=[])`` -- step by step, or, without a trace, as the prediction's fields. If the program
    raised, pass the exception as ``prediction``: it is rendered as ``The program failed: <ExcType>: <msg>`` after
    any steps the trace recorded.

    The example itself is never read, so its label values cannot appear. The program's own outputs are always
    shown, even under a field name that is also a label key: they are what the program produced.

    A predictor *input* named as one of the ``label_fields`` (the dataset's label keys) is withheld from the trace
    rendering, since it could only carry a label value handed to the program. The whole rendering is cut to
    ``max_chars``, and each ReAct observation and each predictor input value in a trace to
    ``max_observation_chars``, keeping head and tail (``<head> … [N chars omitted] … <tail>``).
    """
    blocks: list[str] = []
    failed = isinstance(prediction, BaseException)
    react = None if failed or not isinstance(prediction, dspy.Prediction) else prediction.get("trajectory")
    last_outputs = None
    if isinstance(react, dict) and all(_REACT_KEY.match(str(key)) for key in react):
        steps: dict[int, dict[str, Any]] = {}
        for key, value in react.items():
            kind, position = str(key).rsplit("_", 1)  # a key of ReAct's, as matched above
            steps.setdefault(int(position), {})[kind] = value
        for index, step in sorted(steps.items()):
            lines = [f"Step {index + 1}"]
            for kind, label in _REACT_LABELS.items():
                if kind in step:
                    text = _format_value(step[kind])
                    text = _truncate_middle(text, max_observation_chars) if kind == "observation" else text
                    lines.append(f"{label}: {text}")
            blocks.append("\n".join(lines))
        blocks = blocks or ["(no tool calls)"]
        final = _prediction_fields(prediction, exclude=("trajectory",))
    else:
        for number, entry in enumerate(trace or [], start=1):
            try:
                predictor, inputs, outputs = entry
            except (TypeError, ValueError):
                blocks.append(f"Step {number}\n{_format_value(entry)}")
                continue
            spelled = getattr(getattr(predictor, "signature", None), "signature", None)
            lines = [f"Step {number} ({spelled if isinstance(spelled, str) else type(predictor).__name__})"]
            input_fields = [(str(k), v) for k, v in dict(inputs or {}).items() if k not in set(label_fields)]
            if input_fields:
                lines += ["Inputs:", *_field_lines(input_fields, max_observation_chars)]
            last_outputs = _prediction_fields(outputs)
            lines.append("Outputs:")
            lines += _field_lines(last_outputs) if last_outputs is not None else [_format_value(outputs)]
            blocks.append("\n".join(lines))
        final = None if failed else _prediction_fields(prediction)
    if failed:
        blocks.append(f"The program failed: {type(prediction).__name__}: {prediction}")
    elif final is None:
        blocks.append(f"Final output:\n{_format_value(prediction)}")
    elif final != last_outputs or not blocks:  # not the last step's outputs again
        blocks.append("\n".join(["Final outputs:", *_field_lines(final)]))
    return _truncate_middle("\n\n".join(blocks), max_chars)


def clamp_preference(value: Any) -> tuple[float, bool]:
    """Read a judge's preference (an int, a float, or a string holding one: ``"3"``, ``"+3"``, ``" -2.5 "``):
    ``(preference, True)`` clamped to [-10, 10], or ``(0.0, False)`` when the value is not a finite number."""
    try:
        number = float(value)  # float() strips a string's white space itself
    except (TypeError, ValueError, OverflowError):
        return 0.0, False
    if isinstance(value, bool) or not math.isfinite(number):
        return 0.0, False
    return min(PREFERENCE_MAX, max(PREFERENCE_MIN, number)), True


def preference_to_score(mean_preference: float) -> float:
    """Map a mean preference in [-10, 10] linearly onto a score in [0, 1]: ``(p + 10) / 20``.

    The anchor itself (preference 0) scores 0.5. Values outside [-10, 10] are clamped; a value that is not finite
    (for example the mean of no judgments) raises ``ValueError``.
    """
    if not math.isfinite(mean_preference):
        raise ValueError(f"mean_preference must be a finite number, got {mean_preference!r}")
    return (min(PREFERENCE_MAX, max(PREFERENCE_MIN, mean_preference)) + 10.0) / 20.0


class _CallsStarted(BaseCallback):
    """Counts the LM calls the judge starts (retries of DSPy's adapters included)."""

    def __init__(self) -> None:
        self.started = 0

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self.started += 1


class PairwiseJudge:
    """Compares a candidate trajectory with the anchor trajectory of the same example, on ``judge_lm`` (None:
    ``dspy.settings.lm``, the task model: the self-preference this scoring is built on); ``both_orders`` judges each
    pair in both positions and halves the difference, cancelling position bias at the price of a second call."""

    def __init__(self, judge_lm: dspy.BaseLM | None = None, *, both_orders: bool = False) -> None:
        self.judge_lm, self.both_orders = judge_lm, both_orders
        self.predict = dspy.Predict(JudgePreference)

    def _judge(self, task_input: str, a: str, b: str, rollout_id: int | None) -> tuple[float, str, bool]:
        """One judgment of B relative to A; an unparseable one is (0.0, placeholder, False)."""
        call: dict[str, Any] = {"task_input": task_input, "trajectory_a": a, "trajectory_b": b}
        if rollout_id is not None:
            call["config"] = {"rollout_id": rollout_id}
        try:
            result = self.predict(**call)
        except Exception as error:
            if not is_adapter_parse_error(error):
                raise
            logger.warning("Unparseable judge reply, counted as no preference (0): %s",
                           _truncate_middle(str(error), 500))
            return 0.0, _UNPARSEABLE_RATIONALE, False
        preference, parsed = clamp_preference(answer := getattr(result, "preference", None))
        rationale = str(getattr(result, "rationale", "") or "").strip()
        if not parsed:
            logger.warning("Judge preference %r is not a number, counted as no preference (0)", answer)
            return 0.0, rationale or _UNPARSEABLE_RATIONALE, False
        return preference, rationale, True

    def compare(self, task_input: str, anchor: str, candidate: str, *, rollout_id: int | None = None) -> Judgment:
        """Judge how much better ``candidate`` is than ``anchor`` on the same task input.

        One order: the anchor is trajectory A and the candidate B, and the preference is the judgment. Both orders:
        ``p1`` judges (A=anchor, B=candidate), ``p2`` judges (A=candidate, B=anchor), and the preference is
        ``(p1 - p2) / 2``. ``task_input`` is the example's rendered inputs (:func:`render_inputs`), ``anchor`` and
        ``candidate`` the rendered trajectories. A ``rollout_id`` is passed to the judge call as
        ``config={"rollout_id": ...}``, so that a repeated identical comparison is not answered from DSPy's cache
        (effective only at a nonzero temperature). An LM error of the judge (``dspy.utils.exceptions.LMError``) is
        not caught here.
        """
        counter = _CallsStarted()
        # trace=None keeps judge calls out of any trace the caller is recording for the program itself.
        overrides: dict[str, Any] = {"callbacks": [*(dspy.settings.get("callbacks") or []), counter], "trace": None}
        if self.judge_lm is not None:
            overrides["lm"] = self.judge_lm
        with dspy.context(**overrides):
            p1, r1, ok1 = self._judge(task_input, anchor, candidate, rollout_id)
            if not self.both_orders:
                return Judgment(preference=p1, rationale=r1, parsed=ok1, calls=counter.started)
            p2, r2, ok2 = self._judge(task_input, candidate, anchor, rollout_id)
        return Judgment(preference=(p1 - p2) / 2.0, rationale=f"[candidate as B] {r1} [candidate as A] {r2}",
                        parsed=ok1 and ok2, calls=counter.started)
