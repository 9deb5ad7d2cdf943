"""Hard-and-diverse exemplars: the meta-prompt shows problems the instructions fail,
unlike each other."""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy

from dspy_opro import HardDiverse, OPROTeleprompter
from dspy_opro.testing import SimulatedEndpoint, simulated_dataset, simulated_metric

with SimulatedEndpoint() as endpoint:
    task_lm = endpoint.lm("openai/simulated-task")
    prompt_lm = endpoint.lm("openai/simulated-optimizer")
    trainset = simulated_dataset(16)

    optimizer = OPROTeleprompter(
        metric=simulated_metric,
        prompt_model=prompt_lm,
        task_model=task_lm,
        num_steps=3,
        num_candidates=3,
        num_exemplars=3,
        num_threads=8,
        # instead of the authors' uniform draw per step;
        # theta 0: diversity only, 1: the hardest problems only
        exemplar_selection=HardDiverse(theta=0.7),
    )
    compiled = optimizer.compile(dspy.Predict("question -> answer"), trainset=trainset)
    run = compiled.opro_run

    for step in run.steps:
        if step.step == 0:  # step 0 picks for diversity alone
            print(f"step 0: exemplars {step.exemplar_indices}")
            continue
        # Difficulty of example i: 1 - its mean score over every instruction scored
        # before the step.
        scored = [
            c for c in run.candidates if c.status == "scored" and c.step < step.step
        ]
        difficulty = [
            1 - sum(c.scores[i] for c in scored) / len(scored)
            for i in step.exemplar_indices
        ]
        print(
            f"step {step.step}: exemplars {step.exemplar_indices}, "
            f"difficulty {[round(d, 2) for d in difficulty]}"
        )

    # The selection itself makes no LM calls: the optimizer calls and program runs are
    # OPRO's usual ones.
    # one request per step, n=3 (LiteLLM passes OpenAI's n on)
    assert endpoint.count(kind="opro") == 3
    assert endpoint.count(kind="task") == run.metric_calls
