"""The simulated model: classify a chat request and route it to the task model, the judge or a peer optimizer.

:func:`simulated_reply` reads an OpenAI-style message list and decides what it is being asked:

* ``"task"``: a DSPy ``ChatAdapter``/``JSONAdapter`` prompt of a program over the simulated dataset, answered by
  :func:`dspy_opro.testing.task_model.task_reply`;
* ``"opro"``: an OPRO meta-prompt, answered by :func:`dspy_opro.testing.peers.opro_reply`;
* ``"copro"`` / ``"mipro"`` / ``"gepa"``: the proposal prompts of DSPy's COPRO, MIPROv2 and GEPA (and the
  ``gepa`` package's raw reflective prompt), answered in :mod:`dspy_opro.testing.peers`;
* ``"judge"``: a signature with ``preference`` and ``rationale`` outputs;
* ``"unknown"``: everything else.

Nothing in ``dspy_opro.testing`` talks to a network or imports the rest of ``dspy_opro``.
"""

from __future__ import annotations

from dspy_opro.testing.adapter_prompts import AdapterPrompt, fill_outputs, message_text, parse_adapter_prompt
from dspy_opro.testing.peers import gepa_raw_reply, is_gepa_raw_prompt, is_opro_prompt, opro_reply, proposal_reply
from dspy_opro.testing.task_model import judge_reply, question_of, task_reply

__all__ = ["simulated_reply"]

# MIPROv2's proposer signatures: (output field, an input field it always comes with); None: no input needed.
_MIPRO_FIELDS = (
    ("proposed_instruction", None),
    ("observations", "examples"),
    ("summary", "observations"),
    ("program_description", "program_code"),
    ("module_description", "program_code"),
)


def _classify_adapter(prompt: AdapterPrompt) -> str:
    outputs = set(prompt.outputs)
    if "preference" in outputs and "rationale" in outputs:
        return "judge"
    if "proposed_prefix_for_output_field" in outputs:
        return "copro"
    inputs = set(prompt.input_names) | set(prompt.inputs)
    if any(output in outputs and (needs is None or needs in inputs) for output, needs in _MIPRO_FIELDS):
        return "mipro"
    if outputs & {"new_instruction", "shortened_instruction"}:
        return "gepa"
    if question_of(prompt) is not None:
        return "task"
    return "unknown"


def simulated_reply(messages: list[dict], *, sample: int = 0, seed: int = 0) -> tuple[str, str]:
    """Classify a chat request and answer it deterministically.

    Args:
        messages: OpenAI-style chat messages (``content`` a string or a list of text parts).
        sample: Which of several samples to draw (a request's ``n`` choices use 0..n-1); proposals differ
            between samples, the task model's correctness does not.
        seed: The simulated model's seed.

    Returns:
        ``(kind, content)`` with kind one of ``task``, ``opro``, ``copro``, ``mipro``, ``gepa``, ``judge``,
        ``unknown``.
    """
    messages = [m for m in (messages or []) if isinstance(m, dict)]
    prompt = parse_adapter_prompt(messages)
    if prompt is None:
        users = [message_text(m.get("content")) for m in messages if m.get("role") == "user"]
        text = users[-1] if users else "\n".join(message_text(m.get("content")) for m in messages)
        if is_opro_prompt(text):
            return "opro", opro_reply(text, sample=sample, seed=seed)
        if is_gepa_raw_prompt(text):
            return "gepa", gepa_raw_reply(text, sample=sample, seed=seed)
        return "unknown", "OK"

    # An OPRO meta-prompt handed over as an adapter input: answer the str outputs with the wrapped reply.
    for value in prompt.inputs.values():
        if is_opro_prompt(value):
            reply = opro_reply(value, sample=sample, seed=seed)
            known = {name: reply for name in prompt.outputs if prompt.types.get(name, "str") == "str"}
            return "opro", fill_outputs(prompt, known, sample)

    kind = _classify_adapter(prompt)
    if kind == "judge":
        return kind, judge_reply(prompt, sample)
    if kind in ("copro", "mipro", "gepa"):
        return kind, proposal_reply(prompt, kind, sample=sample, seed=seed)
    if kind == "task":
        return kind, task_reply(prompt, question_of(prompt) or "", sample=sample, seed=seed)
    return kind, fill_outputs(prompt, {}, sample)
