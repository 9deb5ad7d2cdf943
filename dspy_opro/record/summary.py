"""What the returned program carries of its run: the whole record in memory, a short summary when it is saved.

The run record (every candidate with its per-example scores, every meta-prompt with its training problems) is
tens to hundreds of kilobytes, and it lives in ``log_dir/state.json``. The returned program holds it as
``program.opro_run`` for the session that compiled it, but ``program.save(path, save_program=True)`` (DSPy's
cloudpickle of the whole program) stores only an :class:`OPRORunSummary` in its place: the selected candidate, its
scores and step, the run's count of evaluations and cost, and the folder of the record. ``candidate_programs`` is
saved without its programs (the instructions and scores remain: :func:`dspy_opro.task.programs.with_instructions`
rebuilds any of them). With ``track_stats=True`` the program carries the whole record and every candidate program
wherever it goes, as GEPA's ``detailed_results`` does.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from typing import Any

import dspy
from pydantic import BaseModel, ConfigDict, PrivateAttr

from dspy_opro.state import Candidate, RunState, ranked_candidates


class OPRORunSummary(BaseModel):
    """A saved program's note of the run that made it; the whole record is ``state.json`` in ``log_dir``."""

    model_config = ConfigDict(frozen=True)

    status: str
    """The run's status when the program was returned (``"finished"`` or ``"stopped"``)."""
    candidate_id: int | None
    """The returned candidate."""
    selected_by: str | None
    """The rule that chose it (``"train"``, ``"validation"``, ``"val_gate"``, ``"start"``)."""
    score: float | None
    """Its training mean."""
    val_score: float | None
    """Its validation mean, where the run scored it."""
    step: int | None
    """The step that proposed it (-1: the program as given or an initial instruction)."""
    instructions: dict[str, str]
    """Its instruction for each target predictor."""
    metric_calls: int
    """Evaluations the run made."""
    total_cost: float | None
    """The run's cost in USD, as recorded."""
    log_dir: str | None
    """The folder of the run record (``state.json``); None when the run kept no record on disk."""


def summarize(state: RunState, log_dir: str | None) -> OPRORunSummary:
    """The summary of a run whose selection is made."""
    selection = state.selection
    chosen = state.candidates[selection.candidate_id] if selection is not None else None
    return OPRORunSummary(
        status=state.status, candidate_id=chosen.id if chosen is not None else None,
        selected_by=selection.selected_by if selection is not None else None,
        score=chosen.score if chosen is not None else None, val_score=chosen.val_score if chosen is not None else None,
        step=chosen.step if chosen is not None else None,
        instructions=dict(chosen.instructions) if chosen is not None else {}, metric_calls=state.metric_calls,
        total_cost=state.usage.total_cost, log_dir=os.path.abspath(log_dir) if log_dir is not None else None)


class AttachedRunState(RunState):
    """The run record as a returned program carries it: whole in memory and in a deep copy, its
    :class:`OPRORunSummary` when pickled."""

    _log_dir: str | None = PrivateAttr(default=None)

    def __reduce__(self) -> tuple[Any, ...]:
        return _summary_from_dict, (summarize(self, self._log_dir).model_dump(),)

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> AttachedRunState:
        # Field by field: pydantic's model_copy(deep=True) would call copy.deepcopy on this very object again.
        fields = {name: copy.deepcopy(getattr(self, name), memo) for name in RunState.model_fields}
        return attach(RunState.model_construct(_fields_set=set(self.model_fields_set), **fields), self._log_dir)


def attach(state: RunState, log_dir: str | None) -> AttachedRunState:
    """``state`` as an :class:`AttachedRunState` sharing its contents (nothing is copied or validated again)."""
    attached = AttachedRunState.model_construct(
        _fields_set=set(state.model_fields_set), **{name: getattr(state, name) for name in RunState.model_fields})
    attached._log_dir = log_dir
    return attached


class CandidateList(list):  # type: ignore[type-arg]
    """``candidate_programs`` as a returned program carries it: whole in memory and in a deep copy, pickled without
    the programs themselves."""

    def __reduce__(self) -> tuple[Any, ...]:
        return list, ([{key: value for key, value in entry.items() if key != "program"} for entry in self],)

    def __deepcopy__(self, memo: dict[int, Any]) -> CandidateList:
        return CandidateList(copy.deepcopy(list(self), memo))


def _summary_from_dict(data: dict[str, Any]) -> OPRORunSummary:
    return OPRORunSummary(**data)


def attach_result(state: RunState, program_of: Callable[[Candidate], dspy.Module], *, log_dir: str | None,
                  track_stats: bool) -> dspy.Module:
    """The program of the selected candidate, carrying ``candidate_programs`` (every scored candidate, best first)
    and ``opro_run`` (the record; as an :class:`AttachedRunState` unless ``track_stats``, which carries it whole
    wherever it goes)."""
    assert state.selection is not None
    program = program_of(state.candidates[state.selection.candidate_id])
    candidates = [{"score": c.score, "program": program_of(c), "instructions": dict(c.instructions), "step": c.step,
                   "val_score": c.val_score} for c in ranked_candidates(state.candidates)]
    # Not marked compiled (``_compiled``), as COPRO and MIPROv2 leave theirs: BootstrapFewShot and other optimizers
    # refuse a compiled student, and stacking them on OPRO's instructions is the common recipe.
    program.candidate_programs = candidates if track_stats else CandidateList(candidates)  # type: ignore[attr-defined]
    program.opro_run = state if track_stats else attach(state, log_dir)  # type: ignore[attr-defined]
    return program
