"""The search variable: the instructions of a DSPy program's predictors, read, set and fingerprinted."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import types
from collections.abc import Mapping, Sequence
from typing import Any

import dspy

from dspy_opro.compat import AGENT_PROTOCOL_MARKERS
from dspy_opro.state import digest
from dspy_opro.task.placement import AFTER_INPUTS, check_instruction_pos, place_after_inputs, text_after_inputs


def predictor_map(program: dspy.Module) -> dict[str, Any]:
    """The program's predictors by name, as ``program.named_predictors()`` names them."""
    return dict(program.named_predictors())


def split_instructions(text: str) -> tuple[str, str]:
    """Split instructions into the searchable head and a fixed tail (``""`` when there is none): the text a DSPy
    agent module (``dspy.ReAct``, ``dspy.ReActV2``) appends to the user's instructions, its protocol and list of
    tools, which the program needs to work and the search must leave alone.

    ``head + tail`` is the original text; the head keeps no trailing blank lines, which go to the tail.
    """
    for marker in AGENT_PROTOCOL_MARKERS:
        at = text.find(marker)
        if at != -1:
            head = text[:at].rstrip()
            return head, text[len(head):]
    return text, ""


def read_instructions(program: dspy.Module, names: Sequence[str], *,
                      instruction_pos: str = "Q_begin") -> dict[str, str]:
    """The searchable instructions of the named predictors (without a fixed tail such as ReAct's tool list); for
    ``"Q_end"``, the text after the inputs of a predictor that carries one (a program compiled so before)."""
    predictors = predictor_map(program)
    texts = {name: split_instructions(predictors[name].signature.instructions)[0] for name in names}
    if instruction_pos in AFTER_INPUTS:
        texts.update((name, text) for name in names if (text := text_after_inputs(predictors[name])) is not None)
    return texts


def with_instructions(program: dspy.Module, instructions: Mapping[str, str], *,
                      instruction_pos: str = "Q_begin") -> dspy.Module:
    """A deep copy of ``program`` whose named predictors carry the given texts, fixed tails kept.

    Args:
        program: The program as given (not modified).
        instructions: The text for each named predictor.
        instruction_pos: Where each text goes (:mod:`dspy_opro.task.placement`): the signature's instructions for
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
        signature: Any = predictor.signature
        shape.append({
            "name": name,
            "inputs": list(signature.input_fields),
            "outputs": list(signature.output_fields),
            "instructions": signature.instructions,
            "demos": [_demo_content(demo) for demo in getattr(predictor, "demos", []) or []],
        })
    return digest({"class": type(program).__name__, "predictors": shape})


def _demo_content(demo: Any) -> Any:
    if isinstance(demo, dspy.Example):
        return content_shape(dict(demo.items()))
    return content_shape(dict(demo)) if isinstance(demo, Mapping) else content_shape(demo)


_JSON_SCALARS = (str, int, float, bool, type(None))


def content_shape(value: Any, depth: int = 0) -> Any:
    """A JSON-able rendering of a value by its content, the same in every process: JSON values as they are (so
    fingerprints of plain data are unchanged), arrays, images and bytes by a digest of all their bytes, pydantic
    models and dataclasses by their fields, other objects by their class and attributes; never a repr that holds a
    memory address or elides the middle of an array."""
    if isinstance(value, _JSON_SCALARS):
        return value
    if depth > 20:  # a structure that deep (or cyclic) counts by its type from here
        return f"<{type(value).__qualname__}>"
    if isinstance(value, Mapping):
        return {str(key): content_shape(item, depth + 1) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [content_shape(item, depth + 1) for item in value]
    if isinstance(value, (set, frozenset)):
        return sorted((content_shape(item, depth + 1) for item in value), key=repr)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"bytes": hashlib.sha256(bytes(value)).hexdigest()}
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    if callable(getattr(value, "tobytes", None)):  # a numpy array or scalar, a PIL image
        try:
            shape = [str(getattr(value, name, "")) for name in ("dtype", "shape", "mode", "size")]
            return {"type": kind, "shape": shape, "bytes": hashlib.sha256(value.tobytes()).hexdigest()}
        except Exception:  # a tobytes that needs arguments: the attributes below
            pass
    if hasattr(value, "model_dump"):  # a pydantic model (dspy.Image, dspy.History, ...)
        try:
            return {"type": kind, "fields": content_shape(value.model_dump(), depth + 1)}
        except Exception:
            pass
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"type": kind, "fields": content_shape(dataclasses.asdict(value), depth + 1)}
    attributes = getattr(value, "__dict__", None)
    if isinstance(attributes, dict):
        return {"type": kind, "fields": content_shape(attributes, depth + 1)}
    text = repr(value)
    return {"type": kind} if " at 0x" in text else {"type": kind, "repr": text}


def _code_shape(code: types.CodeType) -> list[Any]:
    """What a code object computes: its bytecode, names and constants (nested code objects included)."""
    constants = [_code_shape(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts]
    return [code.co_code.hex(), list(code.co_names), list(code.co_varnames), constants]


def _value_shape(value: Any) -> Any:
    """A stable rendering of a closure value or default.

    Values that may change while the metric runs (unhashable ones such as a list used as a counter) and objects
    whose repr holds an address count by their type only.
    """
    if isinstance(value, types.FunctionType):
        return callable_fingerprint(value)
    try:
        hash(value)
    except TypeError:
        return f"<{type(value).__qualname__}>"
    text = repr(value)
    return f"<{type(value).__qualname__}>" if " at 0x" in text else text


def callable_fingerprint(function: Any) -> str | None:
    """``module.qualname#digest`` of a metric: the digest covers its code, defaults and closure values.

    Two lambdas, or a function edited between two runs, get different fingerprints; a callable object counts by
    its class's ``__call__`` and its attributes' values.
    """
    if function is None:
        return None
    target = function if hasattr(function, "__qualname__") else type(function)
    name = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', '?')}"
    inner = getattr(function, "__func__", function)  # bound methods
    if isinstance(function, functools.partial):
        shape: Any = [callable_fingerprint(function.func), [_value_shape(v) for v in function.args],
                      {key: _value_shape(v) for key, v in sorted(function.keywords.items())}]
    elif isinstance(inner, types.FunctionType):
        closure = [_value_shape(cell.cell_contents) for cell in inner.__closure__ or () if _cell_filled(cell)]
        shape = [_code_shape(inner.__code__), [_value_shape(v) for v in inner.__defaults__ or ()], closure]
    else:
        call = type(function).__call__ if callable(function) else None
        code = getattr(call, "__code__", None)
        attributes = {key: _value_shape(value) for key, value in sorted(vars(function).items())} \
            if hasattr(function, "__dict__") else {}
        shape = [_code_shape(code) if code is not None else None, attributes]
    return f"{name}#{digest(shape)}"


def _cell_filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def dataset_fingerprint(examples: Sequence[dspy.Example] | None) -> str:
    """A digest of a dataset's contents and input keys."""
    if not examples:
        return digest([])
    rows = [{"data": content_shape(dict(example.items())), "inputs": sorted(example.inputs().keys())}
            for example in examples]
    return digest(rows)
