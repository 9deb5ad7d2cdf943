"""The simulated model: classify a chat request and route it to a responder, the OPRO proposer, the judge or the task.

:func:`simulated_reply` reads an OpenAI-style message list and decides what it is being asked. Responders passed in
(:data:`Responder`: a callable that sees the request as a :class:`SimulatedRequest` and returns ``(kind, reply)``
to claim it, or None) are asked first, in order; this is how tests and benchmarks answer other optimizers'
prompts. Then the built-in routing:

* ``"opro"``: an OPRO meta-prompt (or an adapter prompt carrying one as an input), answered by
  :func:`dspy_opro.testing.proposer.opro_reply`;
* ``"judge"``: a DSPy adapter prompt with ``preference`` and ``rationale`` outputs, answered by
  :func:`dspy_opro.testing.task_model.judge_reply`;
* ``"task"``: a DSPy ``ChatAdapter``/``JSONAdapter`` prompt of a program over the simulated dataset, answered by
  :func:`dspy_opro.testing.task_model.task_reply`;
* ``"unknown"``: everything else (``"OK"``, or an adapter reply with a default value in every output).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dspy_opro.testing.adapter_prompts import AdapterPrompt, fill_outputs, message_text, parse_adapter_prompt
from dspy_opro.testing.proposer import is_opro_prompt, opro_reply
from dspy_opro.testing.task_model import judge_reply, question_of, task_reply

__all__ = ["Responder", "SimulatedRequest", "simulated_reply"]


@dataclass(frozen=True)
class SimulatedRequest:
    """One chat request as a responder sees it, read once for every responder and the built-in routing.

    Attributes:
        messages: The request's OpenAI-style messages (only the dict ones).
        prompt: The DSPy adapter prompt the messages hold, or None when they are not one.
        text: The last user message's text (every message's text when there is no user message).
        sample: Which of the request's samples is being drawn (its ``n`` choices use ``0..n-1``).
        seed: The simulated model's seed.
    """

    messages: list[dict]
    prompt: AdapterPrompt | None
    text: str
    sample: int
    seed: int


Responder = Callable[[SimulatedRequest], tuple[str, str] | None]
"""Claims a request by returning ``(kind, reply text)``, or leaves it to the next responder by returning None.

The kind is logged in ``RequestRecord.kind`` and matched by
``FaultConfig.only_kinds``. A responder must be deterministic in the
request (the endpoint may ask it again for later samples) and safe to call from several threads at once.
"""


def _text(messages: list[dict]) -> str:
    users = [message_text(m.get("content")) for m in messages if m.get("role") == "user"]
    return users[-1] if users else "\n".join(message_text(m.get("content")) for m in messages)


def _classify_adapter(prompt: AdapterPrompt) -> str:
    outputs = set(prompt.outputs)
    if "preference" in outputs and "rationale" in outputs:
        return "judge"
    if question_of(prompt) is not None:
        return "task"
    return "unknown"


def simulated_reply(
    messages: list[dict], *, sample: int = 0, seed: int = 0, responders: Sequence[Responder] = ()
) -> tuple[str, str]:
    """Classify a chat request and answer it deterministically.

    Args:
        messages: OpenAI-style chat messages (``content`` a string or a list of text parts).
        sample: Which of several samples to draw (a request's ``n`` choices use 0..n-1); proposals differ
            between samples, the task model's correctness does not.
        seed: The simulated model's seed.
        responders: Asked first, in order; the first that returns ``(kind, reply)`` answers the request.

    Returns:
        ``(kind, content)`` with kind a responder's, or one of ``opro``, ``judge``, ``task``, ``unknown``.
    """
    messages = [m for m in (messages or []) if isinstance(m, dict)]
    prompt = parse_adapter_prompt(messages)
    text = _text(messages)
    if responders:
        request = SimulatedRequest(messages, prompt, text, sample, seed)
        for responder in responders:
            claimed = responder(request)
            if claimed is not None:
                return claimed
    if prompt is None:
        if is_opro_prompt(text):
            return "opro", opro_reply(text, sample=sample, seed=seed)
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
    if kind == "task":
        return kind, task_reply(prompt, question_of(prompt) or "", sample=sample, seed=seed)
    return kind, fill_outputs(prompt, {}, sample)
