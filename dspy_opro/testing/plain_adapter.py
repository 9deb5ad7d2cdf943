"""A plain one-message adapter, for models too small for DSPy's default adapters.

DSPy's ``ChatAdapter`` writes a system message describing the fields and asks for ``[[ ## answer ## ]]`` markers;
a 135M-parameter model answers such a prompt with code or with the markers' text, and scores 0 whatever the
instruction. :class:`PlainAdapter` sends one user message instead: the instruction, each input field as
``Name: value``, and a last line naming the output (``Capital:``); the whole reply is the (first) output field.
With it the instruction is what the model reads first, so the instruction matters and OPRO has something to find.

Imports: ``dspy`` (this module is not imported by ``dspy_opro.testing``'s ``__init__``).
"""

from __future__ import annotations

from typing import Any

import dspy
from dspy.signatures.signature import Signature


class PlainAdapter(dspy.Adapter):
    """One user message (instruction, then ``Name: value`` per input), the whole reply as the first output field.

    Demos are written before the inputs, each as its input lines and a ``Name: value`` line of the first output.
    Any further output fields are returned empty: COPRO's proposer, for one, asks for an instruction and an output
    prefix, and a model this small writes only the instruction.
    """

    def format(self, signature: type[Signature], demos: list[dict[str, Any]],
               inputs: dict[str, Any]) -> list[dict[str, Any]]:
        output = _first_output(signature)
        parts = [signature.instructions.strip()] if signature.instructions.strip() else []
        for demo in demos:
            if all(demo.get(name) is not None for name in (*signature.input_fields, output)):
                parts.append(_fields(signature, demo) + f"\n{_label(signature, output)}: {demo[output]}")
        # The last line names the answer it wants: a small chat model then writes that, not a conversation.
        parts.append(_fields(signature, inputs) + f"\n{_label(signature, output)}:")
        return [{"role": "user", "content": "\n\n".join(parts)}]

    def parse(self, signature: type[Signature], completion: str) -> dict[str, Any]:
        first = _first_output(signature)
        return {name: completion.strip() if name == first else "" for name in signature.output_fields}


def _first_output(signature: type[Signature]) -> str:
    names = list(signature.output_fields)
    if not names:
        raise ValueError(f"PlainAdapter needs an output field; {signature.__name__} has none")
    return names[0]


def _label(signature: type[Signature], name: str) -> str:
    return name.replace("_", " ").capitalize()


def _fields(signature: type[Signature], values: dict[str, Any]) -> str:
    return "\n".join(f"{_label(signature, name)}: {values.get(name, '')}" for name in signature.input_fields)
