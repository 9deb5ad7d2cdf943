"""The settings as DSPy's teleprompters show theirs (``get_params()``, attributes) and the ``auto`` presets: the
table of docs/method.md is the code's, a preset's steps and candidates reach the endpoint, explicit values win."""

import json
import re
from pathlib import Path

import dspy
import pytest

from dspy_opro import OPRO, Racing
from dspy_opro.core.settings import AUTO_PRESETS, RACING_STEPS, auto_plan, resolved_budget, resolved_search
from dspy_opro.testing import SimulatedEndpoint, simulated_dataset, simulated_metric

DOCS = Path(__file__).parent.parent / "docs"
OBJECTS = {"metric", "prompt_model", "task_model", "executor"}


def test_get_params_returns_every_setting_by_name_json_apart_from_the_objects():
    task = dspy.LM("openai/task-model")
    optimizer = OPRO(simulated_metric, task_model=task, prompt_model="openai/optimizer", num_steps=3,
                     racing=Racing(alpha=0.1), predictors=["predict"], initial_instructions=["Be exact."])
    params = optimizer.get_params()
    assert list(params) == OPRO.setting_names()
    assert params["metric"] is simulated_metric and params["task_model"] is task
    assert params["prompt_model"] == "openai/optimizer" and params["executor"] is None
    # num_candidates as given: None, which compile resolves to 8 (or an auto preset's).
    assert (params["num_steps"], params["num_candidates"], params["racing"], params["predictors"]) == (
        3, None, {"alpha": 0.1}, ["predict"])
    assert params["initial_instructions"] == ["Be exact."]
    rest = {name: value for name, value in params.items() if name not in OBJECTS}
    assert json.loads(json.dumps(rest)) == rest


def test_the_settings_read_as_attributes_and_a_value_set_afterwards_is_taken_and_checked_at_compile():
    optimizer = OPRO(simulated_metric, num_steps=4, top_k=2)
    assert (optimizer.num_steps, optimizer.num_candidates, optimizer.top_k, optimizer.auto) == (4, None, 2, None)
    assert optimizer.metric is simulated_metric
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        optimizer.nonsense  # noqa: B018
    with SimulatedEndpoint() as endpoint:
        optimizer.prompt_model = endpoint.lm("openai/sim-optimizer")
        optimizer.task_model = endpoint.lm("openai/sim-task")
        optimizer.num_steps, optimizer.num_candidates, optimizer.display_progress = 1, 2, False
        record = optimizer.compile(dspy.Predict("question -> answer"), trainset=simulated_dataset(5)).opro_run
        opro_requests = [r for r in endpoint.requests if r.kind == "opro"]
        assert (record.config["num_steps"], record.config["num_candidates"]) == (1, 2)
        assert len(opro_requests) == 1 and opro_requests[0].n == 2
        served = len(endpoint.requests)
        optimizer.num_steps = 5.0
        with pytest.raises(ValueError) as raised:
            optimizer.compile(dspy.Predict("question -> answer"), trainset=simulated_dataset(5))
        assert str(raised.value) == "num_steps must be an int >= 0 or None; got 5.0"
        assert len(endpoint.requests) == served  # refused before any LM call


def test_auto_is_checked_when_the_optimizer_is_made():
    with pytest.raises(ValueError, match="auto must be one of 'light', 'medium', 'heavy' or None; got 'huge'"):
        OPRO(simulated_metric, auto="huge")


def table_rows(text: str, heading: str) -> list[list[str]]:
    section = text[text.index(heading):]
    section = section[:section.find("\n## ", 1)] if "\n## " in section[1:] else section
    return [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("| ") and not line.startswith("| ---")][1:]


