"""Where the optimized text sits in the task model's prompt: the program side of ``instruction_pos``.

The authors' ``instruction_pos`` says where their scorer prompt carries the instruction, and the meta-prompt shows
the optimizer model the same place (``<INS>`` inside each problem). The program must put the text there too, or
the optimizer is asked for one thing and the program does another. DSPy builds the task model's prompt in its
adapter from a predictor's signature, so the placement is expressed through the signature:

* ``"Q_begin"`` (the instruction, then the question) and ``"before_Q"`` (the instruction on the line before
  ``Q:``): the signature's instructions. DSPy's adapters write them into the system message, which comes before
  the user message holding the inputs: the text precedes the question, as in both of the authors' layouts.
* ``"Q_end"`` (the question, then the instruction): an input field appended after the signature's inputs, whose
  default value is the text. Every DSPy adapter writes input fields into the user message in signature order, so
  the text follows the question (ChatAdapter: ``[[ ## question ## ]]`` ... then ``[[ ## instruction ## ]]``
  ... then the request for the outputs). The signature's instructions become DSPy's default description of the
  task (or the fixed tail of a ``dspy.ReAct`` predictor), so the text appears once, after the inputs.
  DSPy's JSON state keeps no field defaults and pairs saved field descriptions with a fresh program's fields by
  position, so such a predictor (:class:`TextAfterInputs`) saves the state of the signature without the extra field
  and the text beside it (``"opro_after_inputs"``): a fresh program loads the file without a shifted field, and
  :func:`load_program` (or a program that already has the field) puts the text back after the inputs.
* ``"A_begin"`` (the text as the start of the answer): refused. DSPy has no way to make the task model's answer
  start with a given text: its adapters end the prompt with a user message asking for the output fields (there
  is no assistant prefill), and an output field's ``prefix`` is deprecated and has no effect in DSPy 3.
"""

from __future__ import annotations

from typing import Any

import dspy
from dspy import Signature

# How each position is realised in the program.
IN_INSTRUCTIONS = ("Q_begin", "before_Q")
AFTER_INPUTS = ("Q_end",)
# The input field carrying a Q_end text; the first name the signature does not use yet is taken.
AFTER_INPUTS_FIELD_NAMES = ("instruction", "opro_instruction", "opro_instruction_text")


def check_instruction_pos(instruction_pos: str) -> None:
    """Refuse a position the program cannot honour, before any model call.

    Raises:
        ValueError: For ``"A_begin"`` (and any unknown position), naming why and what to use instead.
    """
    if instruction_pos in IN_INSTRUCTIONS + AFTER_INPUTS:
        return
    if instruction_pos == "A_begin":
        raise ValueError(
            "instruction_pos='A_begin' asks the optimizer for a sentence that starts the task model's answer, but a "
            "DSPy program cannot start the answer with a given text: DSPy's adapters end the prompt with a user "
            "message asking for the output fields (no assistant prefill), and an output field's prefix has no "
            "effect in DSPy 3. Use instruction_pos='Q_end' (the text after the inputs, e.g. \"Let's think step by "
            "step.\") or 'Q_begin' (the predictor's instructions, before the inputs)"
        )
    raise ValueError(f"instruction_pos must be 'Q_begin', 'Q_end' or 'before_Q'; got {instruction_pos!r}")


def after_inputs_field(signature: type[Signature]) -> str:
    """The name of the input field that carries a ``Q_end`` text in ``signature`` (a name it does not use)."""
    for name in AFTER_INPUTS_FIELD_NAMES:
        if name not in signature.fields:
            return name
    raise ValueError(
        f"the signature {signature.signature!r} already uses the field names {list(AFTER_INPUTS_FIELD_NAMES)}; "
        "rename one of them to optimize it with instruction_pos='Q_end'"
    )


def default_instructions(signature: type[Signature]) -> str:
    """DSPy's own description of a signature without instructions ("Given the fields ..., produce the fields ...")."""
    inputs = ", ".join(f"`{name}`" for name in signature.input_fields)
    outputs = ", ".join(f"`{name}`" for name in signature.output_fields)
    return f"Given the fields {inputs}, produce the fields {outputs}."


def place_after_inputs(predictor: Any, text: str, tail: str, *, name: str | None = None) -> None:
    """Give ``predictor`` the ``Q_end`` text as a defaulted input field after its inputs (in place).

    Args:
        predictor: A predictor of a copied program (its signature, demos and class are replaced).
        text: The optimized text.
        tail: The fixed tail of its instructions (``dspy.ReAct``'s protocol), kept in the instructions.
        name: The field's name (a saved one); by default the first that the signature does not use.
    """
    carried: str | None = getattr(predictor, "after_inputs_field", None)
    if carried is not None and text_after_inputs(predictor) is not None:  # compiled so: replaced, in its field
        predictor.signature = predictor.signature.delete(carried)
        predictor.demos = [_without_field(demo, carried) for demo in predictor.demos or []]
        name = name or carried
    signature = predictor.signature
    name = name or after_inputs_field(signature)
    instructions = tail.lstrip() or default_instructions(signature)
    predictor.signature = signature.with_instructions(instructions).append(
        name, dspy.InputField(default=text), type_=str
    )
    # Demos (e.g. from BootstrapFewShot) carry the text too, so that DSPy renders them as complete examples.
    predictor.demos = [_with_field(demo, name, text) for demo in predictor.demos or []]
    if not isinstance(predictor, TextAfterInputs):
        predictor.__class__ = _saving_class(type(predictor))
    predictor.after_inputs_field = name


