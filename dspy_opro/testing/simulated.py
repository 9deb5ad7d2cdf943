"""A deterministic simulated language model, dataset and metric for offline tests and benchmarks.

:func:`simulated_reply` reads an OpenAI-style message list and decides what it is being asked:

* ``"task"``: a DSPy ``ChatAdapter``/``JSONAdapter`` prompt of a program over :func:`simulated_dataset`
  (``Predict``, ``ChainOfThought``, ``ReAct`` and its extract step). It answers every requested output field
  in the format the adapter parses. Whether the answer is right is a fixed function of the predictor's
  instruction: right iff ``u < instruction_quality(instruction)``, with ``u`` a stable hash of
  ``(seed, instruction, question)`` in ``[0, 1)``.
* ``"opro"``: an OPRO meta-prompt (any of the upstream wordings). The reply recombines the traits of the
  best-scored instructions shown and is wrapped the way the meta-prompt asks (``<INS>``, ``<Start>``,
  square brackets or ``<TEXT>``).
* ``"copro"`` / ``"mipro"`` / ``"gepa"``: the proposal prompts of DSPy's COPRO, MIPROv2 (grounded proposer
  and its data/program summarizers) and GEPA (DSPy's ``ProposeInstruction`` signature and the ``gepa``
  package's raw reflective prompt).
* ``"judge"``: a signature with ``preference`` and ``rationale`` outputs.
* ``"unknown"``: everything else.

The instruction landscape is :data:`TRAITS` plus :func:`instruction_quality`. Nothing here talks to a
network or imports the rest of ``dspy_opro``; ``dspy`` is imported lazily and only by
:func:`simulated_dataset` and :func:`simulated_metric_with_feedback`.
"""

from __future__ import annotations

import ast
import hashlib
import json
import operator
import random
import re
import textwrap
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BASE_QUALITY",
    "TRAITS",
    "Trait",
    "answers_correctly",
    "arithmetic_tool",
    "instruction_quality",
    "instruction_traits",
    "propose_instruction",
    "simulated_dataset",
    "simulated_metric",
    "simulated_metric_with_feedback",
    "simulated_reply",
    "solve_question",
]

# --------------------------------------------------------------------------------------------------------------
# Hashing helpers
# --------------------------------------------------------------------------------------------------------------


def _digest(*parts: Any) -> bytes:
    text = "\x1f".join(str(part) for part in parts)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def _unit(*parts: Any) -> float:
    """A stable float in [0, 1) derived from ``parts``."""
    return int.from_bytes(_digest(*parts)[:8], "big") / 2**64


def _rng(*parts: Any) -> random.Random:
    return random.Random(int.from_bytes(_digest(*parts)[:8], "big"))


# --------------------------------------------------------------------------------------------------------------
# The instruction landscape
# --------------------------------------------------------------------------------------------------------------

BASE_QUALITY = 0.30
_MIN_QUALITY, _MAX_QUALITY = 0.05, 0.95
_LENGTH_FREE_CHARS = 300
_LENGTH_PENALTY_PER_CHAR = 0.0005  # 0.05 per 100 characters over 300 ...
_LENGTH_PENALTY_MAX = 0.20  # ... capped


@dataclass(frozen=True)
class Trait:
    """One feature of an instruction that moves the simulated task accuracy.

    Attributes:
        name: A short identifier.
        weight: Added to the base quality when ``pattern`` matches (negative for harmful traits).
        pattern: A case-insensitive regular expression.
        phrases: Clauses the simulated optimizer writes after "Let's" to express the trait.
    """

    name: str
    weight: float
    pattern: str
    phrases: tuple[str, ...]

    @property
    def helpful(self) -> bool:
        return self.weight > 0

    def matches(self, text: str) -> bool:
        return re.search(self.pattern, text, flags=re.IGNORECASE) is not None


