"""A first OPRO run, offline: a simulated model on 127.0.0.1 plays both the task model
and the optimizer."""

import os

# LiteLLM: no price-list download
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy

from dspy_opro import OPROTeleprompter
from dspy_opro.testing import SimulatedEndpoint, simulated_dataset, simulated_metric

with SimulatedEndpoint() as endpoint:
    task_lm = endpoint.lm("openai/simulated-task")
    prompt_lm = endpoint.lm("openai/simulated-optimizer")

    # dspy.Example(question=..., answer="<int>").with_inputs("question")
    examples = simulated_dataset(20)
    trainset, valset = examples[:12], examples[12:]

    optimizer = OPROTeleprompter(
        # metric(example, prediction, trace=None) -> float in [0, 1]
        metric=simulated_metric,
        prompt_model=prompt_lm,  # the optimizer model that reads the meta-prompt
        task_model=task_lm,  # the model that runs the program while scoring
        num_steps=3,
        num_candidates=4,
        num_threads=8,
    )
    compiled = optimizer.compile(
        dspy.ChainOfThought("question -> answer"), trainset=trainset, valset=valset
    )

    run = compiled.opro_run  # the run record (dspy_opro.RunState)
    start, best = run.candidates[0], run.best()
    print(
        f"start: {100 * start.score:.1f}  best: {100 * best.score:.1f}"
        "  (training accuracy)"
    )
    print("instruction:", compiled.predict.signature.instructions)
    assert best.score >= start.score