def test_the_presets_table_is_the_codes():
    rows = table_rows((DOCS / "method.md").read_text(encoding="utf-8"), "## Presets (`auto`)")
    assert [row[0] for row in rows] == [f'`"{name}"`' for name in AUTO_PRESETS]
    for row, (name, preset) in zip(rows, AUTO_PRESETS.items(), strict=True):
        assert row[1:4] == [str(preset.num_candidates), f"{preset.evaluations:,}",
                            f"{preset.min_steps}-{preset.max_steps}"]
        for cell, n_train in zip(row[4:], (20, 50, 200), strict=True):
            steps, candidates = auto_plan(name, n_train)
            found = re.fullmatch(r"(\d+) steps: ([\d,]+) program runs, (\d+) optimizer calls \(([\d,]+) without `n`\); "
                                 r"racing: up to (\d+) steps within them", cell)
            assert found, cell
            assert [int(group.replace(",", "")) for group in found.groups()] == [
                steps, n_train * (1 + steps * candidates), steps, steps * candidates, RACING_STEPS * steps]


def test_presets_scale_with_the_trainset_and_explicit_values_win():
    assert [auto_plan("medium", n) for n in (10, 20, 50, 1000)] == [(24, 8), (12, 8), (4, 8), (4, 8)]
    optimizer = OPRO(simulated_metric, auto="light", num_candidates=2, racing=False)
    assert (optimizer.num_steps, optimizer.num_candidates) == (None, 2)
    assert resolved_search(optimizer, 20) == ((400 // 20 - 1) // 4, 2)
    assert resolved_budget(optimizer, 20, 0) is None  # full evaluation: the steps are the budget
    assert optimizer.auto == "light" and (optimizer.num_steps, optimizer.num_candidates) == (None, 2)
    assert resolved_search(OPRO(simulated_metric, auto="heavy", num_steps=1), 20)[0] == 1


def test_a_preset_races_with_twice_the_steps_within_the_budget_of_full_evaluation():
    racing = OPRO(simulated_metric, auto="light")
    steps, candidates = auto_plan("light", 20)
    assert resolved_search(racing, 20) == (RACING_STEPS * steps, candidates)
    assert resolved_budget(racing, 20, 9) == 20 * (1 + steps * candidates) + 9  # validation runs included
    assert resolved_budget(OPRO(simulated_metric, auto="light", max_metric_calls=77), 20, 0) == 77
    explicit = OPRO(simulated_metric, auto="light", num_steps=3)  # explicit steps: no budget imposed
    assert resolved_search(explicit, 20)[0] == 3 and resolved_budget(explicit, 20, 0) is None
    assert resolved_budget(OPRO(simulated_metric, num_steps=3), 20, 0) is None  # no preset: the paper's default
    assert OPRO(simulated_metric).racing is None


def test_a_preset_reaches_the_endpoint_and_the_record():
    trainset = simulated_dataset(50, seed=2)
    with SimulatedEndpoint() as endpoint:
        optimizer = OPRO(simulated_metric, prompt_model=endpoint.lm("openai/sim-optimizer"),
                         task_model=endpoint.lm("openai/sim-task"), auto="light", num_threads=8,
                         display_progress=False, racing=False)
        compiled = optimizer.compile(dspy.Predict("question -> answer"), trainset=trainset)
        opro_requests = [r for r in endpoint.requests if r.kind == "opro"]
        task_calls = endpoint.count("task")
        endpoint.reset_log()
        optimizer.racing = None  # the default: the preset races
        raced = optimizer.compile(dspy.Predict("question -> answer"), trainset=trainset).opro_run
        raced_opro, raced_calls = [r for r in endpoint.requests if r.kind == "opro"], endpoint.count("task")
    steps, candidates = auto_plan("light", 50)
    assert (steps, candidates) == (2, 4)
    record = compiled.opro_run
    assert (record.config["auto"], record.config["num_steps"], record.config["num_candidates"]) == ("light", 2, 4)
    assert len(opro_requests) == steps and {r.n for r in opro_requests} == {candidates}
    assert task_calls == record.metric_calls == 50 * len(record.scored()) <= 50 * (1 + steps * candidates)
    assert optimizer.num_steps is None  # the optimizer keeps the preset; the run recorded what it resolved to
    # Racing: twice the steps, within the program runs of full evaluation; more candidates for the same bill.
    assert (raced.config["num_steps"], raced.config["racing"]) == (2 * steps, {"alpha": 0.05})
    assert raced_calls == raced.metric_calls <= 50 * (1 + steps * candidates)
    assert len(raced_opro) > steps and sum(c.step >= 0 and c.status in ("scored", "raced_out")
                                            for c in raced.candidates) >= steps * candidates