TRAITS: tuple[Trait, ...] = (
    Trait(
        "step_by_step",
        0.20,
        r"\bstep[-\s]+by[-\s]+step\b",
        ("work step by step", "think step by step", "solve the problem step by step", "go step-by-step"),
    ),
    Trait(
        "carefully",
        0.10,
        r"\bcareful(?:ly)?\b",
        ("read the problem carefully", "proceed carefully", "compute carefully"),
    ),
    Trait(
        "verify",
        0.10,
        r"\b(?:check\w*|verif\w*)",
        ("verify the result", "double-check the answer", "check each calculation"),
    ),
    Trait("show_work", 0.08, r"\bshow\s+(?:your|the|all)\s+work\b", ("show the work", "show all work")),
    Trait("units", 0.04, r"\bunits\b", ("keep track of the units", "keep the units consistent")),
    Trait("guess", -0.25, r"\bguess\w*", ("make a guess", "guess the answer")),
    Trait("quickly", -0.10, r"\b(?:quickly|fast)\b", ("answer quickly", "be fast")),
    Trait("briefly", -0.08, r"\b(?:briefly|one\s+word)\b", ("answer briefly", "reply in one word")),
)


def instruction_traits(instruction: str) -> list[Trait]:
    """The traits an instruction expresses, in :data:`TRAITS` order."""
    return [trait for trait in TRAITS if trait.matches(instruction or "")]


def instruction_quality(instruction: str) -> float:
    """The simulated task model's probability of answering correctly under ``instruction``.

    ``0.30`` plus the weights of the matched :data:`TRAITS`, minus ``0.05`` per 100 characters beyond 300
    (at most ``0.20``), clipped to ``[0.05, 0.95]``.
    """
    instruction = (instruction or "").strip()
    p = BASE_QUALITY + sum(trait.weight for trait in instruction_traits(instruction))
    if len(instruction) > _LENGTH_FREE_CHARS:
        p -= min(_LENGTH_PENALTY_MAX, (len(instruction) - _LENGTH_FREE_CHARS) * _LENGTH_PENALTY_PER_CHAR)
    return round(min(_MAX_QUALITY, max(_MIN_QUALITY, p)), 6)


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
    rng = _rng("propose", seed, salt, sample)
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
# The dataset
# --------------------------------------------------------------------------------------------------------------

_NAMES = ("Ava", "Ben", "Chloe", "Diego", "Emma", "Farid", "Grace", "Hiro", "Iris", "Jonas", "Kira", "Liam")
_ITEMS = ("pens", "apples", "stickers", "cookies", "marbles", "books", "cards", "pencils", "shells", "buttons")


@dataclass(frozen=True)
class _Template:
    name: str
    text: str
    expression: str  # over the placeholders a, b, c

    def regex(self) -> re.Pattern:
        pattern, seen, pos = "", set(), 0
        for match in re.finditer(r"\{(\w+)\}", self.text):
            pattern += re.escape(self.text[pos : match.start()])
            key = match.group(1)
            if key in seen:
                pattern += f"(?P={key})"
            else:
                seen.add(key)
                group = {"name": r"[A-Z][a-z]+", "item": r"[a-z]+"}.get(key, r"\d+")
                pattern += f"(?P<{key}>{group})"
            pos = match.end()
        return re.compile(pattern + re.escape(self.text[pos:]))


_TEMPLATES: tuple[_Template, ...] = (
    _Template(
        "shop",
        "A shop has {a} boxes with {b} {item} each. It sells {c} {item}. How many {item} are left?",
        "{a} * {b} - {c}",
    ),
    _Template(
        "packs",
        "{name} has {a} {item}. {name} buys {b} packs with {c} {item} in each pack. "
        "How many {item} does {name} have now?",
        "{a} + {b} * {c}",
    ),
    _Template(
        "share",
        "{name} shares {a} {item} equally among {b} friends and keeps none. How many {item} does each friend get?",
        "{a} / {b}",
    ),
    _Template(
        "found",
        "{name} had {a} {item}, gave away {b}, and then found {c} more. How many {item} does {name} have now?",
        "{a} - {b} + {c}",
    ),
    _Template(
        "wage",
        "{name} earns {a} dollars per day for {b} days and spends {c} dollars. How many dollars does {name} save?",
        "{a} * {b} - {c}",
    ),
    _Template(
        "class",
        "A classroom has {a} students. Each student needs {b} {item}, and the teacher already has {c} {item}. "
        "How many more {item} are needed?",
        "{a} * {b} - {c}",
    ),
    _Template(
        "garden",
        "A garden has {a} rows with {b} plants in each row. Then {c} more rows of {b} plants are added. "
        "How many plants are there in total?",
        "({a} + {c}) * {b}",
    ),
    _Template(
        "bus",
        "A bus carries {a} passengers. At the first stop {b} passengers get off and {c} get on. "
        "How many passengers are on the bus now?",
        "{a} - {b} + {c}",
    ),
)
_TEMPLATE_REGEXES = tuple((template, template.regex()) for template in _TEMPLATES)


