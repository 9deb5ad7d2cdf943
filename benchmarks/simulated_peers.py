"""Simulated proposers of DSPy's COPRO, MIPROv2 and GEPA, as responders for the simulated endpoint.

The simulated endpoint (:class:`dspy_opro.testing.SimulatedEndpoint`) answers OPRO's meta-prompts itself; the
proposal prompts of the peer optimizers are answered here, plugged in through its one hook::

    from benchmarks.simulated_peers import PEERS

    with SimulatedEndpoint(responders=PEERS) as endpoint:
        ...  # dspy.COPRO / dspy.MIPROv2 / dspy.GEPA against endpoint.lm()

:func:`answer_peer` claims a request as ``"copro"``, ``"mipro"`` or ``"gepa"``: DSPy's COPRO signatures (their
``proposed_prefix_for_output_field`` output), MIPROv2's grounded proposer and its data and program summarizers,
GEPA's ``ProposeInstruction`` signature, and the ``gepa`` package's raw reflective prompt. Every proposal is the
simulated optimizer model's (:func:`dspy_opro.testing.proposer.propose_instruction`, asked to improve the
instructions shown), so a peer and OPRO propose from the same instruction landscape. Requests that hold an OPRO
meta-prompt, and judge prompts, are left to the endpoint.

Used by ``tests/test_server.py``, ``tests/test_compare.py``, ``benchmarks/compare_optimizers.py`` and
``benchmarks/overhead.py``; it lives here, not in the library, because only tests and benchmarks run the peers.
"""

from __future__ import annotations

import json
import re
from typing import Any

from dspy_opro.testing import SimulatedRequest
from dspy_opro.testing.adapter_prompts import AdapterPrompt, fill_outputs
from dspy_opro.testing.proposer import is_opro_prompt, propose_instruction, scored_pairs

__all__ = [
    "PEERS",
    "answer_peer",
    "gepa_raw_reply",
    "is_gepa_raw_prompt",
    "peer_kind",
    "peer_scored_pairs",
    "proposal_reply",
]

# MIPROv2's proposer signatures: (output field, an input field it always comes with); None: no input needed.
_MIPRO_FIELDS = (
    ("proposed_instruction", None),
    ("observations", "examples"),
    ("summary", "observations"),
    ("program_description", "program_code"),
    ("module_description", "program_code"),
)
_GEPA_RAW_MARKERS = ("I provided an assistant with the following instructions", "within ``` blocks")
_SCORE = r"(-?\d+(?:\.\d+)?(?:[eE]-?\d+)?)"


def peer_kind(prompt: AdapterPrompt) -> str | None:
    """``"copro"``, ``"mipro"`` or ``"gepa"`` when ``prompt`` is one of that optimizer's proposal signatures."""
    outputs = set(prompt.outputs)
    if "proposed_prefix_for_output_field" in outputs:
        return "copro"
    inputs = set(prompt.input_names) | set(prompt.inputs)
    if any(output in outputs and (needs is None or needs in inputs) for output, needs in _MIPRO_FIELDS):
        return "mipro"
    if outputs & {"new_instruction", "shortened_instruction"}:
        return "gepa"
    return None


def peer_scored_pairs(text: str) -> list[tuple[str, float | None]]:
    """The (instruction, score) pairs shown in an OPRO, COPRO or MIPROv2 prompt; score None when not shown."""
    pairs = scored_pairs(text)
    # COPRO: "Instruction #i: ...", "Resulting Score #i: ..."
    instructions = dict(re.findall(r"Instruction #(\d+): (.*?)(?=\s*»|\n|$)", text))
    scores = dict(re.findall(r"Resulting Score #(\d+): " + _SCORE, text))
    for key, instruction in instructions.items():
        pairs.append((instruction.strip(), float(scores[key]) if key in scores else None))
    # MIPROv2: "<instruction> | Score: <score>"
    for match in re.finditer(r"(?:^|\n\n)([^\n]+?) \| Score: " + _SCORE, text):
        pairs.append((match.group(1).strip(), float(match.group(2))))
    return [(instruction, score) for instruction, score in pairs if instruction]


def proposal_reply(prompt: AdapterPrompt, *, sample: int, seed: int) -> str:
    """The answer to a COPRO, MIPROv2 or GEPA proposal signature: an improved instruction in every output."""
    inputs = prompt.inputs
    pairs: list[tuple[str, float | None]] = []
    for value in inputs.values():
        pairs.extend(peer_scored_pairs(value))
    for key in ("current_instruction", "basic_instruction", "instruction"):
        if inputs.get(key):
            pairs.append((inputs[key], None))
    salt = json.dumps(inputs, sort_keys=True)
    instruction = propose_instruction(pairs, seed=seed, salt=salt, sample=sample, improve=True)
    known: dict[str, Any] = {}
    for name in ("proposed_instruction", "new_instruction"):
        known[name] = instruction
    if "shortened_instruction" in prompt.outputs:
        known["shortened_instruction"] = inputs.get("instruction", instruction)[:200]
    known["proposed_prefix_for_output_field"] = "Answer:"
    if "prior_observations" in inputs:
        known["observations"] = "COMPLETE"  # MIPROv2's summarizer stops asking after a few of these
    return fill_outputs(prompt, known, sample)


def is_gepa_raw_prompt(text: str) -> bool:
    """Whether ``text`` is the ``gepa`` package's raw reflective prompt."""
    return all(marker in text for marker in _GEPA_RAW_MARKERS)


def gepa_raw_reply(text: str, *, sample: int, seed: int) -> str:
    """The new instruction in a fenced block, improving the current one found in ``text``'s first fence."""
    current = re.search(r"```\n?(.*?)\n?```", text, flags=re.DOTALL)
    pairs: list[tuple[str, float | None]] = [(current.group(1).strip(), None)] if current else []
    instruction = propose_instruction(pairs, seed=seed, salt=text, sample=sample, improve=True)
    return f"```\n{instruction}\n```"


def answer_peer(request: SimulatedRequest) -> tuple[str, str] | None:
    """Claim a COPRO, MIPROv2 or GEPA proposal request as ``(kind, reply)``; None for anything else.

    A :data:`dspy_opro.testing.Responder`: the endpoint asks it before its own routing, so it leaves alone what
    that routing answers first (OPRO meta-prompts, plain or as an adapter input, and judge prompts).
    """
    prompt = request.prompt
    if prompt is None:
        text = request.text
        if not is_opro_prompt(text) and is_gepa_raw_prompt(text):
            return "gepa", gepa_raw_reply(text, sample=request.sample, seed=request.seed)
        return None
    if any(is_opro_prompt(value) for value in prompt.inputs.values()):
        return None
    if {"preference", "rationale"} <= set(prompt.outputs):
        return None
    kind = peer_kind(prompt)
    if kind is None:
        return None
    return kind, proposal_reply(prompt, sample=request.sample, seed=request.seed)


PEERS = (answer_peer,)
"""The responders to pass as ``SimulatedEndpoint(responders=PEERS)``."""
