"""Reading and writing DSPy adapter prompts: what a ``ChatAdapter``/``JSONAdapter`` request asks, and a reply it parses.

The simulated model answers DSPy programs the way a real model would, so it must read the system message's
declared fields, the instruction after "your objective is:", the input sections of the last user message and the
requested output fields, and write the outputs back in the adapter's format (``[[ ## field ## ]]`` sections or a
JSON object). Outputs the caller does not supply get a plausible default of the declared type.
"""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import dataclass
from typing import Any

from dspy_opro.testing.hashing import stable_unit

__all__ = ["AdapterPrompt", "fill_outputs", "message_text", "parse_adapter_prompt"]


def message_text(content: Any) -> str:
    """The text of a message's ``content`` (a string, or a list of text parts joined by newlines)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    return str(content)


@dataclass
class AdapterPrompt:
    """What one adapter request asks: the instruction, the input values and the outputs wanted."""

    style: str  # "chat" | "json"
    instruction: str
    input_names: list[str]
    inputs: dict[str, str]
    outputs: list[str]
    types: dict[str, str]
    system: str


_FIELD_LINE = re.compile(r"^\d+\. `(\w+)` \((.*?)\)(?::|$)", re.MULTILINE)
_HEADER = re.compile(r"^\[\[ ## (\w+) ## \]\]\s*$", re.MULTILINE)


def _declared_fields(system: str, title: str, end: str) -> dict[str, str]:
    start = system.find(title)
    if start < 0:
        return {}
    stop = system.find(end, start + len(title))
    block = system[start + len(title) : stop if stop >= 0 else len(system)]
    return {match.group(1): match.group(2) for match in _FIELD_LINE.finditer(block)}


def _objective(system: str) -> str:
    marker = "your objective is:"
    at = system.find(marker)
    if at < 0:
        return ""
    lines = system[at + len(marker) :].split("\n")
    first, rest = lines[0].strip(), [line[8:] if line.startswith(" " * 8) else line.lstrip() for line in lines[1:]]
    return textwrap.dedent("\n".join(([first] if first else []) + rest)).strip()


def parse_adapter_prompt(messages: list[dict]) -> AdapterPrompt | None:
    """The adapter request in ``messages``, or None when they are not a DSPy adapter prompt."""
    system = "\n".join(message_text(m.get("content")) for m in messages if m.get("role") in ("system", "developer"))
    users = [message_text(m.get("content")) for m in messages if m.get("role") == "user"]
    last = users[-1] if users else ""
    if "Your output fields are:" not in system and "Respond with the corresponding output fields" not in last:
        if "Respond with a JSON object in the following order of fields" not in last:
            return None
    declared_inputs = _declared_fields(system, "Your input fields are:", "Your output fields are:")
    declared_outputs = _declared_fields(system, "Your output fields are:", "All interactions will be structured")

    style, outputs = None, []
    chat_at = last.rfind("Respond with the corresponding output fields")
    json_at = last.rfind("Respond with a JSON object in the following order of fields")
    if chat_at >= 0 and chat_at > json_at:
        style = "chat"
        tail = last[chat_at:]
        outputs = [name for name in re.findall(r"`\[\[ ## (\w+) ## \]\]`", tail) if name != "completed"]
        body = last[:chat_at]
    elif json_at >= 0:
        style = "json"
        tail = last[json_at:].split(":", 1)[1]
        outputs = re.findall(r"`(\w+)`", tail)
        body = last[:json_at]
    else:
        body = last
    if not outputs:
        outputs = list(declared_outputs)
    if style is None:
        style = "json" if "Outputs will be a JSON object" in system else "chat"

    # Input sections: only headers naming a declared input start a section, so nested headers (a ReAct
    # trajectory's thought_0, observation_0, ...) stay inside their field's value.
    names = set(declared_inputs)
    inputs: dict[str, str] = {}
    current: str | None = None
    buffer: list[str] = []
    for line in body.split("\n"):
        match = _HEADER.match(line.strip())
        if match and (not names or match.group(1) in names):
            if current is not None:
                inputs[current] = "\n".join(buffer).strip()
            current, buffer = match.group(1), []
        elif current is not None:
            buffer.append(line)
    if current is not None:
        inputs[current] = "\n".join(buffer).strip()
    types = {**declared_inputs, **declared_outputs}
    return AdapterPrompt(style, _objective(system), list(declared_inputs), inputs, outputs, types, system)


_SENTENCES = (
    "This follows directly from the information given.",
    "The details provided are enough to respond.",
    "Here is a short, direct response.",
    "The inputs point to a clear conclusion.",
)


def _sentence(sample: int, *parts: Any) -> str:
    return _SENTENCES[int(stable_unit("sentence", sample, *parts) * len(_SENTENCES))]


def _default_value(type_name: str, sample: int, name: str) -> Any:
    t = type_name.strip()
    if t.startswith("Literal["):
        options = re.findall(r"'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\"", t)
        values = [a or b for a, b in options]
        return values[0] if values else ""
    if t in ("int",):
        return 0
    if t in ("float",):
        return 0.0
    if t in ("bool",):
        return True
    if t.startswith(("list", "List", "tuple")):
        return []
    if t.startswith(("dict", "Dict")):
        return {}
    return _sentence(sample, name)


def _render(prompt: AdapterPrompt, values: dict[str, Any]) -> str:
    if prompt.style == "json":
        return json.dumps({name: values[name] for name in prompt.outputs}, ensure_ascii=False)
    parts = []
    for name in prompt.outputs:
        value = values[name]
        if isinstance(value, (dict, list)):
            value = json.dumps(value, ensure_ascii=False)
        parts.append(f"[[ ## {name} ## ]]\n{value}")
    parts.append("[[ ## completed ## ]]")
    return "\n\n".join(parts)


def fill_outputs(prompt: AdapterPrompt, known: dict[str, Any], sample: int) -> str:
    """The reply giving every requested output: ``known`` values, defaults of the declared type for the rest."""
    values = {}
    for name in prompt.outputs:
        values[name] = known[name] if name in known else _default_value(prompt.types.get(name, "str"), sample, name)
    return _render(prompt, values)
