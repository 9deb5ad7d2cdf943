"""Optimize your own task offline, with models you write yourself: a DSPy custom engine.

The simulated endpoint of ``dspy_opro.testing`` only knows its own arithmetic problems
(any other task gets filler answers). To try OPRO on your own task without a network or
an API key, give ``dspy.LM`` an engine: any object with ``complete(request) ->
Response``. This one classifies the sentiment of short reviews by keywords, and reads
negations ("not good") only when its instruction mentions them, so that instructions
matter; a second engine plays the optimizer with a few scripted proposals.

    python examples/custom_engine.py
"""

from __future__ import annotations

import argparse
import re

import dspy
from dspy.lm15 import Message, Response, TextPart, Usage

from dspy_opro import OPROTeleprompter

REVIEWS = [
    ("A wonderful, warm film.", "positive"),
    ("Not good at all.", "negative"),
    ("I loved every minute.", "positive"),
    ("The plot was not great and the acting was bad.", "negative"),
    ("Not bad, actually quite fun.", "positive"),
    ("Terrible pacing, awful sound.", "negative"),
    ("It was not boring for a second.", "positive"),
    ("Great cast, great story.", "positive"),
    ("Not worth the ticket.", "negative"),
    ("Bad. Just bad.", "negative"),
]
GOOD = {"wonderful", "warm", "loved", "great", "fun", "good", "worth"}
BAD = {"bad", "terrible", "awful", "boring"}
PROPOSALS = [
    "Classify the review's sentiment.",
    "Read the review; watch for negation such as 'not good' before classifying.",
    "Decide if the review is positive or negative.",
]


def reply(text: str, tokens_in: int) -> Response:
    """A response carrying ``text``, with token counts so that usage is recorded."""
    usage = Usage(input_tokens=tokens_in, output_tokens=len(text.split()),
                  total_tokens=tokens_in + len(text.split()))
    return Response(id=None, model="local", message=Message.assistant([TextPart(text)]),
                    finish_reason="stop", usage=usage)


def classify(review: str, instruction: str) -> str:
    """Keyword sentiment; "not" flips the next word if the instruction says so."""
    words = re.findall(r"[a-z]+", review.lower())
    negations = "negation" in instruction.lower()
    score = 0
    for i, word in enumerate(words):
        sign = 1 if word in GOOD else -1 if word in BAD else 0
        if negations and i > 0 and words[i - 1] == "not":
            sign = -sign
        score += sign
    return "positive" if score > 0 else "negative"


class KeywordModel:
    """The task model: reads DSPy's chat-adapter prompt, answers in its format."""

    def complete(self, request) -> Response:
        system = request.system if isinstance(request.system, str) else "".join(
            part.text for part in request.system or [])
        instruction = system.split("your objective is:", 1)[-1]
        user = request.messages[-1].text or ""
        found = re.search(r"\[\[ ## review ## \]\]\n(.*?)(?:\n\n|$)", user, re.S)
        label = classify(found.group(1) if found else "", instruction)
        answer = f"[[ ## sentiment ## ]]\n{label}\n\n[[ ## completed ## ]]"
        return reply(answer, len((system + user).split()))

    def stream(self, request):
        raise NotImplementedError


class ScriptedOptimizer:
    """The optimizer model: one proposal per request, in turn, in OPRO's <INS> tags."""

    def __init__(self) -> None:
        self.calls = 0

    def complete(self, request) -> Response:
        text = PROPOSALS[self.calls % len(PROPOSALS)]
        self.calls += 1
        prompt = request.messages[-1].text or ""
        return reply(f"<INS>{text}</INS>", len(prompt.split()))

    def stream(self, request):
        raise NotImplementedError


def exact(example: dspy.Example, prediction: dspy.Prediction, trace=None) -> bool:
    return prediction.sentiment == example.sentiment


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)

    task = dspy.LM("local/keywords", engine=KeywordModel(), cache=False)
    optimizer_lm = dspy.LM("local/scripted", engine=ScriptedOptimizer(), cache=False)
    trainset = [
        dspy.Example(review=text, sentiment=label).with_inputs("review")
        for text, label in REVIEWS
    ]
    program = dspy.Predict("review -> sentiment")
    optimizer = OPROTeleprompter(
        metric=exact,
        prompt_model=optimizer_lm,
        task_model=task,
        num_steps=args.steps,
        num_candidates=1,
        num_threads=1,
        display_progress=False,
    )
    print(optimizer.estimate(program, trainset).describe())
    compiled = optimizer.compile(program, trainset=trainset)
    run = compiled.opro_run
    start = 100 * (run.candidates[0].score or 0.0)
    best = run.best()
    assert best is not None
    print(f"Training accuracy: start {start:.1f}, best {100 * (best.score or 0):.1f}")
    print(f"Best instruction: {compiled.signature.instructions}")
    usage = run.usage
    print(f"Task calls: {usage.task.calls}, optimizer calls: {usage.optimizer.calls}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
