"""Label-free OPRO: no labels; a judge model compares each candidate's run with the
starting program's run."""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy

from dspy_opro import OPROTeleprompter, PairwisePreference
from dspy_opro.testing import SimulatedEndpoint, simulated_dataset

with SimulatedEndpoint() as endpoint:
    task_lm = endpoint.lm("openai/simulated-task")
    prompt_lm = endpoint.lm("openai/simulated-optimizer")

    # Inputs only: label-free OPRO never reads a label.
    questions = [
        dspy.Example(question=ex.question).with_inputs("question")
        for ex in simulated_dataset(14)
    ]
    trainset, valset = questions[:8], questions[8:]

    optimizer = OPROTeleprompter(
        # label-free: the task model judges its own runs, each pair twice
        # (positions swapped) to cancel position bias
        metric=PairwisePreference(judge_model=task_lm, both_orders=True),
        prompt_model=prompt_lm,
        task_model=task_lm,
        num_steps=2,
        num_candidates=2,
        num_threads=8,
    )
    compiled = optimizer.compile(
        dspy.Predict("question -> answer"), trainset=trainset, valset=valset
    )
    run = compiled.opro_run

    for candidate in run.candidates:
        # Score = (mean preference over the starting program + 10) / 20; the start
        # scores 0.5 against itself.
        print(
            f"candidate {candidate.id}: score {candidate.score}  "
            f"{candidate.instruction[:60]!r}"
        )
    print(f"selected by {run.selection.selected_by}: {run.selection.reason}")

    # Cost: one program run per candidate and training example, plus two judge calls
    # with both_orders=True. The starting program runs without a judge (its runs are the
    # anchors). No candidate beat it on training, so the gate on the valset was not
    # needed.
    new = sum(1 for c in run.candidates if c.id != 0 and c.status == "scored")
    print(
        f"judge calls: {endpoint.count(kind='judge')}, "
        f"program runs: {endpoint.count(kind='task')}"
    )
    assert endpoint.count(kind="judge") == 2 * new * len(trainset)
    assert endpoint.count(kind="task") == (1 + new) * len(trainset)
