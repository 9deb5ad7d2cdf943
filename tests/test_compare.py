"""benchmarks/compare_optimizers.py, offline against the simulated endpoint (with the simulated peers plugged in by
its ``offline_endpoint``) with a tiny budget."""

import os

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

import importlib.util
import math
import sys
from pathlib import Path

import dspy
import pytest

from dspy_opro.testing import answers_correctly, simulated_dataset, simulated_metric

SCRIPT = Path(__file__).parent.parent / "benchmarks" / "compare_optimizers.py"
EXPECTED = ["baseline", "opro", "copro", "miprov2", "gepa", "opro-hard-diverse", "opro-val-gate", "opro-label-free"]


@pytest.fixture(scope="module")
def compare():
    spec = importlib.util.spec_from_file_location("compare_optimizers", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_budget_plans_fit_the_budget(compare):
    for budget, n_train in ((40, 8), (200, 20), (400, 20), (1000, 50)):
        steps, candidates = compare.opro_plan(budget, n_train)
        assert n_train * (1 + steps * candidates) <= budget and 1 <= candidates <= 8
        breadth, depth = compare.copro_plan(budget, n_train)
        assert breadth >= 2 and breadth * depth * n_train <= budget
        plan = compare.mipro_plan(budget, n_train)
        assert plan["evaluations"] <= budget and plan["num_trials"] >= 1 and plan["num_candidates"] >= 2
    assert compare.mipro_plan(400, 80)["minibatch"] and compare.mipro_plan(400, 80)["evaluations"] <= 400


@pytest.mark.slow  # eight compiles, one per contender
def test_comparison_offline(compare, tmp_path):
    pytest.importorskip("optuna", reason="MIPROv2 needs the optional optuna dependency")
    data = simulated_dataset(16)
    out = tmp_path / "results"
    with compare.offline_endpoint() as endpoint:
        connection = {"api_base": endpoint.base_url, "api_key": "x", "engine": "litellm", "cache": False}
        task_lm = dspy.LM("openai/sim-task", **connection)
        prompt_lm = dspy.LM("openai/sim-optimizer", **connection)
        meter = compare.EndpointMeter(endpoint, "openai/sim-task", "openai/sim-optimizer")
        rows = compare.run_comparison(
            trainset=data[:8], valset=data[8:], task_lm=task_lm, prompt_lm=prompt_lm, meter=meter, budget=40,
            opro_variants=True, metric=simulated_metric, num_threads=4, out_dir=out)
        # the evaluations after the last compile reached the endpoint but are not in any row
        after_last_compile = endpoint.count(status=None)
    assert [row["name"] for row in rows] == EXPECTED
    # The simulator is deterministic: each contender's outcome is pinned, (train %, val %, optimizer calls, task
    # calls) at the endpoint, with the baseline's instruction where a variant kept it.
    outcomes = {row["name"]: (row["train"], row["val"], row["optimizer_calls"], row["task_calls"]) for row in rows}
    assert outcomes == {
        "baseline": (25.0, 25.0, 0, 0),
        "opro": (62.5, 37.5, 2, 40),  # 8 examples x (1 + 2 steps x 2 candidates): the budget of 40
        "copro": (62.5, 75.0, 2, 32),  # breadth 2 x depth 2 x 8 examples
        "miprov2": (37.5, 25.0, 11, 53),
        "gepa": (62.5, 50.0, 3, 42),
        "opro-hard-diverse": (25.0, 25.0, 2, 40),
        "opro-val-gate": (62.5, 37.5, 2, 40),
        "opro-label-free": (25.0, 25.0, 2, 40),
    }
    for row in rows:
        assert row["error"] is None and row["best_instruction"], row
        assert row["tokens"] == row["optimizer_tokens"] + row["task_tokens"]
        assert (row["tokens"] > 0) == (row["name"] != "baseline")
        # Scores from the simulator's answer key: the share of questions the saved instruction answers right.
        program = dspy.ChainOfThought("question -> answer")
        program.load(str(out / row["program"]))
        instruction = program.predict.signature.instructions
        for split, examples in (("train", data[:8]), ("val", data[8:])):
            right = sum(answers_correctly(instruction, example.question) for example in examples)
            assert row[split] == round(100 * right / len(examples), 1), (row["name"], split)
    assert rows[0]["best_instruction"] == "Given the fields `question`, produce the fields `answer`."
    assert rows[1]["best_instruction"] == "Please work step by step."
    assert after_last_compile == 2 + 40 + 16  # the last contender's compile, then 8 + 8 evaluations

    table = compare.markdown_table(rows)
    assert table.count("\n") == len(rows) + 1 and all(f"| {name} |" in table for name in EXPECTED)
    assert (out / "comparison.md").read_text().startswith(table)

    saved = compare.read_csv(out / "comparison.csv")
    assert [r["name"] for r in saved] == EXPECTED
    for row, line in zip(rows, saved, strict=True):
        assert set(line) == set(compare.FIELDS)
        assert math.isclose(float(line["train"]), row["train"]) and math.isclose(float(line["val"]), row["val"])
        for key in ("optimizer_calls", "task_calls", "tokens"):
            assert int(line[key]) == row[key]
        assert line["best_instruction"] == row["best_instruction"] and line["error"] == ""

    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "comparison.png").stat().st_size > 0


def test_failing_contender_is_reported_not_raised(compare, tmp_path):
    data = simulated_dataset(6)
    with compare.offline_endpoint() as endpoint:
        connection = {"api_base": endpoint.base_url, "api_key": "x", "engine": "litellm", "cache": False}
        task_lm = dspy.LM("openai/sim-task", **connection)
        prompt_lm = dspy.LM("openai/sim-optimizer", **connection)
        meter = compare.EndpointMeter(endpoint, "openai/sim-task", "openai/sim-optimizer")
        rows = compare.run_comparison(
            trainset=data[:3], valset=data[3:], task_lm=task_lm, prompt_lm=prompt_lm, meter=meter, budget=6,
            contenders=["baseline"], extras=["NoSuchOptimizer"], metric=simulated_metric, num_threads=2,
            out_dir=tmp_path)
    assert [row["name"] for row in rows] == ["baseline", "nosuchoptimizer"]
    assert rows[0]["error"] is None and rows[1]["train"] is None
    assert "NoSuchOptimizer" in rows[1]["error"] and "ERROR" in compare.markdown_table(rows)
    assert [r["name"] for r in compare.read_csv(tmp_path / "comparison.csv")] == ["baseline", "nosuchoptimizer"]
