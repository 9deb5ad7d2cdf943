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


def place_after_inputs(predictor: Any, text: str, tail: str) -> None:
    """Give ``predictor`` the ``Q_end`` text as a defaulted input field after its inputs (in place).

    Args:
        predictor: A predictor of a copied program (its signature and demos are replaced).
        text: The optimized text.
        tail: The fixed tail of its instructions (``dspy.ReAct``'s protocol), kept in the instructions.
    """
    signature = predictor.signature
    name = after_inputs_field(signature)
    instructions = tail.lstrip() or default_instructions(signature)
    predictor.signature = signature.with_instructions(instructions).append(
        name, dspy.InputField(default=text), type_=str
    )
    # Demos (e.g. from BootstrapFewShot) carry the text too, so that DSPy renders them as complete examples.
    predictor.demos = [_with_field(demo, name, text) for demo in predictor.demos or []]


def _with_field(demo: Any, name: str, text: str) -> Any:
    if isinstance(demo, dspy.Example):
        return demo.copy(**{name: text})
    if isinstance(demo, dict):
        return {**demo, name: text}
    return demo


__all__ = [
    "AFTER_INPUTS",
    "IN_INSTRUCTIONS",
    "after_inputs_field",
    "check_instruction_pos",
    "default_instructions",
    "place_after_inputs",
]
