"""Optimize a small DSPy program with OPRO, save it, load it back and run it.

Offline (the default) it starts a simulated OpenAI-compatible model on 127.0.0.1, so it
needs no network and no API key. With ``--lm MODEL`` (any LiteLLM model string, its key
taken from the environment, e.g. ``OPENAI_API_KEY``) the same program is optimized
against that model.

Everything it writes goes to one folder, ``runs/quickstart/`` by default
(``--out-dir``): the run record (``state.json``, ``steps/``), ``report.md``,
``trajectory.png`` and the compiled program (``program.json``). Each run starts afresh;
``--resume`` continues the run recorded there instead.

    python examples/quickstart.py
    python examples/quickstart.py --lm openai/gpt-4o-mini --steps 5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402

from dspy_opro import OPROTeleprompter  # noqa: E402
from dspy_opro.record.files import PROGRESS_FILE, STATE_FILE  # noqa: E402
from dspy_opro.record.report import (  # noqa: E402
    PLOT_INSTALL_HINT,
    REPORT_FILE,
    TRAJECTORY_FILE,
    format_usage,
    trajectory_rows,
)

DATA = Path(__file__).parent / "data" / "word_problems.jsonl"
OUT_DIR = Path("runs") / "quickstart"
PROGRAM_FILE = "program.json"
# What a previous quickstart run left in the folder (removed unless --resume).
RUN_FILES = (STATE_FILE, PROGRESS_FILE, REPORT_FILE, TRAJECTORY_FILE, PROGRAM_FILE)


def load_problems() -> list[dspy.Example]:
    """The bundled arithmetic word problems (question -> integer answer)."""
    lines = DATA.read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    return [
        dspy.Example(question=row["question"], answer=row["answer"]).with_inputs(
            "question"
        )
        for row in rows
    ]


def exact_integer(
    example: dspy.Example, prediction: dspy.Prediction, trace=None
) -> float:
    """1.0 when the first integer in the program's answer equals the reference
    answer."""
    match = re.search(r"-?\d+", str(prediction.answer).replace(",", ""))
    return float(match is not None and match.group(0) == example.answer)


def start_afresh(out_dir: Path) -> None:
    """Remove what a previous quickstart run left in ``out_dir`` (and nothing else)."""
    for name in RUN_FILES:
        (out_dir / name).unlink(missing_ok=True)
    shutil.rmtree(out_dir / "steps", ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lm", help="LiteLLM model string; default: a simulated model")
    parser.add_argument("--prompt-lm", help="optimizer model (default: --lm)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--candidates", type=int, default=4)
    parser.add_argument(
        "--train", type=int, default=20, help="training examples (the rest validate)"
    )
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=OUT_DIR,
        help=f"folder for the run record, report, plot, program (default: {OUT_DIR})",
    )
    parser.add_argument(
        "--resume", action="store_true", help="continue the run recorded in --out-dir"
    )
    args = parser.parse_args(argv)
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)  # fail now, not after the run
    if not args.resume:
        start_afresh(out_dir)

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
            print(
                f"Running offline against a simulated model at {endpoint.base_url} "
                "(pass --lm MODEL for a real one)."
            )

        problems = load_problems()
        trainset = problems[: args.train]
        valset = problems[args.train : args.train + 20]
        program = dspy.ChainOfThought("question -> answer")
        optimizer = OPROTeleprompter(
            metric=exact_integer,
            prompt_model=prompt_lm,
            task_model=task_lm,
            num_steps=args.steps,
            num_candidates=args.candidates,
            num_threads=args.threads,
            select="validation",
            log_dir=str(out_dir),  # the run record, report.md and trajectory.png
        )
        compiled = optimizer.compile(program, trainset=trainset, valset=valset)
        run = compiled.opro_run

        print("\nScore trajectory (training accuracy, 0-100):")
        print("| step | predictor | scored | best this step | best so far |")
        print("| ---: | --- | ---: | ---: | ---: |")
        for row in trajectory_rows(run):
            cells = [
                row["step"],
                row["predictor"] or "start",
                row["scored"],
                row["best_this_step"],
                row["best_so_far"],
            ]
            print("| " + " | ".join(str(cell) for cell in cells) + " |")
        best = run.candidates[run.selection.candidate_id]
        instructions = compiled.predict.signature.instructions
        print(f"\nBest instruction ({run.selection.reason}):\n  {instructions}")
        val = "n/a" if best.val_score is None else f"{100 * best.val_score:.1f}"
        print(f"Training {100 * best.score:.1f}, validation {val}")
        print("\nUsage:\n" + format_usage(run.usage))

        program_path = out_dir / PROGRAM_FILE
        compiled.save(str(program_path))
        reloaded = dspy.ChainOfThought("question -> answer")
        reloaded.load(str(program_path))
        question = valset[0].question if valset else trainset[0].question
        with dspy.context(lm=task_lm):
            answer = reloaded(question=question).answer
        print(f"\nLoaded the saved program back and asked: {question}\n  -> {answer}")

    print(f"\nFiles written to {out_dir}/:")
    files = [
        (program_path, "the compiled program (load it with program.load(path))"),
        (out_dir / REPORT_FILE, "the run report"),
        (out_dir / TRAJECTORY_FILE, "the score trajectory plot"),
        (out_dir / STATE_FILE, "the run record (resume with --resume)"),
        (out_dir / "steps", "each step's meta-prompt, replies and report"),
    ]
    for path, what in files:
        if path.exists():
            print(f"  {path}  {what}")
    if not (out_dir / TRAJECTORY_FILE).exists():
        hint = f"the plot needs matplotlib, {PLOT_INSTALL_HINT}"
        print(f"  (no {TRAJECTORY_FILE}: {hint})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
