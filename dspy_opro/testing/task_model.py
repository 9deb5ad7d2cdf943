"""The simulated task: a word-problem dataset, its metric, an instruction landscape, the answers and the judge.

:func:`simulated_dataset` makes arithmetic word problems from eight templates; :func:`simulated_metric` compares
the first integer of the answer with the label. Whether the simulated task model answers a question right is a
fixed function of the predictor's instruction: right iff ``u < instruction_quality(instruction)``, with ``u`` a
stable hash of ``(seed, instruction, question)`` in ``[0, 1)`` (:func:`answers_correctly`). The instruction
landscape is :data:`TRAITS` plus :func:`instruction_quality`. :func:`task_reply` answers a DSPy adapter prompt of a
program over the dataset (``Predict``, ``ChainOfThought``, ``ReAct`` and its extract step, using
:func:`arithmetic_tool`); :func:`judge_reply` answers the pairwise preference judge by comparing the qualities of
the two trajectories' instructions. ``dspy`` is imported lazily, by :func:`simulated_dataset` and
:func:`simulated_metric_with_feedback` only.
"""

from __future__ import annotations

import ast
import json
import operator
import random
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dspy_opro.testing.adapter_prompts import AdapterPrompt, fill_outputs
from dspy_opro.testing.hashing import stable_unit

if TYPE_CHECKING:
    import dspy

__all__ = [
    "BASE_QUALITY",
    "TRAITS",
    "Trait",
    "answers_correctly",
    "arithmetic_tool",
    "instruction_quality",
    "instruction_traits",
    "judge_reply",
    "question_of",
    "simulated_dataset",
    "simulated_metric",
    "simulated_metric_with_feedback",
    "solve_question",
    "task_reply",
]


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
"""The traits the simulated task model rewards or penalises in an instruction, each a pattern with its weight
(``instruction_quality`` adds the weights of those an instruction matches)."""


def instruction_traits(instruction: str) -> list[Trait]:
    """The traits an instruction expresses, in :data:`TRAITS` order."""
    return [trait for trait in TRAITS if trait.matches(instruction or "")]


def instruction_quality(instruction: str) -> float:
    """The simulated task model's probability of answering correctly under ``instruction``.

    ``0.30`` plus the weights of the matched ``TRAITS``, minus ``0.05`` per 100 characters beyond 300
    (at most ``0.20``), clipped to ``[0.05, 0.95]``.
    """
    instruction = (instruction or "").strip()
    p = BASE_QUALITY + sum(trait.weight for trait in instruction_traits(instruction))
    if len(instruction) > _LENGTH_FREE_CHARS:
        p -= min(_LENGTH_PENALTY_MAX, (len(instruction) - _LENGTH_FREE_CHARS) * _LENGTH_PENALTY_PER_CHAR)
    return round(min(_MAX_QUALITY, max(_MIN_QUALITY, p)), 6)


# --------------------------------------------------------------------------------------------------------------
# The dataset and its metric
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


def simulated_dataset(n: int = 40, *, seed: int = 0) -> list[dspy.Example]:
    """``n`` arithmetic word problems as ``dspy.Example(question=..., answer="<int>").with_inputs("question")``.

    Deterministic for a seed; the questions are distinct and cycle through eight templates in a shuffled order.
    """
    import dspy

    rng = random.Random(f"simulated-dataset:{seed}")
    examples: list[dspy.Example] = []
    seen: set[str] = set()
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


def simulated_metric(example: dspy.Example, prediction: Any, trace: Any = None) -> float:
    """1.0 when the first integer in ``prediction.answer`` equals ``example.answer``, else 0.0."""
    got = _first_int(getattr(prediction, "answer", None))
    want = _first_int(example.answer)
    return 1.0 if got is not None and got == want else 0.0


def simulated_metric_with_feedback(
    gold: dspy.Example, pred: Any, trace: Any = None, pred_name: str | None = None, pred_trace: Any = None
) -> dspy.Prediction:
    """``simulated_metric`` in the shape ``dspy.GEPA`` takes: ``dspy.Prediction(score=..., feedback=...)``."""
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

_PARSE_LOCK = threading.Lock()
_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _evaluate(expression: str) -> int | float:
    if len(expression) > 200:
        raise ValueError("expression too long")
    with _PARSE_LOCK:  # CPython 3.11's ast.parse is not thread-safe: "AST constructor recursion depth mismatch"
        tree = ast.parse(expression.strip(), mode="eval")

    def walk(node: ast.AST) -> int | float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
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
# Answering the task and judging
# --------------------------------------------------------------------------------------------------------------


def answers_correctly(instruction: str, question: str, *, seed: int = 0) -> bool:
    """Whether the simulated task model answers ``question`` correctly under ``instruction`` (and ``seed``)."""
    return stable_unit("task", seed, instruction, question) < instruction_quality(instruction)


def _answer_for(instruction: str, question: str, *, seed: int) -> tuple[int, str] | None:
    solved = solve_question(question)
    if solved is None:
        return None
    truth, expression = solved
    if answers_correctly(instruction, question, seed=seed):
        return truth, expression
    offset = 1 + int(stable_unit("offset", seed, instruction, question) * 5)
    sign = 1 if stable_unit("sign", seed, instruction, question) < 0.5 else -1
    return truth + sign * offset, expression


def question_of(prompt: AdapterPrompt) -> str | None:
    """The simulated word problem an adapter prompt asks about (its ``question`` input first), or None."""
    if "question" in prompt.inputs and solve_question(prompt.inputs["question"]):
        return prompt.inputs["question"]
    for name, value in prompt.inputs.items():
        if name != "trajectory" and solve_question(value):
            return value
    return None


_TOOL_LINE = re.compile(r"^\((\d+)\) (\w+)(.*)$", re.MULTILINE)


def _react_step(prompt: AdapterPrompt, question: str, sample: int) -> dict[str, Any]:
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


def task_reply(prompt: AdapterPrompt, question: str, *, sample: int, seed: int) -> str:
    """The task model's reply to a program's adapter prompt about ``question``: the (possibly wrong) answer, a
    reasoning line for the other text outputs, and a ReAct step when the prompt asks for one."""
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
    return fill_outputs(prompt, known, sample)


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


def judge_reply(prompt: AdapterPrompt, sample: int) -> str:
    """The pairwise judge's reply: a preference in [-10, 10] from the two trajectories' instruction qualities."""
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
    return fill_outputs(prompt, known, sample)
