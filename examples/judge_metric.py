"""OPRO with a metric that asks a judge model and returns a score with textual feedback.

The training examples carry questions only, no reference answers. The metric asks a
judge model to work each problem out and compares the program's answer with the judge's;
it returns ``dspy.Prediction(score=..., feedback=...)``. Because the examples have no
labels, the meta-prompt cannot show the authors' "ground truth answer": it shows the
program's own answer where the judge agreed with it, and the judge's feedback where it
did not.

Offline (the default) it starts a simulated OpenAI-compatible model on 127.0.0.1, so it
needs no network and no API key. With ``--lm MODEL`` (any LiteLLM model string, its key
taken from the environment) the same run uses that model; ``--judge-lm`` picks a
different judge.

    python examples/judge_metric.py
    python examples/judge_metric.py --lm openai/gpt-4o-mini --judge-lm openai/gpt-4o
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402

from dspy_opro import OPROTeleprompter  # noqa: E402
from dspy_opro.testing import simulated_dataset  # noqa: E402


# --8<-- [start:judge]
class CheckAnswer(dspy.Signature):
    """Work the problem out yourself, step by step, carefully, and verify the result."""

    question: str = dspy.InputField()
    proposed_answer: str = dspy.InputField(desc="the answer to check")
    working: str = dspy.OutputField(desc="your own working, one or two sentences")
    answer: str = dspy.OutputField(desc="the correct answer, a number")


def first_integer(text) -> str | None:
    match = re.search(r"-?\d+", str(text).replace(",", ""))
    return match.group(0) if match else None


class JudgeMetric:
    """A metric that calls a judge LM: 1.0 when the judge reaches the program's answer,
    else 0.0 with feedback."""

    def __init__(self, judge_lm: dspy.LM):
        self.judge_lm = judge_lm
        self.check = dspy.Predict(CheckAnswer)

    def __call__(
        self, example: dspy.Example, prediction: dspy.Prediction, trace=None
    ) -> dspy.Prediction:
        with dspy.context(lm=self.judge_lm):
            verdict = self.check(
                question=example.question, proposed_answer=str(prediction.answer)
            )
        proposed, expected = (
            first_integer(prediction.answer),
            first_integer(verdict.answer),
        )
        if proposed is not None and proposed == expected:
            return dspy.Prediction(score=1.0, feedback=f"Correct. {verdict.working}")
        return dspy.Prediction(
            score=0.0,
            feedback=f"The answer {prediction.answer!r} is wrong; "
            f"a checker worked it out as: {verdict.working}",
        )
# --8<-- [end:judge]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--lm", help="LiteLLM model string; default: an offline simulated model"
    )
    parser.add_argument(
        "--prompt-lm", help="optimizer model (default: the same as --lm)"
    )
    parser.add_argument("--judge-lm", help="judge model (default: the same as --lm)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--candidates", type=int, default=3)
    parser.add_argument("--train", type=int, default=10, help="training examples")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument(
        "--log-dir", default=None, help="keep the run record here (resumable)"
    )
    args = parser.parse_args(argv)

    with contextlib.ExitStack() as stack:
        if args.lm:
            task_lm = dspy.LM(args.lm, temperature=0.0)
            prompt_lm = dspy.LM(args.prompt_lm or args.lm, engine="litellm")
            judge_lm = dspy.LM(args.judge_lm or args.lm, temperature=0.0)
        else:
            from dspy_opro.testing import SimulatedEndpoint

            endpoint = stack.enter_context(SimulatedEndpoint())
            task_lm = endpoint.lm("openai/simulated-task")
            prompt_lm = endpoint.lm("openai/simulated-optimizer")
            judge_lm = endpoint.lm("openai/simulated-judge")
            print(
                f"Running offline against a simulated model at {endpoint.base_url} "
                "(pass --lm MODEL for a real one)."
            )

        # --8<-- [start:compile]
        # Questions only: the examples have no field named like the program's output
        # `answer`.
        trainset = [
            dspy.Example(question=ex.question).with_inputs("question")
            for ex in simulated_dataset(args.train)
        ]
        optimizer = OPROTeleprompter(
            metric=JudgeMetric(judge_lm),
            prompt_model=prompt_lm,
            task_model=task_lm,
            num_steps=args.steps,
            num_candidates=args.candidates,
            num_threads=args.threads,
            log_dir=args.log_dir,
        )
        compiled = optimizer.compile(
            dspy.Predict("question -> answer"), trainset=trainset
        )
        run = compiled.opro_run

        # The problems of the first meta-prompt, with the answers OPRO showed for them.
        first = run.steps[0]
        print(
            first.meta_prompt.split("Below are some problems.\n", 1)[1].split(
                "\n\n\nGenerate", 1
            )[0]
        )
        # --8<-- [end:compile]

        best = run.best()
        print(
            f"\nBest training score {100 * best.score:.1f}: "
            f"{compiled.signature.instructions}"
        )
        judge_calls = run.usage.by_model.get(judge_lm.model)
        print(
            "Judge calls (recorded under the task role): "
            f"{judge_calls.calls if judge_calls else 0}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
