"""MLflow's DSPy autolog, for real, on a local sqlite tracking store: a nested run per scored candidate with its
score, the score history on the compile's run, the settings as parameters, whatever the import order.

Each test runs in a fresh interpreter (``autolog()`` patches classes process-wide, and one test must call it before
``dspy_opro`` is imported); the interpreter prints what MLflow stored, read back through ``MlflowClient``, and the run
record and endpoint log it is checked against.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("mlflow", reason="the mlflow extra (mlflow-skinny) is not installed")

pytestmark = pytest.mark.compat  # the compatibility subset: MLflow autolog, on every DSPy 3.x CI installs


ROOT = Path(__file__).parent.parent

SCRIPT = """
import json, sys
{first}
import dspy
from mlflow.tracking import MlflowClient
from dspy_opro.testing import SimulatedEndpoint, simulated_dataset, simulated_metric

mlflow.set_tracking_uri(sys.argv[1])
mlflow.set_experiment("opro")
with SimulatedEndpoint() as endpoint:
    optimizer = OPRO(simulated_metric, prompt_model=endpoint.lm("openai/sim-optimizer"),
                     task_model=endpoint.lm("openai/sim-task"), num_steps=2, num_candidates=2, num_threads=2,
                     display_progress=False, select="validation", top_k=2)
    with dspy.context(lm=endpoint.lm("openai/sim-task")):
        compiled = optimizer.compile(dspy.Predict("question -> answer"), trainset=simulated_dataset(4),
                                     valset=simulated_dataset(3, seed=5))
    task_calls = endpoint.count("task")
client = MlflowClient()
experiment = client.get_experiment_by_name("opro")
runs = client.search_runs([experiment.experiment_id])
parent = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
record = compiled.opro_run
print(json.dumps({{
    "parents": len(parent),
    "parent_params": parent[0].data.params if parent else {{}},
    "children": sorted([r.info.run_name, r.data.metrics.get("eval"), r.data.tags["mlflow.parentRunId"]
                        == parent[0].info.run_id] for r in children),
    "history": [m.value for m in client.get_metric_history(parent[0].info.run_id, "eval")] if parent else [],
    "val_history": [m.value for m in client.get_metric_history(parent[0].info.run_id, "eval_val")] if parent else [],
    "scored": [round(100 * c.score, 2) for c in record.candidates if c.status == "scored"],
    "val_scored": [round(100 * c.val_score, 2) for c in record.candidates if c.val_score is not None],
    "task_calls": task_calls, "metric_calls": record.metric_calls,
}}))
"""

AUTOLOG = 'mlflow.dspy.autolog(log_compiles=True, log_evals=True, log_traces=False)'
IMPORT_DSPY_OPRO = "from dspy_opro import OPRO"


def run_script(tmp_path: Path, first: str) -> dict:
    script = tmp_path / "autolog_run.py"
    script.write_text(textwrap.dedent(SCRIPT.format(first=first)), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "MLFLOW_TRACKING_URI": "", "MLFLOW_ENABLE_ASYNC_LOGGING": "false", "MLFLOW_DISABLE_TELEMETRY": "true",
           "DO_NOT_TRACK": "true"}
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = subprocess.run([sys.executable, str(script), uri], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def check(stored: dict) -> None:
    # One run for the compile, one nested run per scored candidate (training) and per validation scoring.
    assert stored["parents"] == 1
    train_children = [c for c in stored["children"] if c[0].startswith("eval_") and not c[0].startswith("eval_val")]
    val_children = [c for c in stored["children"] if c[0].startswith("eval_val_")]
    assert len(train_children) == len(stored["scored"]) >= 2
    assert len(val_children) == len(stored["val_scored"]) == 2
    assert len(stored["children"]) == len(train_children) + len(val_children)
    assert all(is_nested for *_, is_nested in stored["children"])
    # Each nested run holds its candidate's score (DSPy's 0-100 scale), the compile's run the history, in order.
    assert sorted(score for _, score, _ in train_children) == sorted(stored["scored"])
    assert stored["history"] == stored["scored"]
    assert stored["val_history"] == stored["val_scored"]
    # The settings are parameters, by name.
    params = stored["parent_params"]
    assert (params["num_steps"], params["num_candidates"], params["select"], params["top_k"]) == ("2", "2",
                                                                                                   "validation", "2")
    assert params["metric"] == "simulated_metric" and params["task_model"] == "openai/sim-task"
    assert params["auto"] == "None" and params["track_stats"] == "False"
    assert stored["task_calls"] == stored["metric_calls"]


@pytest.mark.slow  # a fresh interpreter with MLflow
def test_autolog_then_import(tmp_path):
    check(run_script(tmp_path, f"import mlflow\nimport mlflow.dspy\n{AUTOLOG}\n{IMPORT_DSPY_OPRO}"))


@pytest.mark.slow  # a fresh interpreter with MLflow
def test_import_then_autolog(tmp_path):
    check(run_script(tmp_path, f"import mlflow\nimport mlflow.dspy\n{IMPORT_DSPY_OPRO}\n{AUTOLOG}"))


TRACED_SCRIPT = """
import json, sys
import mlflow, mlflow.dspy
mlflow.dspy.autolog(log_compiles=True, log_evals=True, log_traces=True, log_traces_from_compile=True)
import dspy
from mlflow.tracking import MlflowClient
from dspy_opro import OPRO
from dspy_opro.testing import SimulatedEndpoint, simulated_dataset, simulated_metric

