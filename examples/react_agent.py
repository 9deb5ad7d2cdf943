"""Optimize the instructions of a dspy.ReAct agent with OPRO; every candidate is scored
by running the agent.

Offline (the default) it starts a simulated OpenAI-compatible model on 127.0.0.1, so it
needs no network and no API key. With ``--lm MODEL`` (any LiteLLM model string, its key
taken from the environment) the same agent is optimized against that model.

    python examples/react_agent.py
    python examples/react_agent.py --lm openai/gpt-4o-mini --steps 5
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402

from dspy_opro import OPROTeleprompter  # noqa: E402
from dspy_opro.record.report import format_usage  # noqa: E402
from dspy_opro.testing import arithmetic_tool, simulated_dataset  # noqa: E402


# --8<-- [start:metric]
def exact_integer(
    example: dspy.Example, prediction: dspy.Prediction, trace=None
) -> float:
    """1.0 when the first integer in the agent's final answer equals the reference
    answer."""
    match = re.search(r"-?\d+", str(prediction.answer).replace(",", ""))
    return float(match is not None and match.group(0) == example.answer)
# --8<-- [end:metric]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--lm", help="LiteLLM model string; default: an offline simulated model"
    )
    parser.add_argument(
        "--prompt-lm", help="optimizer model (default: the same as --lm)"
    )
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--candidates", type=int, default=3)
    parser.add_argument("--train", type=int, default=10, help="training examples")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument(
        "--predictors",
        nargs="+",
        help="predictors to optimize (default: all), e.g. react",
    )
    parser.add_argument(
        "--log-dir", default=None, help="keep the run record here (resumable)"
    )
    args = parser.parse_args(argv)

    with contextlib.ExitStack() as stack:
        if args.lm:
            task_lm = dspy.LM(args.lm, temperature=0.0)
            prompt_lm = dspy.LM(args.prompt_lm or args.lm, engine="litellm")
        else:
            from dspy_opro.testing import SimulatedEndpoint

            endpoint = stack.enter_context(SimulatedEndpoint())
            task_lm = endpoint.lm("openai/simulated-task")
            prompt_lm = endpoint.lm("openai/simulated-optimizer")
            print(
                f"Running offline against a simulated model at {endpoint.base_url} "
                "(pass --lm MODEL for a real one)."
            )

        # --8<-- [start:compile]
        agent = dspy.ReAct("question -> answer", tools=[arithmetic_tool], max_iters=4)
        # ['react', 'extract.predict']
        print("Predictors:", [name for name, _ in agent.named_predictors()])

        optimizer = OPROTeleprompter(
            # applied to the agent's final prediction, after all its tool calls
            metric=exact_integer,
            prompt_model=prompt_lm,
            task_model=task_lm,
            # with both predictors: even steps 'react', odd ones 'extract.predict'
            num_steps=args.steps,
            num_candidates=args.candidates,
            num_threads=args.threads,
            # None: every predictor, 'react' included (its tool list is kept)
            predictors=args.predictors,
            log_dir=args.log_dir,
        )
        compiled = optimizer.compile(agent, trainset=simulated_dataset(args.train))
        # --8<-- [end:compile]

        run = compiled.opro_run
        start, best = run.candidates[0], run.best()
        print(
            f"\nTraining accuracy: start {100 * start.score:.1f}, "
            f"best {100 * best.score:.1f} "
            f"(candidate {best.id}, step {best.step})"
        )
        for name, predictor in compiled.named_predictors():
            print(f"\n{name!r} instruction:\n{predictor.signature.instructions}")

        # --8<-- [start:react]
        # OPRO searches the part of the 'react' instruction before DSPy's agent protocol
        # ("You are an Agent. ..."); every candidate program carries the proposal
        # followed by the protocol and the tool list, unchanged.
        proposals = [c for c in run.scored() if c.predictor == "react"]
        if proposals:
            top = max(proposals, key=lambda c: c.score)  # the earliest wins a tie
            program = next(
                entry["program"]
                for entry in compiled.candidate_programs
                if entry["instructions"] == top.instructions
            )
            print(
                f"\nBest 'react' proposal (candidate {top.id}, "
                f"training {100 * top.score:.1f}), as OPRO wrote it:\n"
                f"{top.instructions['react']}\n"
            )
            print("... and as the agent reads it:")
            print(program.react.signature.instructions)
        # --8<-- [end:react]
        print("\nUsage (several LM calls per agent run):\n" + format_usage(run.usage))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
