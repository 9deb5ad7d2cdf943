"""A program with two predictors: each step optimizes one of them, in turn."""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy

from dspy_opro import OPROTeleprompter
from dspy_opro.testing import SimulatedEndpoint, simulated_dataset, simulated_metric


class PlanThenAnswer(dspy.Module):
    def __init__(self):
        super().__init__()
        self.plan = dspy.Predict("question -> plan")
        self.solve = dspy.Predict("question, plan -> answer")

    def forward(self, question):
        plan = self.plan(question=question).plan
        return self.solve(question=question, plan=plan)


with SimulatedEndpoint() as endpoint:
    task_lm = endpoint.lm("openai/simulated-task")
    prompt_lm = endpoint.lm("openai/simulated-optimizer")

    optimizer = OPROTeleprompter(
        metric=simulated_metric,
        prompt_model=prompt_lm,
        task_model=task_lm,
        num_steps=4,
        num_candidates=3,
        num_threads=8,
    )
    compiled = optimizer.compile(PlanThenAnswer(), trainset=simulated_dataset(8))
    run = compiled.opro_run

    print("predictors:", run.predictors)  # as program.named_predictors() names them
    for step in run.steps:
        print(f"step {step.step}: optimizes {step.predictor!r}")
    assert [step.predictor for step in run.steps] == ["plan", "solve", "plan", "solve"]
    # A candidate changes one predictor and keeps the others at the best instructions
    # found before its step.
    for candidate in run.candidates[1:]:
        assert candidate.instructions[candidate.predictor] == candidate.instruction
    print(
        "returned:",
        {name: p.signature.instructions for name, p in compiled.named_predictors()},
    )
