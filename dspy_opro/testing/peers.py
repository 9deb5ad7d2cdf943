"""Simulated optimizers' proposals: OPRO meta-prompts and the proposal prompts of COPRO, MIPROv2 and GEPA.

Every proposer is answered by :func:`propose_instruction`, which recombines the traits of the best-scored
instructions it is shown (see :data:`~dspy_opro.testing.task_model.TRAITS`). :func:`opro_reply` reads an OPRO
meta-prompt (any of the upstream wordings) and wraps the new instruction the way it asks (``<INS>``, ``<Start>``,
square brackets or ``<TEXT>``), sometimes with chatter around it; :func:`proposal_reply` answers DSPy's COPRO,
MIPROv2 (grounded proposer and its data/program summarizers) and GEPA (``ProposeInstruction``) signatures;
:func:`gepa_raw_reply` answers the ``gepa`` package's raw reflective prompt.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

from dspy_opro.testing.adapter_prompts import AdapterPrompt, fill_outputs
from dspy_opro.testing.hashing import stable_rng, stable_unit
from dspy_opro.testing.task_model import TRAITS, Trait, instruction_traits

__all__ = [
    "gepa_raw_reply",
    "is_gepa_raw_prompt",
    "is_opro_prompt",
    "opro_reply",
    "propose_instruction",
    "proposal_reply",
    "scored_pairs",
]


# --------------------------------------------------------------------------------------------------------------
# Recombining traits
# --------------------------------------------------------------------------------------------------------------

_OPENERS = ("Let's", "Let's", "Let us", "Please", "")


def _compose(traits: list[Trait], rng: random.Random) -> str:
    """A fluent one-sentence instruction expressing ``traits`` (no digits, ends with a period)."""
    ordered = [trait for trait in TRAITS if trait in traits]
    clauses = [rng.choice(trait.phrases) for trait in ordered]
    if not clauses:
        clauses = [rng.choice(("solve the problem", "work through the problem", "find the answer"))]
    if len(clauses) == 1:
        body = clauses[0]
    elif len(clauses) == 2:
        body = f"{clauses[0]} and {clauses[1]}"
    else:
        body = ", ".join(clauses[:-1]) + f", and {clauses[-1]}"
    opener = rng.choice(_OPENERS)
    sentence = f"{opener} {body}" if opener else body[0].upper() + body[1:]
    return sentence + "."


def propose_instruction(
    scored: list[tuple[str, float | None]], *, seed: int = 0, salt: str = "", sample: int = 0, improve: bool = False
) -> str:
    """Recombine the traits of the best of ``scored`` (instruction, score) pairs into a new instruction.

    Keeps the traits of the best instruction and, each with probability 1/2, those of the next two; drops one
    kept trait a quarter of the time; adds one new trait (helpful three times as likely as harmful). With
    ``improve=True`` (the COPRO/MIPROv2/GEPA proposers, shown one instruction) harmful traits are dropped and
    only a helpful trait is added. Deterministic in ``(seed, salt, sample)``.
    """
    rng = stable_rng("propose", seed, salt, sample)
    ranked = sorted(
        enumerate(scored), key=lambda item: (item[1][1] if item[1][1] is not None else float("-inf"), -item[0])
    )
    ranked = [pair for _, pair in reversed(ranked)]
    kept: list[Trait] = []
    for rank, (text, _) in enumerate(ranked[:3]):
        for trait in instruction_traits(text):
            if trait not in kept and (rank == 0 or rng.random() < 0.5):
                kept.append(trait)
    if improve:
        kept = [trait for trait in kept if trait.helpful]
    elif kept and rng.random() < 0.25:
        kept.remove(rng.choice(kept))
    candidates = [trait for trait in TRAITS if trait not in kept and (trait.helpful or not improve)]
    if candidates:
        weights = [3.0 if trait.helpful else 1.0 for trait in candidates]
        kept.append(rng.choices(candidates, weights=weights, k=1)[0])
    return _compose(kept, rng)


# --------------------------------------------------------------------------------------------------------------
# Finding scored instructions in proposal prompts
# --------------------------------------------------------------------------------------------------------------

_SCORE = r"(-?\d+(?:\.\d+)?(?:[eE]-?\d+)?)"


def scored_pairs(text: str) -> list[tuple[str, float | None]]:
    """The (instruction, score) pairs shown in an OPRO, COPRO or MIPROv2 prompt; score None when not shown."""
    pairs: list[tuple[str, float | None]] = []
    # OPRO (GPT and PaLM wording): "text:\n<instruction>\nscore:\n<score>"
    for match in re.finditer(r"(?:^|\n)text:\n(.*?)\nscore:\n" + _SCORE, text, flags=re.DOTALL):
        pairs.append((match.group(1).strip(), float(match.group(2))))
    # OPRO instructions_only: "Precision: <score> <TEXT><instruction></TEXT>"
    for match in re.finditer(r"Precision:\s*" + _SCORE + r"\s*<TEXT>(.*?)</TEXT>", text, flags=re.DOTALL):
        pairs.append((match.group(2).strip(), float(match.group(1))))
    # COPRO: "Instruction #i: ...", "Resulting Score #i: ..."
    instructions = dict(re.findall(r"Instruction #(\d+): (.*?)(?=\s*»|\n|$)", text))
    scores = dict(re.findall(r"Resulting Score #(\d+): " + _SCORE, text))
    for key, instruction in instructions.items():
        pairs.append((instruction.strip(), float(scores[key]) if key in scores else None))
    # MIPROv2: "<instruction> | Score: <score>"
    for match in re.finditer(r"(?:^|\n\n)([^\n]+?) \| Score: " + _SCORE, text):
        pairs.append((match.group(1).strip(), float(match.group(2))))
    return [(instruction, score) for instruction, score in pairs if instruction]


# --------------------------------------------------------------------------------------------------------------
# Replies
# --------------------------------------------------------------------------------------------------------------

_OPRO_MARKERS = (
    "Your task is to generate the instruction <INS>",
    "Your task is to generate the answer starting sentence <Start>",
    "I have some texts along with their corresponding scores",
    "Create a piece of text",
)
_GEPA_RAW_MARKERS = ("I provided an assistant with the following instructions", "within ``` blocks")
_CHATTER = (
    ("Here is a new instruction that should score higher:\n", "\nIt combines the strongest elements above."),
    ("Sure! ", " I expect this one to do better than the previous ones."),
    ("After reviewing the scores, I propose:\n", ""),
    ("", "\nThis keeps what worked and adds one more idea."),
)


def is_opro_prompt(text: str) -> bool:
    """Whether ``text`` is an OPRO meta-prompt (any of the upstream wordings)."""
    return any(marker in text for marker in _OPRO_MARKERS)


def opro_reply(prompt: str, *, sample: int, seed: int) -> str:
    """A new instruction for an OPRO meta-prompt, wrapped as the prompt asks."""
    pairs = scored_pairs(prompt)
    instruction = propose_instruction(pairs, seed=seed, salt=prompt, sample=sample)
    if "<Start>" in prompt and "</Start>" in prompt:
        wrapped = f"<Start>{instruction}</Start>"
    elif "Write the text in square brackets" in prompt:
        wrapped = f"[{instruction}]"
    elif "<INS>" in prompt:
        wrapped = f"<INS>{instruction}</INS>"
    elif "<TEXT>" in prompt:
        wrapped = f"<TEXT>{instruction}</TEXT>"
    else:
        wrapped = instruction
    if int(stable_unit("chatter", seed, prompt, sample) * 8) == 0:
        before, after = _CHATTER[int(stable_unit("chatter-kind", seed, prompt, sample) * len(_CHATTER))]
        wrapped = f"{before}{wrapped}{after}"
    return wrapped


def proposal_reply(prompt: AdapterPrompt, kind: str, *, sample: int, seed: int) -> str:
    """The answer to a COPRO, MIPROv2 or GEPA proposal signature: an improved instruction in every output."""
    inputs = prompt.inputs
    pairs: list[tuple[str, float | None]] = []
    for value in inputs.values():
        pairs.extend(scored_pairs(value))
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
    pairs = [(current.group(1).strip(), None)] if current else []
    instruction = propose_instruction(pairs, seed=seed, salt=text, sample=sample, improve=True)
    return f"```\n{instruction}\n```"