def _numbers_for(template: _Template, rng: random.Random) -> dict[str, int]:
    a, b = rng.randint(3, 25), rng.randint(2, 12)
    if template.name == "share":
        return {"a": b * rng.randint(2, 15), "b": b, "c": 0}
    if template.name in ("shop", "wage", "class"):
        return {"a": a, "b": b, "c": rng.randint(1, a * b - 1)}
    if template.name in ("found", "bus"):
        a = rng.randint(12, 60)
        return {"a": a, "b": rng.randint(1, a - 1), "c": rng.randint(1, 30)}
    return {"a": a, "b": b, "c": rng.randint(2, 12)}


def solve_question(question: str) -> tuple[int, str] | None:
    """``(answer, arithmetic expression)`` for a simulated word problem found in ``question``, else None."""
    for template, regex in _TEMPLATE_REGEXES:
        match = regex.search(question or "")
        if match:
            values = {key: int(val) for key, val in match.groupdict().items() if key in ("a", "b", "c")}
            expression = template.expression.format(**values)
            return int(_evaluate(expression)), expression
    return None


def simulated_dataset(n: int = 40, *, seed: int = 0) -> list:
    """``n`` arithmetic word problems as ``dspy.Example(question=..., answer="<int>").with_inputs("question")``.

    Deterministic for a seed; the questions are distinct and cycle through eight templates in a shuffled order.
    """
    import dspy

    rng = random.Random(f"simulated-dataset:{seed}")
    examples, seen = [], set()
    attempts = 0
    while len(examples) < n:
        attempts += 1
        if attempts > 100 * (n + 10):
            raise RuntimeError("could not generate enough distinct questions")
        template = _TEMPLATES[rng.randrange(len(_TEMPLATES))]
        values = _numbers_for(template, rng)
        name = rng.choice(_NAMES)
        question = template.text.format(name=name, item=rng.choice(_ITEMS), **values)
        if question in seen:
            continue
        seen.add(question)
        answer = int(_evaluate(template.expression.format(**values)))
        examples.append(dspy.Example(question=question, answer=str(answer)).with_inputs("question"))
    return examples


_INT = re.compile(r"-?\d+")


def _first_int(value: Any) -> int | None:
    match = _INT.search(str(value if value is not None else "").replace(",", ""))
    return int(match.group(0)) if match else None


def simulated_metric(example, prediction, trace=None) -> float:
    """1.0 when the first integer in ``prediction.answer`` equals ``example.answer``, else 0.0."""
    got = _first_int(getattr(prediction, "answer", None))
    want = _first_int(example.answer)
    return 1.0 if got is not None and got == want else 0.0


def simulated_metric_with_feedback(gold, pred, trace=None, pred_name=None, pred_trace=None):
    """:func:`simulated_metric` in the shape ``dspy.GEPA`` takes: ``dspy.Prediction(score=..., feedback=...)``."""
    import dspy

    score = simulated_metric(gold, pred, trace)
    if score:
        feedback = f"Correct: the answer is {gold.answer}."
    else:
        feedback = f"Wrong: expected {gold.answer}, got {getattr(pred, 'answer', None)!r}. Work step by step."
    return dspy.Prediction(score=score, feedback=feedback)


# --------------------------------------------------------------------------------------------------------------
# The arithmetic tool
# --------------------------------------------------------------------------------------------------------------

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _evaluate(expression: str) -> int | float:
    if len(expression) > 200:
        raise ValueError("expression too long")
    tree = ast.parse(expression.strip(), mode="eval")

    def walk(node: ast.AST) -> int | float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise ValueError("division by zero")
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](walk(node.operand))
        raise ValueError(f"unsupported syntax: {type(node).__name__}")

    value = walk(tree)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def arithmetic_tool(expression: str) -> str:
    """Evaluate an arithmetic expression of numbers with + - * / and parentheses, e.g. "(3 + 4) * 2"."""
    try:
        return str(_evaluate(expression))
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from exc


# --------------------------------------------------------------------------------------------------------------
# Reading DSPy adapter prompts
# --------------------------------------------------------------------------------------------------------------


def _text(content: Any) -> str:
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
class _AdapterPrompt:
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


