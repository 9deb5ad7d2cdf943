"""Save a program optimized by OPRO, load it into a fresh program, and read the run
record it came from.

The first run optimizes a small program, saves it to ``--program`` and keeps the run
record in ``--log-dir``; later runs find the saved program and skip the optimization.
The saved JSON holds the program's instructions; the run record (``state.json``) holds
every candidate that was scored.

Offline (the default) it starts a simulated OpenAI-compatible model on 127.0.0.1, so it
needs no network and no API key. With ``--lm MODEL`` (any LiteLLM model string, its key
taken from the environment) it uses that model.

    python examples/load_compiled.py
    python examples/load_compiled.py --lm openai/gpt-4o-mini
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402

from dspy_opro import OPROTeleprompter  # noqa: E402
from dspy_opro.record.files import load_state  # noqa: E402
from dspy_opro.testing import simulated_metric  # noqa: E402

DATA = Path(__file__).parent / "data" / "word_problems.jsonl"


def load_problems() -> list[dspy.Example]:
    rows = [
        json.loads(line)
        for line in DATA.read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    return [
        dspy.Example(question=row["question"], answer=row["answer"]).with_inputs(
            "question"
        )
        for row in rows
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--lm", help="LiteLLM model string; default: an offline simulated model"
    )
    parser.add_argument(
        "--program",
        default="opro_program.json",
        help="where the optimized program is saved",
    )
    parser.add_argument(
        "--log-dir", default="opro_run", help="where the run record is kept"
    )
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args(argv)

    with contextlib.ExitStack() as stack:
        if args.lm:
            task_lm = dspy.LM(args.lm, temperature=0.0)
            prompt_lm = dspy.LM(args.lm, engine="litellm")
        else:
            from dspy_opro.testing import SimulatedEndpoint

            endpoint = stack.enter_context(SimulatedEndpoint())
            task_lm = endpoint.lm("openai/simulated-task")
            prompt_lm = endpoint.lm("openai/simulated-optimizer")
        problems = load_problems()
        trainset, testset = problems[:12], problems[12:32]

        if not Path(args.program).exists():
            optimizer = OPROTeleprompter(
                metric=simulated_metric,
                prompt_model=prompt_lm,
                task_model=task_lm,
                num_steps=3,
                num_candidates=3,
                num_threads=args.threads,
                log_dir=args.log_dir,
            )
            compiled = optimizer.compile(
                dspy.ChainOfThought("question -> answer"), trainset=trainset
            )
            compiled.save(args.program)
            print(f"Optimized and saved the program to {args.program}")

        # --8<-- [start:load]
        # A fresh program of the same shape, then the saved instructions.
        program = dspy.ChainOfThought("question -> answer")
        program.load(args.program)
        print("Loaded instruction:", program.predict.signature.instructions)

        evaluate = dspy.Evaluate(
            devset=testset, metric=simulated_metric, num_threads=args.threads
        )
        with dspy.context(lm=task_lm):
            before = evaluate(dspy.ChainOfThought("question -> answer")).score
            after = evaluate(program).score
        print(f"Held-out accuracy: {before:.1f} as given, {after:.1f} optimized")

        # The run record: every scored candidate, best first; any of them can be
        # rebuilt.
        run = load_state(args.log_dir)
        ranked = sorted(
            (c for c in run.candidates if c.status == "scored"), key=lambda c: -c.score
        )
        for candidate in ranked[:3]:
            print(
                f"  {100 * candidate.score:5.1f}  step {candidate.step:2d}  "
                f"{candidate.instructions}"
            )
        runner_up = dspy.ChainOfThought("question -> answer")
        for name, predictor in runner_up.named_predictors():
            predictor.signature = predictor.signature.with_instructions(
                ranked[1].instructions[name]
            )
        # --8<-- [end:load]
        with dspy.context(lm=task_lm):
            print(f"Runner-up on held-out: {evaluate(runner_up).score:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
