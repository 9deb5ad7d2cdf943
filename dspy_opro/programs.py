"""The search variable: the instructions of a DSPy program's predictors, read, set and fingerprinted."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import dspy

from dspy_opro.placement import AFTER_INPUTS, check_instruction_pos, place_after_inputs
from dspy_opro.state import digest


def predictor_map(program: dspy.Module) -> dict[str, Any]:
    """The program's predictors by name, as ``program.named_predictors()`` names them."""
    return dict(program.named_predictors())


# Text a DSPy module writes into a predictor's instructions that the program needs to work, and that the search
# must therefore leave alone: dspy.ReAct appends its agent protocol and the list of tools to the user's task
# instructions. OPRO optimizes the part before it and keeps this tail verbatim.
FIXED_TAIL_MARKERS = ("You are an Agent. In each episode, you will be given the fields",)


def split_instructions(text: str) -> tuple[str, str]:
    """Split instructions into the searchable head and a fixed tail (``""`` when there is none).

    ``head + tail`` is the original text; the head keeps no trailing blank lines, which go to the tail.
    """
    for marker in FIXED_TAIL_MARKERS:
        at = text.find(marker)
        if at != -1:
            head = text[:at].rstrip()
            return head, text[len(head):]
    return text, ""


def read_instructions(program: dspy.Module, names: Sequence[str]) -> dict[str, str]:
    """The searchable instructions of the named predictors (without a fixed tail such as ReAct's tool list)."""
    predictors = predictor_map(program)
    return {name: split_instructions(predictors[name].signature.instructions)[0] for name in names}


def with_instructions(program: dspy.Module, instructions: Mapping[str, str], *,
                      instruction_pos: str = "Q_begin") -> dspy.Module:
    """A deep copy of ``program`` whose named predictors carry the given texts, fixed tails kept.

    Args:
        program: The program as given (not modified).
        instructions: The text for each named predictor.
        instruction_pos: Where each text goes (:mod:`dspy_opro.placement`): the signature's instructions for
            ``"Q_begin"`` and ``"before_Q"``, an input field after the inputs for ``"Q_end"``.
    """
    check_instruction_pos(instruction_pos)
    copy = program.deepcopy()
    predictors = predictor_map(copy)
    for name, text in instructions.items():
        predictor = predictors[name]
        tail = split_instructions(predictor.signature.instructions)[1]
        if instruction_pos in AFTER_INPUTS:
            place_after_inputs(predictor, text, tail)
            continue
        if tail and not text:
            tail = tail.lstrip()
        predictor.signature = predictor.signature.with_instructions(text + tail)
    return copy


def output_fields(program: dspy.Module, name: str) -> list[str]:
    """The output field names of one predictor's signature."""
    return list(predictor_map(program)[name].signature.output_fields)


def program_fingerprint(program: dspy.Module) -> str:
    """A digest of the program's structure: predictor names, their fields and instructions."""
    shape = []
    for name, predictor in program.named_predictors():
        signature = predictor.signature
        shape.append({
            "name": name,
            "inputs": list(signature.input_fields),
            "outputs": list(signature.output_fields),
            "instructions": signature.instructions,
            "demos": len(getattr(predictor, "demos", []) or []),
        })
    return digest({"class": type(program).__name__, "predictors": shape})


def dataset_fingerprint(examples: Sequence[dspy.Example] | None) -> str:
    """A digest of a dataset's contents and input keys."""
    if not examples:
        return digest([])
    rows = [{"data": dict(example.items()), "inputs": sorted(example.inputs().keys())} for example in examples]
    return digest(rows)