def _parse_adapter_prompt(messages: list[dict]) -> _AdapterPrompt | None:
    system = "\n".join(_text(m.get("content")) for m in messages if m.get("role") in ("system", "developer"))
    users = [_text(m.get("content")) for m in messages if m.get("role") == "user"]
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
    current, buffer = None, []
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
    return _AdapterPrompt(style, _objective(system), list(declared_inputs), inputs, outputs, types, system)


# --------------------------------------------------------------------------------------------------------------
# Writing replies
# --------------------------------------------------------------------------------------------------------------

_SENTENCES = (
    "This follows directly from the information given.",
    "The details provided are enough to respond.",
    "Here is a short, direct response.",
    "The inputs point to a clear conclusion.",
)


def _sentence(sample: int, *parts: Any) -> str:
    return _SENTENCES[int(_unit("sentence", sample, *parts) * len(_SENTENCES))]


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


def _render(prompt: _AdapterPrompt, values: dict[str, Any]) -> str:
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


def _fill(prompt: _AdapterPrompt, known: dict[str, Any], sample: int) -> str:
    values = {}
    for name in prompt.outputs:
        values[name] = known[name] if name in known else _default_value(prompt.types.get(name, "str"), sample, name)
    return _render(prompt, values)


# --------------------------------------------------------------------------------------------------------------
# Finding scored instructions in proposal prompts
# --------------------------------------------------------------------------------------------------------------

_SCORE = r"(-?\d+(?:\.\d+)?(?:[eE]-?\d+)?)"


def _scored_pairs(text: str) -> list[tuple[str, float | None]]:
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
# The simulated model
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


def _is_opro(text: str) -> bool:
    return any(marker in text for marker in _OPRO_MARKERS)


def _opro_reply(prompt: str, *, sample: int, seed: int) -> str:
    pairs = _scored_pairs(prompt)
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
    if int(_unit("chatter", seed, prompt, sample) * 8) == 0:
        before, after = _CHATTER[int(_unit("chatter-kind", seed, prompt, sample) * len(_CHATTER))]
        wrapped = f"{before}{wrapped}{after}"
    return wrapped


def answers_correctly(instruction: str, question: str, *, seed: int = 0) -> bool:
    """Whether the simulated task model answers ``question`` correctly under ``instruction`` (and ``seed``)."""
    return _unit("task", seed, instruction, question) < instruction_quality(instruction)


def _answer_for(instruction: str, question: str, *, seed: int) -> tuple[int, str] | None:
    solved = solve_question(question)
    if solved is None:
        return None
    truth, expression = solved
    if answers_correctly(instruction, question, seed=seed):
        return truth, expression
    offset = 1 + int(_unit("offset", seed, instruction, question) * 5)
    sign = 1 if _unit("sign", seed, instruction, question) < 0.5 else -1
    return truth + sign * offset, expression


def _question_of(prompt: _AdapterPrompt) -> str | None:
    if "question" in prompt.inputs and solve_question(prompt.inputs["question"]):
        return prompt.inputs["question"]
    for name, value in prompt.inputs.items():
        if name != "trajectory" and solve_question(value):
            return value
    return None


_TOOL_LINE = re.compile(r"^\((\d+)\) (\w+)(.*)$", re.MULTILINE)


def _react_step(prompt: _AdapterPrompt, question: str, sample: int) -> dict[str, Any]:
    trajectory = prompt.inputs.get("trajectory", "")
    observed = re.search(r"\[\[ ## observation_\d+ ## \]\]", trajectory) is not None
    tools = [(match.group(2), match.group(3)) for match in _TOOL_LINE.finditer(prompt.instruction)]
    offered = [(name, rest) for name, rest in tools if name != "finish"]
    solved = solve_question(question)
    if not observed and offered and solved is not None:
        name, rest = offered[0]
        if "expression" in rest:
            return {
                "next_thought": f"I should compute {solved[1]} with the {name} tool.",
                "next_tool_name": name,
                "next_tool_args": {"expression": solved[1]},
            }
    thought = "I have what I need to answer." if observed else "I can answer directly."
    return {"next_thought": thought, "next_tool_name": "finish", "next_tool_args": {}}