mlflow.set_tracking_uri(sys.argv[1])
mlflow.set_experiment("opro")
with SimulatedEndpoint() as endpoint:
    optimizer = OPRO(simulated_metric, prompt_model=endpoint.lm("openai/sim-optimizer"),
                     task_model=endpoint.lm("openai/sim-task"), num_steps=1, num_candidates=3, num_threads=2,
                     display_progress=False)  # 2 places for 3 examples: a candidate's third run would start late
    compiled = optimizer.compile(dspy.Predict("question -> answer"), trainset=simulated_dataset(3))
client = MlflowClient()
experiment = client.get_experiment_by_name("opro")
children = {}
for run in client.search_runs([experiment.experiment_id]):
    if "mlflow.parentRunId" not in run.data.tags:
        continue
    traces = mlflow.search_traces(experiment_ids=[experiment.experiment_id], run_id=run.info.run_id,
                                  return_type="list")
    table = json.loads(open(client.download_artifacts(run.info.run_id, "result_table.json")).read())
    program = json.loads(open(client.download_artifacts(run.info.run_id, "model.json")).read())
    instruction = program["signature"]["instructions"]  # the candidate this run evaluated (a dspy.Predict)
    children[run.info.run_name] = {
        "traces": len(traces), "rows": len(table["data"]), "score": run.data.metrics.get("eval"),
        "own": all(instruction in json.dumps([span.inputs for span in t.data.spans], default=str) for t in traces)}
record = compiled.opro_run
print(json.dumps({"children": children,
                  "scored": [round(100 * c.score, 2) for c in record.candidates if c.status == "scored"]}))
"""


@pytest.mark.slow  # a fresh interpreter with MLflow
def test_each_candidates_nested_run_holds_its_own_traces_and_predictions_table(tmp_path):
    """With traces on (``log_traces_from_compile=True``), MLflow gives a trace to the latest run started in any
    thread: the candidates of a round are then evaluated one after the other, so that each ``eval_N`` run holds the
    traces of its own candidate's program runs, one per example, and its predictions table, as COPRO's do."""
    pytest.importorskip("pandas", reason="MLflow's tables need pandas")
    script = tmp_path / "traced_run.py"
    script.write_text(textwrap.dedent(TRACED_SCRIPT), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True", "MLFLOW_TRACKING_URI": "",
           "MLFLOW_ENABLE_ASYNC_LOGGING": "false", "MLFLOW_ENABLE_ASYNC_TRACE_LOGGING": "false",
           "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}
    done = subprocess.run([sys.executable, str(script), f"sqlite:///{tmp_path / 'mlflow.db'}"], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    stored = json.loads(done.stdout.strip().splitlines()[-1])
    children = stored["children"]
    assert sorted(children) == [f"eval_{n}" for n in range(len(stored["scored"]))] and len(children) >= 3
    assert all((child["traces"], child["rows"], child["own"]) == (3, 3, True) for child in children.values())
    assert sorted(child["score"] for child in children.values()) == sorted(stored["scored"])
