"""A rate limit is retried, an auth error stops the run with its record saved, and
compiling again resumes it."""

import os
import tempfile
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy

from dspy_opro import OPROTeleprompter
from dspy_opro.errors import FatalLMError
from dspy_opro.testing import (
    FaultConfig,
    SimulatedEndpoint,
    simulated_dataset,
    simulated_metric,
)

log_dir = Path(tempfile.mkdtemp()) / "opro-run"
trainset = simulated_dataset(8)

with SimulatedEndpoint() as task_endpoint, SimulatedEndpoint() as optimizer_endpoint:
    # num_retries=0: no LiteLLM retries, so OPRO's own retry is visible
    def lm(model, endpoint):
        return dspy.LM(
            model,
            api_base=endpoint.base_url,
            api_key="offline",
            engine="litellm",
            cache=False,
            num_retries=0,
        )

    def optimizer():
        return OPROTeleprompter(
            metric=simulated_metric,
            prompt_model=lm("openai/simulated-optimizer", optimizer_endpoint),
            task_model=lm("openai/simulated-task", task_endpoint),
            num_steps=2,
            num_candidates=2,
            num_threads=1,
            log_dir=log_dir,
        )

    # The third task request gets HTTP 429; the optimizer's API key is refused.
    task_endpoint.faults = FaultConfig(
        fail_requests={2}, fail_kind="rate_limit", retry_after=0
    )
    optimizer_endpoint.faults = FaultConfig(auth_error=True)
    try:
        optimizer().compile(dspy.Predict("question -> answer"), trainset=trainset)
    except FatalLMError as error:
        print("stopped:", str(error)[:90], "...")
    start_runs = task_endpoint.count(kind="task", status=None)
    # the rate-limited run was retried once and then scored
    assert start_runs == len(trainset) + 1
    # state.json and progress.jsonl
    print("files:", sorted(path.name for path in log_dir.iterdir()))

    # Fix the key and compile again with the same log_dir: the start program is not run
    # again.
    optimizer_endpoint.faults = FaultConfig()
    compiled = optimizer().compile(
        dspy.Predict("question -> answer"), trainset=trainset
    )
    run = compiled.opro_run
    new = sum(1 for c in run.candidates if c.step >= 0 and c.status == "scored")
    assert (
        task_endpoint.count(kind="task", status=None) - start_runs
        == len(trainset) * new
    )
    print("status:", run.status, "| best training score:", 100 * run.best().score)
    print("files:", sorted(path.name for path in log_dir.iterdir()))

    # A finished run returns its result at once, with no LM call.
    before = task_endpoint.count(status=None) + optimizer_endpoint.count(status=None)
    optimizer().compile(dspy.Predict("question -> answer"), trainset=trainset)
    assert (
        task_endpoint.count(status=None) + optimizer_endpoint.count(status=None)
        == before
    )