def _task_reply(prompt: _AdapterPrompt, question: str, *, sample: int, seed: int) -> str:
    known: dict[str, Any] = {}
    if "next_tool_name" in prompt.outputs or "next_tool_args" in prompt.outputs:
        known.update(_react_step(prompt, question, sample))
    result = _answer_for(prompt.instruction, question, seed=seed)
    if result is not None:
        value, expression = result
        for name in prompt.outputs:
            if name == "answer":
                known["answer"] = value if prompt.types.get("answer", "str") in ("int", "float") else str(value)
            elif name not in known and prompt.types.get(name, "str") == "str":
                known[name] = f"I compute {expression}, which gives {value}."
    return _fill(prompt, known, sample)


def _find_instruction(text: str) -> str | None:
    patterns = (
        r"your objective is:\s*(.+?)(?:\n\s*\n|$)",
        r'"instructions?"\s*:\s*"((?:[^"\\]|\\.)*)"',
        r"(?im)^\s*(?:instructions?|system prompt)\s*[:=]\s*(.+)$",
    )
    for pattern in patterns:
        match = re.search(pattern, text or "", flags=re.IGNORECASE | re.DOTALL)
        if match and match.group(1).strip():
            found = match.group(1).strip()
            if pattern.startswith('"'):
                try:
                    found = json.loads(f'"{found}"')
                except ValueError:
                    pass
            return found
    return None


def _judge_reply(prompt: _AdapterPrompt, sample: int) -> str:
    inputs = prompt.inputs
    anchor_key = next((k for k in inputs if "anchor" in k), "trajectory_a")
    candidate_key = next((k for k in inputs if "candidate" in k), "trajectory_b")
    anchor, candidate = _find_instruction(inputs.get(anchor_key, "")), _find_instruction(inputs.get(candidate_key, ""))
    if anchor is not None and candidate is not None:
        preference = round((instruction_quality(candidate) - instruction_quality(anchor)) * 20)
        preference = max(-10, min(10, preference))
        rationale = (
            "Trajectory B follows the better instruction."
            if preference > 0
            else "Trajectory A follows the better instruction."
            if preference < 0
            else "Both trajectories are equally good."
        )
    else:
        preference, rationale = 0, "I cannot tell the two trajectories apart."
    known = {"preference": preference, "rationale": rationale}
    if prompt.types.get("preference") == "str":
        known["preference"] = str(preference)
    return _fill(prompt, known, sample)


def _proposal(prompt: _AdapterPrompt, kind: str, *, sample: int, seed: int) -> str:
    inputs = prompt.inputs
    pairs: list[tuple[str, float | None]] = []
    for value in inputs.values():
        pairs.extend(_scored_pairs(value))
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
    return _fill(prompt, known, sample)


# MIPROv2's proposer signatures: (output field, an input field it always comes with); None: no input needed.
_MIPRO_FIELDS = (
    ("proposed_instruction", None),
    ("observations", "examples"),
    ("summary", "observations"),
    ("program_description", "program_code"),
    ("module_description", "program_code"),
)


def _classify_adapter(prompt: _AdapterPrompt) -> str:
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
    if _question_of(prompt) is not None:
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
    prompt = _parse_adapter_prompt(messages)
    if prompt is None:
        users = [_text(m.get("content")) for m in messages if m.get("role") == "user"]
        text = users[-1] if users else "\n".join(_text(m.get("content")) for m in messages)
        if _is_opro(text):
            return "opro", _opro_reply(text, sample=sample, seed=seed)
        if all(marker in text for marker in _GEPA_RAW_MARKERS):
            current = re.search(r"```\n?(.*?)\n?```", text, flags=re.DOTALL)
            pairs = [(current.group(1).strip(), None)] if current else []
            instruction = propose_instruction(pairs, seed=seed, salt=text, sample=sample, improve=True)
            return "gepa", f"```\n{instruction}\n```"
        return "unknown", "OK"

    # An OPRO meta-prompt handed over as an adapter input: answer the str outputs with the wrapped reply.
    for value in prompt.inputs.values():
        if _is_opro(value):
            reply = _opro_reply(value, sample=sample, seed=seed)
            known = {name: reply for name in prompt.outputs if prompt.types.get(name, "str") == "str"}
            return "opro", _fill(prompt, known, sample)

    kind = _classify_adapter(prompt)
    if kind == "judge":
        return kind, _judge_reply(prompt, sample)
    if kind in ("copro", "mipro", "gepa"):
        return kind, _proposal(prompt, kind, sample=sample, seed=seed)
    if kind == "task":
        return kind, _task_reply(prompt, _question_of(prompt) or "", sample=sample, seed=seed)
    return kind, _fill(prompt, {}, sample)
