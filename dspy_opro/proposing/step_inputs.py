"""What one step's meta-prompt shows: the predictor's scored history and a few training problems with answers.

The history of a predictor is its instruction in the program as given and its scored initial instructions (both
step -1), then every scored instruction proposed for it, each with its training score (a raced-out one with its
partial mean); :func:`dspy_opro.proposing.meta_prompt.gen_meta_prompt` sorts, filters and buckets it as the authors do. The
problems are drawn by :class:`ExemplarPicker`: the authors' uniform draw (``"random"`` or ``"constant"``,
:func:`dspy_opro.proposing.exemplars.draw_exemplar_indices`) or the hard-and-diverse DPP (:mod:`dspy_opro.extensions.hard_diverse`), from
every training example that has something to show as its answer.
"""

from __future__ import annotations

from dspy_opro.config import OPROConfig
from dspy_opro.task.data import RunData
from dspy_opro.proposing.exemplars import NO_REFERENCE_NOTE, draw_exemplar_indices, render_fields
from dspy_opro.record.state import Candidate, RunState


def predictor_history(state: RunState, predictor: str) -> list[tuple[str, float, int]]:
    """``(instruction, score, step)`` of every scored candidate that set ``predictor``'s instruction.

    A candidate racing stopped appears with its partial mean, the mean over the examples it ran.
    """
    history = []
    for candidate in state.with_scores():
        if candidate.predictor is None:
            history.append((candidate.instructions[predictor], candidate.score, -1))
        elif candidate.predictor == predictor:
            history.append((candidate.instruction, candidate.score, candidate.step))
    return history


class ExemplarPicker:
    """Draws a step's training problems and renders them as (question, answer) pairs."""

    def __init__(self, config: OPROConfig, data: RunData):
        self.config = config
        self.data = data
        self._features = None  # hard_diverse: the questions' features, built once per compile

    def _has_answer(self, index: int, predictor: str, best: Candidate | None) -> bool:
        if self.data.label_fields(index, predictor):
            return True
        answer = best.answers.get(index) if best is not None else None
        return bool(answer) and answer != NO_REFERENCE_NOTE

    def draw(self, step: int, predictor: str, state: RunState) -> list[int]:
        """The sorted training indices shown at ``step``."""
        config, best = self.config, state.best()
        # The authors draw from every training example; only one with neither a usable label nor a usable answer
        # (the best program's output the metric accepted, or the metric's feedback) has nothing to show.
        eligible = [i for i in range(len(self.data.trainset)) if self._has_answer(i, predictor, best)]
        k = min(config.num_exemplars, len(eligible))
        if config.exemplar_selection != "hard_diverse":
            return draw_exemplar_indices(eligible, k, step, seed=config.seed, criteria=config.exemplar_selection)
        from dspy_opro.extensions.hard_diverse import QuestionFeatures

        difficulties = None
        scored = [c for c in state.scored() if c.scores]
        if step > 0 and scored:
            difficulties = []
            for i in eligible:
                values = [c.scores[i] for c in scored if c.scores[i] is not None]
                difficulties.append(1.0 - sum(values) / len(values) if values else 1.0)
        if self._features is None:
            self._features = QuestionFeatures.build([self.data.question(i) for i in range(len(self.data.trainset))])
        picked = self._features.select(difficulties, k, subset=eligible, theta=config.diversity_theta)
        return sorted(eligible[j] for j in picked.indices)

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


__all__ = ["ExemplarPicker", "predictor_history"]
