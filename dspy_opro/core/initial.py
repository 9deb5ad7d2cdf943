"""Initial instructions: extra starting instructions scored at step -1 beside the program's own.

The authors start ``run_evolution`` from a list of initial instructions, score each one on the training set before
the first step, and put each in the history with step -1, so the first meta-prompt already shows several
instructions with their scores. ``initial_instructions`` does the same for a DSPy program, whose own instructions
are always the first entry (candidate 0, the program as given):

* a list applies to the one predictor being optimized; a program with several target predictors needs a mapping
  ``{predictor name: [instructions]}``, since one text rarely suits predictors that do different jobs;
* each text becomes a candidate of step -1 that changes that one predictor (the others keep the program's own
  instructions), scored as given (the authors neither polish nor filter their initial instructions);
* a text whose md5 equals the predictor's own instruction, or an earlier text of the same list, is recorded as
  ``skipped`` with the reason and never scored (the authors would score it twice, as their Q4 does for a
  regenerated instruction).

:func:`check_initial_instructions` checks and freezes the setting at construction; :func:`initial_by_predictor`
resolves it against the program's predictors at ``compile``, before any LM call; :func:`initial_candidates` makes
the step -1 candidates of a new run record.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dspy_opro.core.meta_prompt import instruction_md5
from dspy_opro.state import Candidate, CandidateStatus

InitialInstructions = tuple[str, ...] | dict[str, tuple[str, ...]]

OWN_INSTRUCTION = "the program's own instruction"


def _check_texts(name: str, texts: Any) -> tuple[str, ...]:
    if isinstance(texts, (str, bytes)) or not isinstance(texts, Sequence):
        shown = "a single string" if isinstance(texts, (str, bytes)) else f"a {type(texts).__name__}"
        raise TypeError(f"{name} must be a list of instruction strings; got {shown} ({texts!r:.80}). Wrap it in a "
                        f"list: {name}=['...']")
    for position, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"{name}[{position}] is a {type(text).__name__} ({text!r:.80}), not a string; every "
                            "initial instruction is the text of an instruction")
        if not text.strip():
            raise ValueError(f"{name}[{position}] is {'empty' if not text else 'only whitespace'}; an initial "
                             "instruction needs text (the program's own instruction is always scored: leave it out)")
    return tuple(texts)


def check_initial_instructions(value: Any) -> InitialInstructions | None:
    """The setting checked and frozen: None, a tuple of texts, or a dict of predictor name -> tuple of texts.

    Raises:
        TypeError: Not a list or a mapping of lists, a bare string, a non-string entry or predictor name.
        ValueError: An empty or whitespace-only instruction or predictor name.
    """
    if value is None:
        return None
    if isinstance(value, Mapping):
        frozen: dict[str, tuple[str, ...]] = {}
        for predictor, texts in value.items():
            if not isinstance(predictor, str) or not predictor:
                raise TypeError(f"initial_instructions maps predictor names (as in program.named_predictors()) to "
                                f"lists of instructions; got the key {predictor!r}")
            frozen[predictor] = _check_texts(f"initial_instructions[{predictor!r}]", texts)
        return frozen
    return _check_texts("initial_instructions", value)


def initial_settings(value: InitialInstructions | None) -> list[str] | dict[str, list[str]] | None:
    """The setting as JSON has it (for the recorded settings and the resume fingerprint)."""
    if value is None:
        return None
    if isinstance(value, dict):
        return {predictor: list(texts) for predictor, texts in value.items()}
    return list(value)


def initial_by_predictor(value: InitialInstructions | None, *, targets: Sequence[str],
                         all_predictors: Sequence[str]) -> dict[str, list[str]]:
    """The initial instructions of each target predictor that has some, in the run's target order.

    Args:
        value: The checked setting.
        targets: The predictors the run optimizes.
        all_predictors: Every predictor of the program.

    Raises:
        ValueError: A list for a program with several target predictors, or a mapping that names a predictor the
            program does not have or the run does not optimize.
    """
    if not value:
        return {}
    if not isinstance(value, dict):
        if len(targets) != 1:
            raise ValueError(
                f"initial_instructions is a list, but the run optimizes {len(targets)} predictors {list(targets)}; "
                "say which predictor each instruction is for with a mapping, e.g. initial_instructions="
                f"{{{targets[0]!r}: ['...']}}"
            )
        return {targets[0]: list(value)}
    unknown = [name for name in value if name not in all_predictors]
    if unknown:
        raise ValueError(f"initial_instructions names unknown predictors {unknown}; the program's predictors are "
                         f"{list(all_predictors)}")
    untargeted = [name for name in value if name not in targets]
    if untargeted:
        raise ValueError(f"initial_instructions names predictors {untargeted} that the run does not optimize "
                         f"(predictors={list(targets)}); add them to predictors or drop their instructions")
    return {name: list(value[name]) for name in targets if value.get(name)}


def initial_candidates(by_predictor: Mapping[str, Sequence[str]], *, start: Mapping[str, str], first_id: int,
                       n_train: int) -> list[Candidate]:
    """The step -1 candidates of the initial instructions, numbered from ``first_id`` in the given order.

    Each changes one predictor of the program as given (``start``: every target's own instruction). A text whose
    md5 equals that predictor's own instruction or an earlier text for it is ``skipped``, naming what it repeats.
    """
    candidates: list[Candidate] = []
    for predictor, texts in by_predictor.items():
        seen = {instruction_md5(start[predictor]): OWN_INSTRUCTION}
        for text in texts:
            md5 = instruction_md5(text)
            repeats = seen.get(md5)
            candidate = Candidate(
                id=first_id + len(candidates), step=-1, predictor=predictor, instruction=text,
                instructions={**start, predictor: text}, md5=md5,
                status=CandidateStatus.SKIPPED if repeats else CandidateStatus.PENDING,
                reason=f"duplicate of {repeats}" if repeats else None,
                scores=[] if repeats else [None] * n_train)
            candidates.append(candidate)
            seen.setdefault(md5, f"candidate {candidate.id}, an earlier initial instruction")
    return candidates


__all__ = [
    "InitialInstructions",
    "check_initial_instructions",
    "initial_by_predictor",
    "initial_candidates",
    "initial_settings",
]
