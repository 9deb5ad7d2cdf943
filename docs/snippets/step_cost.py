"""What a run costs, counted by the simulated endpoint: optimizer calls and program
runs."""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy

from dspy_opro import OPROTeleprompter
from dspy_opro.testing import SimulatedEndpoint, simulated_dataset, simulated_metric

with SimulatedEndpoint() as endpoint:
    task_lm = endpoint.lm("openai/simulated-task")
    prompt_lm = endpoint.lm("openai/simulated-optimizer")
    examples = simulated_dataset(16)
    trainset, valset = examples[:10], examples[10:]

    num_steps, num_candidates, top_k = 2, 4, 2
    optimizer = OPROTeleprompter(
        metric=simulated_metric,
        prompt_model=prompt_lm,
        task_model=task_lm,
        num_steps=num_steps,
        num_candidates=num_candidates,
        num_threads=8,
        select="validation",
        top_k=top_k,
    )
    compiled = optimizer.compile(
        dspy.Predict("question -> answer"), trainset=trainset, valset=valset
    )
    run = compiled.opro_run

    # Every reply either became a new candidate or was a duplicate / skipped; only new
    # ones are run.
    new = [c for c in run.candidates if c.step >= 0 and c.status == "scored"]
    optimizer_calls = endpoint.count(kind="opro")
    program_runs = endpoint.count(kind="task")  # one dspy.Predict call per run
    # LiteLLM passes OpenAI's n on: one request per step returns all num_candidates
    # replies.
    print(
        f"optimizer requests: {optimizer_calls} = num_steps = {num_steps}, "
        f"each with n={num_candidates}"
    )
    print(f"new instructions: {len(new)} (at most {num_steps * num_candidates})")
    print(
        f"program runs: {program_runs} = |train| x (1 + new) + top_k x |val| "
        f"= {len(trainset)} x (1 + {len(new)}) + {top_k} x {len(valset)}"
    )
    assert optimizer_calls == num_steps
    assert [r.n for r in endpoint.requests if r.kind == "opro"] == [
        num_candidates
    ] * num_steps
    assert (
        program_runs
        == run.metric_calls
        == len(trainset) * (1 + len(new)) + top_k * len(valset)
    )
