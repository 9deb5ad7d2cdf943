"""Optimize a small DSPy program with OPRO, save it, load it back and run it.

Offline (the default) it starts a simulated OpenAI-compatible model on 127.0.0.1, so it needs no network and no
API key. With ``--lm MODEL`` (any LiteLLM model string, its key taken from the environment, e.g.
``OPENAI_API_KEY``) the same program is optimized against that model.

    python examples/quickstart.py
    python examples/quickstart.py --lm openai/gpt-4o-mini --steps 5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402

from dspy_opro import OPROTeleprompter  # noqa: E402
from dspy_opro.report import format_usage, trajectory_rows  # noqa: E402

DATA = Path(__file__).parent / "data" / "word_problems.jsonl"


def load_problems() -> list[dspy.Example]:
    """The bundled arithmetic word problems (question -> integer answer)."""
    rows = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [dspy.Example(question=row["question"], answer=row["answer"]).with_inputs("question") for row in rows]


def exact_integer(example: dspy.Example, prediction: dspy.Prediction, trace=None) -> float:
    """1.0 when the first integer in the program's answer equals the reference answer."""
    match = re.search(r"-?\d+", str(prediction.answer).replace(",", ""))
    return float(match is not None and match.group(0) == example.answer)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lm", help="LiteLLM model string; default: an offline simulated model")
    parser.add_argument("--prompt-lm", help="optimizer model (default: the same as --lm)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--candidates", type=int, default=4)
    parser.add_argument("--train", type=int, default=20, help="training examples (the rest validate)")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--out", default="quickstart_compiled.json", help="where to save the compiled program")
    parser.add_argument("--log-dir", default=None, help="keep the run record here (resumable)")
    args = parser.parse_args(argv)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)  # fail now, not after the run

    with contextlib.ExitStack() as stack:
        if args.lm:
            task_lm = dspy.LM(args.lm, temperature=0.0)
            prompt_lm = dspy.LM(args.prompt_lm or args.lm, engine="litellm")
            print(f"Running against {args.lm} (optimizer: {prompt_lm.model}).")
        else:
            from dspy_opro.testing import SimulatedEndpoint

            endpoint = stack.enter_context(SimulatedEndpoint())
            task_lm = endpoint.lm("openai/simulated-task")
            prompt_lm = endpoint.lm("openai/simulated-optimizer")
            print(f"Running offline against a simulated model at {endpoint.base_url} (pass --lm MODEL for a real one).")

        problems = load_problems()
        trainset, valset = problems[: args.train], problems[args.train : args.train + 20]
        program = dspy.ChainOfThought("question -> answer")
        optimizer = OPROTeleprompter(
            metric=exact_integer,
            prompt_model=prompt_lm,
            task_model=task_lm,
            num_steps=args.steps,
            num_candidates=args.candidates,
            num_threads=args.threads,
            select="validation",
            log_dir=args.log_dir,
        )
        compiled = optimizer.compile(program, trainset=trainset, valset=valset)
        run = compiled.opro_run

        print("\nScore trajectory (training accuracy, 0-100):")
        print("| step | predictor | scored | best this step | best so far |")
        print("| ---: | --- | ---: | ---: | ---: |")
        for row in trajectory_rows(run):
            print(f"| {row['step']} | {row['predictor'] or 'start'} | {row['scored']} | {row['best_this_step']} "
                  f"| {row['best_so_far']} |")
        best = run.candidates[run.selection.candidate_id]
        print(f"\nBest instruction ({run.selection.reason}):\n  {compiled.predict.signature.instructions}")
        print(f"Training {100 * best.score:.1f}, validation "
              f"{'n/a' if best.val_score is None else f'{100 * best.val_score:.1f}'}")
        print("\nUsage:\n" + format_usage(run.usage))

        compiled.save(args.out)
        print(f"\nSaved the compiled program to {args.out}")
        reloaded = dspy.ChainOfThought("question -> answer")
        reloaded.load(args.out)
        question = valset[0].question if valset else trainset[0].question
        with dspy.context(lm=task_lm):
            answer = reloaded(question=question).answer
        print(f"Loaded it back and asked: {question}\n  -> {answer}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
