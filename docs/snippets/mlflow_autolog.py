"""MLflow's DSPy autolog on an OPRO compile: a run with the settings and the score
history, a nested run per scored candidate (offline, a local sqlite store)."""

import os
import tempfile

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy
import mlflow
import mlflow.dspy
from mlflow.tracking import MlflowClient

from dspy_opro import OPROTeleprompter
from dspy_opro.testing import SimulatedEndpoint, simulated_dataset, simulated_metric

store = tempfile.mkdtemp()
mlflow.set_tracking_uri(f"sqlite:///{store}/mlflow.db")

with SimulatedEndpoint() as endpoint:
    # --8<-- [start:mlflow]
    mlflow.set_experiment("opro")
    mlflow.dspy.autolog(log_compiles=True, log_evals=True, log_traces=False)

    optimizer = OPROTeleprompter(
        metric=simulated_metric,
        prompt_model=endpoint.lm("openai/simulated-optimizer"),
        task_model=endpoint.lm("openai/simulated-task"),
        num_steps=2,
        num_candidates=3,
    )
    with dspy.context(lm=endpoint.lm("openai/simulated-task")):
        compiled = optimizer.compile(
            dspy.Predict("question -> answer"), trainset=simulated_dataset(6)
        )
    # --8<-- [end:mlflow]

client = MlflowClient()
experiment = client.get_experiment_by_name("opro")
runs = client.search_runs([experiment.experiment_id])
(parent,) = [run for run in runs if "mlflow.parentRunId" not in run.data.tags]
nested = [run for run in runs if "mlflow.parentRunId" in run.data.tags]
history = client.get_metric_history(parent.info.run_id, "eval")
print(f"{len(nested)} nested runs, one per scored candidate")
print("num_steps:", parent.data.params["num_steps"])
print("eval history:", [m.value for m in history])

# Leave the process as it was (this snippet runs inside the test suite).
mlflow.dspy.autolog(disable=True)
dspy.settings.configure(track_usage=False)
