"""The simulated optimizer model: a new instruction recombined from scored ones, and the reply to an OPRO meta-prompt.

:func:`propose_instruction` recombines the traits (:data:`~dspy_opro.testing.task_model.TRAITS`) of the
best-scored instructions it is shown into a new one. :func:`opro_reply` reads an OPRO meta-prompt (any of the
upstream wordings, recognised by :func:`is_opro_prompt`), finds its scored instructions (:func:`scored_pairs`) and
wraps the new instruction the way the prompt asks (``<INS>``, ``<Start>``, square brackets or ``<TEXT>``),
sometimes with chatter around it. The endpoint is the optimizer model of every offline OPRO run, so answering OPRO
stays here; other optimizers' proposal prompts are answered by responders plugged into the endpoint (see
:class:`~dspy_opro.testing.simulated.SimulatedRequest`).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from dspy_opro.testing.hashing import stable_rng, stable_unit
from dspy_opro.testing.task_model import TRAITS, Trait, instruction_traits

__all__ = ["is_opro_prompt", "opro_reply", "propose_instruction", "scored_pairs", "unclosed_reply"]


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
    scored: Sequence[tuple[str, float | None]],
    *,
    seed: int = 0,
    salt: str = "",
    sample: int = 0,
    improve: bool = False,
) -> str:
    """Recombine the traits of the best of ``scored`` (instruction, score) pairs into a new instruction.

    Keeps the traits of the best instruction and, each with probability 1/2, those of the next two; drops one
    kept trait a quarter of the time; adds one new trait (helpful three times as likely as harmful).

    Args:
        scored: The instructions shown to the proposer with their scores (None: not shown); the best comes first
            after ranking by score, ties and unscored ones in the order given.
        seed: The simulated model's seed.
        salt: What the proposal is about (the prompt's text), so that different prompts get different proposals.
        sample: Which of several samples to draw.
        improve: Asked to improve the instructions shown rather than to explore (a proposer shown one
            instruction): harmful traits are dropped and only a helpful trait is added.

    Returns:
        One sentence with no digits, ending in a period; deterministic in ``(seed, salt, sample)``.
    """
    rng = stable_rng("propose", seed, salt, sample)
    by_score = sorted(
        enumerate(scored), key=lambda item: (item[1][1] if item[1][1] is not None else float("-inf"), -item[0])
    )
    ranked = [pair for _, pair in reversed(by_score)]
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
# Finding scored instructions in OPRO meta-prompts
# --------------------------------------------------------------------------------------------------------------

_SCORE = r"(-?\d+(?:\.\d+)?(?:[eE]-?\d+)?)"


def scored_pairs(text: str) -> list[tuple[str, float | None]]:
    """The (instruction, score) pairs an OPRO meta-prompt shows (any of the upstream wordings)."""
    pairs: list[tuple[str, float | None]] = []
    # GPT and PaLM wording: "text:\n<instruction>\nscore:\n<score>"
    for match in re.finditer(r"(?:^|\n)text:\n(.*?)\nscore:\n" + _SCORE, text, flags=re.DOTALL):
        pairs.append((match.group(1).strip(), float(match.group(2))))
    # instructions_only: "Precision: <score> <TEXT><instruction></TEXT>"
    for match in re.finditer(r"Precision:\s*" + _SCORE + r"\s*<TEXT>(.*?)</TEXT>", text, flags=re.DOTALL):
        pairs.append((match.group(2).strip(), float(match.group(1))))
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


# What a very small model writes on after the instruction when it never closes the tag (seen from a 135M model).
_MUSINGS = (
    "\nThis instruction should work better because it asks the model to look at every step of the problem, and "
    "the score of the previous instructions shows that the model needs more guidance.",
    "\n\nExplanation: the new instruction keeps the best parts of the old ones. It is clear and short, and a "
    "student could follow it without any help. The score should go up.",
    "\nI think this is a good instruction for the problem. The problem asks for a number, so the instruction should "
    "help the model find the number. Let me explain why this works. First, it is simple.",
)
_CLOSING_TAGS = ("</Start>", "</INS>", "</TEXT>")


def unclosed_reply(reply: str, *, sample: int, seed: int) -> str:
    """``reply`` as a very small model writes it: the closing tag never comes and the text runs on.

    The reply is cut at its closing tag (``</INS>``, ``</Start>``, ``</TEXT>`` or the first ``]`` after a ``[``),
    the tag left out, and a deterministic ramble appended, so the authors' extraction takes everything after the
    opening tag.
    """
    cut = len(reply)
    for tag in _CLOSING_TAGS:
        position = reply.find(tag)
        if position >= 0:
            cut = min(cut, position)
    opening = reply.find("[")
    if cut == len(reply) and opening >= 0 and reply.find("]", opening) >= 0:
        cut = reply.find("]", opening)
    musing = _MUSINGS[int(stable_unit("musing", seed, reply, sample) * len(_MUSINGS))]
    return reply[:cut] + musing
