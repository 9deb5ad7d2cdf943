"""The search variable: the instructions of a DSPy program's predictors, read, set and fingerprinted."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import dspy

from dspy_opro.state import digest


def predictor_map(program: dspy.Module) -> dict[str, Any]:
    """The program's predictors by name, as ``program.named_predictors()`` names them."""
    return dict(program.named_predictors())


def read_instructions(program: dspy.Module, names: Sequence[str]) -> dict[str, str]:
    """The current instructions of the named predictors."""
    predictors = predictor_map(program)
    return {name: predictors[name].signature.instructions for name in names}


def with_instructions(program: dspy.Module, instructions: Mapping[str, str]) -> dspy.Module:
    """A deep copy of ``program`` whose named predictors carry the given instructions."""
    copy = program.deepcopy()
    predictors = predictor_map(copy)
    for name, text in instructions.items():
        predictor = predictors[name]
        predictor.signature = predictor.signature.with_instructions(text)
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
