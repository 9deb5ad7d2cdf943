"""The validation gate: keep the program as given unless the best candidate beats it on
held-out examples."""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy

from dspy_opro import OPROTeleprompter, ValGate
from dspy_opro.testing import SimulatedEndpoint, simulated_dataset, simulated_metric

with SimulatedEndpoint() as endpoint:
    task_lm = endpoint.lm("openai/simulated-task")
    prompt_lm = endpoint.lm("openai/simulated-optimizer")
    examples = simulated_dataset(24)
    trainset, valset = examples[:12], examples[12:]

    top_k = 2
    optimizer = OPROTeleprompter(
        metric=simulated_metric,
        prompt_model=prompt_lm,
        task_model=task_lm,
        num_steps=2,
        num_candidates=3,
        num_threads=8,
        # compare the top_k on validation with the program as given; the winner
        # must beat the start's validation score by more than 5 points
        val_gate=ValGate(min_delta=0.05),
        top_k=top_k,
    )
    compiled = optimizer.compile(
        dspy.Predict("question -> answer"), trainset=trainset, valset=valset
    )
    run = compiled.opro_run

    winner = max(
        (c for c in run.candidates if c.val_score is not None and c.id != 0),
        key=lambda c: c.val_score,
    )
    print(
        f"validation: start {100 * run.start_val_score:.1f}, "
        f"best of the top {top_k} {100 * winner.val_score:.1f}"
    )
    print(f"selected by {run.selection.selected_by}: {run.selection.reason}")

    # Validation cost: the top_k on training, plus the start once (when it is not among
    # them).
    new = sum(1 for c in run.candidates if c.step >= 0 and c.status == "scored")
    validated = sum(1 for c in run.candidates if c.val_scores is not None)
    assert validated == top_k + 1
    assert run.metric_calls == len(trainset) * (1 + new) + (top_k + 1) * len(valset)