def text_after_inputs(predictor: Any) -> str | None:
    """The ``Q_end`` text ``predictor`` carries after its inputs, if it carries one."""
    name = getattr(predictor, "after_inputs_field", None)
    field = predictor.signature.input_fields.get(name) if isinstance(name, str) else None
    return field.default if field is not None and isinstance(field.default, str) else None


SAVED_KEY = "opro_after_inputs"


class TextAfterInputs:
    """A predictor whose ``Q_end`` text is an extra input field, saved so that DSPy's JSON load cannot shift fields.

    ``dump_state`` writes the state of the signature without the extra field (what a fresh program's signature
    pairs with, field by field) and the text under ``"opro_after_inputs"``; ``load_state`` reads such a state back
    whole. DSPy's own ``Predict.load_state`` sets that key on a fresh predictor as a plain attribute, which
    :func:`load_program` turns back into the field.
    """

    after_inputs_field: str | None = None
    signature: Any
    demos: list[Any]

    def dump_state(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        state: dict[str, Any] = super().dump_state(*args, **kwargs)  # type: ignore[misc]
        name, text = self.after_inputs_field, text_after_inputs(self)
        if name is None or text is None:
            return state
        position = list(self.signature.fields).index(name)
        fields = [field for at, field in enumerate(state["signature"]["fields"]) if at != position]
        state["signature"] = {**state["signature"], "fields": fields}
        state["demos"] = [_without_field(demo, name) for demo in state["demos"]]
        state[SAVED_KEY] = {"field": name, "text": text}
        return state

    def load_state(self, state: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        if self.after_inputs_field is not None and text_after_inputs(self) is not None:
            self.signature = self.signature.delete(self.after_inputs_field)  # the fields the file was saved with
        self.after_inputs_field = None
        saved = state.get(SAVED_KEY)
        super().load_state({key: value for key, value in state.items() if key != SAVED_KEY},  # type: ignore[misc]
                           *args, **kwargs)
        if saved is not None:
            _place_saved(self, saved)
        return self


def _place_saved(predictor: Any, saved: Any) -> None:
    if not (isinstance(saved, dict) and isinstance(saved.get("text"), str) and isinstance(saved.get("field"), str)):
        raise ValueError(f"a saved {SAVED_KEY!r} entry must hold the strings 'field' and 'text'; got {saved!r}")
    if saved["field"] in predictor.signature.fields:
        raise ValueError(f"the saved Q_end field {saved['field']!r} is already a field of the signature "
                         f"{predictor.signature.signature!r}: "
                         "load the file into the program it was compiled from")
    # The loaded instructions are the compiled ones (DSPy's default description, or a ReAct tail): kept.
    place_after_inputs(predictor, saved["text"], predictor.signature.instructions, name=saved["field"])


class QEndPredict(TextAfterInputs, dspy.Predict):
    """``dspy.Predict`` carrying a ``Q_end`` text (:class:`TextAfterInputs`); importable, so ``pickle`` keeps it."""


_SAVING_CLASSES: dict[type, type] = {dspy.Predict: QEndPredict}


def _saving_class(base: type) -> type:
    # Another predictor class (the user's own) gets a subclass made once per class; not importable, so cloudpickle
    # (DSPy's save_program=True) saves it by value.
    if base not in _SAVING_CLASSES:
        _SAVING_CLASSES[base] = type(f"QEnd{base.__name__}", (TextAfterInputs, base), {"__module__": __name__})
    return _SAVING_CLASSES[base]


def load_program(program: dspy.Module, path: str, **load_kwargs: Any) -> dspy.Module:
    """``program.load(path)``, then each ``Q_end`` text the file holds put back after its predictor's inputs.

    DSPy's own ``load`` restores everything else a compiled program saved; a fresh program's predictors do not know
    the field a ``Q_end`` text lives in, so this puts it back (a program of any other ``instruction_pos`` loads as
    with ``program.load``). Returns ``program``.
    """
    program.load(path, **load_kwargs)
    for _, predictor in program.named_predictors():
        saved = getattr(predictor, SAVED_KEY, None)  # where DSPy's Predict.load_state put the entry
        if saved is not None:
            delattr(predictor, SAVED_KEY)
            _place_saved(predictor, saved)
    return program


def _without_field(demo: Any, name: str) -> Any:
    if isinstance(demo, dspy.Example):
        return demo.without(name) if name in demo else demo
    if isinstance(demo, dict):
        return {key: value for key, value in demo.items() if key != name}
    return demo


def _with_field(demo: Any, name: str, text: str) -> Any:
    if isinstance(demo, dspy.Example):
        return demo.copy(**{name: text})
    if isinstance(demo, dict):
        return {**demo, name: text}
    return demo


__all__ = [
    "AFTER_INPUTS",
    "IN_INSTRUCTIONS",
    "QEndPredict",
    "TextAfterInputs",
    "after_inputs_field",
    "check_instruction_pos",
    "default_instructions",
    "load_program",
    "place_after_inputs",
    "text_after_inputs",
]
