"""What one step's meta-prompt shows: the predictor's scored history and a few training problems with answers.

The history of a predictor is its instruction in the program as given and its scored initial instructions (both
step -1), then every scored instruction proposed for it, each with its training score (a raced-out one with its
partial mean); :func:`dspy_opro.core.meta_prompt.gen_meta_prompt` sorts, filters and buckets it as the authors do.

The problems are drawn by :class:`ExemplarPicker` with an :class:`ExemplarPolicy`, from every training example that
has something to show as its answer: the authors' uniform draw (:class:`UniformExemplars`), or an extension's (the
hard-and-diverse DPP, :mod:`dspy_opro.extensions.hard_diverse`). The authors draw ``k`` problems uniformly at every
step with ``np.random.seed(step)`` (criteria ``"random"``) or the step-0 set every time (``"constant"``);
:func:`draw_exemplar_indices` reproduces both draws exactly for ``seed=0`` without touching numpy's global state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from dspy_opro.state import Candidate, RunState
from dspy_opro.task.data import NO_REFERENCE_NOTE, RunData, render_fields

# Spreads user seeds far apart so that seed s at step t never collides with seed s' at step t'.
_SEED_STRIDE = 100003


def draw_exemplar_indices(
    indices: Sequence[int], k: int, step: int, *, seed: int = 0, criteria: str = "random"
) -> list[int]:
    """Draw ``k`` distinct elements of ``indices`` for one step, sorted ascending.

    With ``seed=0`` the draw equals the authors': ``np.random.seed(step)`` followed by
    ``np.random.choice(indices, k, replace=False)`` for ``"random"``, and the step-0 draw at every step for
    ``"constant"``. Any other seed uses ``RandomState(seed * 100003 + step)``. numpy's global state is untouched.

    Args:
        indices: The candidates to draw from (for example the training-set positions).
        k: How many to draw; at most ``len(indices)``.
        step: The 0-based optimization step.
        seed: The run's seed.
        criteria: ``"random"`` (a new draw every step) or ``"constant"`` (the same draw every step).

    Raises:
        ValueError: On an unknown criteria or when ``k`` exceeds the number of indices.
    """
    if criteria not in ("random", "constant"):
        raise ValueError(f"criteria must be 'random' or 'constant', got {criteria!r}")
    if k < 0 or k > len(indices):
        raise ValueError(f"cannot draw {k} exemplars from {len(indices)} indices; lower num_exemplars")
    if k == 0:
        return []
    import numpy as np  # here, not at the top: ``import dspy_opro`` stays cheap

    draw_step = step if criteria == "random" else 0
    rng = np.random.RandomState(seed * _SEED_STRIDE + draw_step)
    chosen = rng.choice(np.asarray(list(indices)), k, replace=False)
    return sorted(int(i) for i in chosen)


def predictor_history(state: RunState, predictor: str) -> list[tuple[str, float, int]]:
    """``(instruction, score, step)`` of every scored candidate that set ``predictor``'s instruction.

    A candidate racing stopped appears with its partial mean, the mean over the examples it ran.
    """
    history: list[tuple[str, float, int]] = []
    for candidate in state.with_scores():
        score = candidate.score if candidate.score is not None else 0.0  # with_scores() holds only scored ones
        if candidate.predictor is None:
            history.append((candidate.instructions[predictor], score, -1))
        elif candidate.predictor == predictor:
            history.append((candidate.instruction, score, candidate.step))
    return history


class ExemplarPolicy(Protocol):
    """Which training problems a step's meta-prompt shows."""

    def draw(self, step: int, k: int, eligible: list[int], state: RunState, data: RunData) -> list[int]:
        """``k`` of the ``eligible`` training indices for ``step``, sorted."""
        ...


class UniformExemplars:
    """The authors' draw: ``"random"`` (a new uniform draw per step) or ``"constant"`` (the step-0 draw every step).

    Args:
        criteria: ``"random"`` or ``"constant"``.
        seed: The run's seed; 0 reproduces the authors' draws.
    """

    def __init__(self, *, criteria: str, seed: int):
        self.criteria, self.seed = criteria, seed

    def draw(self, step: int, k: int, eligible: list[int], state: RunState, data: RunData) -> list[int]:
        return draw_exemplar_indices(eligible, k, step, seed=self.seed, criteria=self.criteria)


class ExemplarPicker:
    """Draws a step's training problems with an exemplar policy and renders them as (question, answer) pairs.

    Args:
        policy: Which problems to show (:class:`UniformExemplars`, or an extension's policy).
        data: The run's examples.
        num_exemplars: How many problems a meta-prompt shows.
    """

    def __init__(self, *, policy: ExemplarPolicy, data: RunData, num_exemplars: int):
        self.policy, self.data, self.num_exemplars = policy, data, num_exemplars

    def _has_answer(self, index: int, predictor: str, best: Candidate | None) -> bool:
        if self.data.label_fields(index, predictor):
            return True
        answer = best.answers.get(index) if best is not None else None
        return bool(answer) and answer != NO_REFERENCE_NOTE

    def draw(self, step: int, predictor: str, state: RunState) -> list[int]:
        """The sorted training indices shown at ``step``."""
        best = state.best()
        # The authors draw from every training example; only one with neither a usable label nor a usable answer
        # (the best program's output the metric accepted, or the metric's feedback) has nothing to show.
        eligible = [i for i in range(len(self.data.trainset)) if self._has_answer(i, predictor, best)]
        return self.policy.draw(step, min(self.num_exemplars, len(eligible)), eligible, state, self.data)

    def pairs(self, indices: list[int], predictor: str, state: RunState) -> list[tuple[str, str]]:
        """The drawn problems as (question, answer): the labels, else the best program's recorded answer."""
        best = state.best()
        pairs = []
        for i in indices:
            fields = self.data.label_fields(i, predictor)
            if fields:
                answer = render_fields({name: self.data.trainset[i][name] for name in fields})
            else:
                answer = (best.answers.get(i) if best is not None else None) or NO_REFERENCE_NOTE
            pairs.append((self.data.question(i), answer))
        return pairs


__all__ = ["ExemplarPicker", "ExemplarPolicy", "UniformExemplars", "draw_exemplar_indices",
           "predictor_history"]
