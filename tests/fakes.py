"""Fake language models for unit tests: DSPy custom engines, no network."""

from __future__ import annotations

import re
import textwrap
import threading
from collections.abc import Callable

import dspy
from dspy.lm15 import Message, Response, TextPart, Usage

OBJECTIVE = "your objective is:"


def system_text(request) -> str:
    system = request.system
    if system is None:
        return ""
    return system if isinstance(system, str) else "".join(part.text for part in system)


def user_text(request) -> str:
    return request.messages[-1].text or ""


def instruction_of(request) -> str:
    """The predictor instruction DSPy's chat adapter put at the end of the system message."""
    system = system_text(request)
    if OBJECTIVE not in system:
        return ""
    return textwrap.dedent(system.split(OBJECTIVE, 1)[1].lstrip(" ")).strip()


def field_value(text: str, name: str) -> str | None:
    match = re.search(rf"\[\[ ## {re.escape(name)} ## \]\]\n(.*?)(?=\n\n|\Z)", text, re.S)
    return match.group(1).strip() if match else None


def chat_reply(**fields: object) -> str:
    parts = [f"[[ ## {name} ## ]]\n{value}" for name, value in fields.items()]
    return "\n\n".join([*parts, "[[ ## completed ## ]]"])


class FakeEngine:
    """A DSPy custom engine answering with ``reply_fn(request)``; a returned exception is raised."""

    def __init__(self, reply_fn: Callable, *, input_tokens: int = 10, output_tokens: int = 5):
        self.reply_fn = reply_fn
        self.requests: list = []
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self._lock = threading.Lock()

    def complete(self, request):
        with self._lock:
            self.requests.append(request)
            number = len(self.requests)
        reply = self.reply_fn(request) if self.reply_fn.__code__.co_argcount == 1 else self.reply_fn(request, number)
        if isinstance(reply, BaseException):
            raise reply
        return Response(id=None, model="fake", message=Message.assistant([TextPart(reply)]), finish_reason="stop",
                        usage=Usage(input_tokens=self.input_tokens, output_tokens=self.output_tokens,
                                    total_tokens=self.input_tokens + self.output_tokens))

    def stream(self, request):
        raise NotImplementedError

    def close(self):
        pass


def make_lm(reply_fn: Callable, *, model: str = "openai/fake", **engine_kwargs) -> tuple[dspy.LM, FakeEngine]:
    engine = FakeEngine(reply_fn, **engine_kwargs)
    return dspy.LM(model, engine=engine, cache=False, num_retries=0), engine


# A toy task: question "item i" has answer "a{i}"; an instruction answers item i right iff i < its skill, the number
# of times the word "better" appears in it. Everything about a run is then predictable.

def skill(instruction: str) -> int:
    return len(re.findall(r"\bbetter\b", instruction.lower()))


def toy_dataset(n: int, prefix: str = "item") -> list[dspy.Example]:
    return [dspy.Example(question=f"{prefix} {i}", answer=f"a{i}").with_inputs("question") for i in range(n)]


def output_field_names(request) -> list[str]:
    """The output fields a DSPy chat-adapter request asks for, in order."""
    system = system_text(request)
    section = system.split("Your output fields are:", 1)[1].split("All interactions", 1)[0]
    return re.findall(r"^\d+\. `(\w+)`", section, re.M)


def toy_answer(question: str, instruction: str) -> str:
    index = int(question.split()[-1])
    if "overfit" in instruction.lower():  # right on training items only
        return f"a{index}" if question.startswith("item") else "wrong"
    return f"a{index}" if index < skill(instruction) else "wrong"


def toy_task_reply(request) -> str:
    question = field_value(user_text(request), "question") or ""
    values = {}
    for name in output_field_names(request):
        values[name] = toy_answer(question, instruction_of(request)) if name == "answer" else "Because."
    return chat_reply(**values)


def toy_metric(example, prediction, trace=None) -> float:
    return 1.0 if prediction.answer == example.answer else 0.0


def scripted_optimizer(replies: list[str]) -> Callable:
    """Replies in call order (repeat the last one when the script runs out)."""

    def reply(request, number):
        return replies[min(number - 1, len(replies) - 1)]

    return reply
