"""The plan a run logs before its first LM call, and ``estimate``, against what the endpoint then served."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import dspy
import pytest

from dspy_opro import OPROTeleprompter
from dspy_opro.core.plan import OPTIMIZER_COMPLETION_TOKENS, OPTIMIZER_PROMPT_TOKENS, RunPlan
from tests.fakes import make_lm, scripted_optimizer, toy_dataset, toy_metric, toy_task_reply

DATA = Path(__file__).resolve().parent.parent / "examples" / "data" / "word_problems.jsonl"


def quickstart_problems() -> list[dspy.Example]:
    rows = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [dspy.Example(question=row["question"], answer=row["answer"]).with_inputs("question") for row in rows]


def exact_integer(example, prediction, trace=None):
    import re

    match = re.search(r"-?\d+", str(prediction.answer).replace(",", ""))
    return float(match is not None and match.group(0) == example.answer)


def test_estimate_spends_nothing_and_counts_what_a_custom_engine_is_sent():
    task_lm, task_engine = make_lm(toy_task_reply)
    replies = ["<INS>Better better.</INS>", "<INS>Better better better.</INS>", "<INS>Better.</INS>",
               "<INS>Be better better better better.</INS>"]
    opt_lm, opt_engine = make_lm(scripted_optimizer(replies))
    optimizer = OPROTeleprompter(toy_metric, prompt_model=opt_lm, task_model=task_lm, num_steps=2, num_candidates=2,
                                 num_threads=1, initial_instructions=["Better."])
    plan = optimizer.estimate(dspy.Predict("question -> answer"), toy_dataset(5), toy_dataset(3, prefix="val"))
    assert len(task_engine.requests) == 0 and len(opt_engine.requests) == 0
    # A custom engine is not known to take n: one single-choice request per candidate.
    assert (plan.optimizer_requests, plan.honours_n) == (4, False)
    # 5 x (start + 1 initial + 2 steps x 2 candidates) on training, the top 3 on 3 validation examples.
    assert (plan.train_evaluations, plan.validation_evaluations, plan.evaluations) == (30, 9, 39)
    assert plan.selected_on == "validation" and plan.cost is None
    assert plan.describe() == (
        "OPRO plan: 4 optimizer requests (2 single-choice requests per step: 'openai/fake' is not known to honour n); "
        "at most 39 program runs with the metric (30 on training, 9 on validation); selection on validation")
    compiled = optimizer.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(5),
                                 valset=toy_dataset(3, prefix="val"))
    # "Better." repeats the initial instruction in step 1: a duplicate, never run; the rest ran as planned.
    assert len(opt_engine.requests) == plan.optimizer_requests
    assert len(task_engine.requests) == compiled.opro_run.metric_calls == plan.evaluations - 5


def test_a_budget_caps_the_planned_evaluations_and_the_cost_states_its_assumption():
    optimizer = OPROTeleprompter(toy_metric, prompt_model="openai/gpt-4o-mini", task_model="openai/gpt-4o-mini",
                                 num_steps=3, num_candidates=4, max_metric_calls=50)
    plan = optimizer.estimate(dspy.Predict("question -> answer"), toy_dataset(10), tokens_per_evaluation=(200, 20))
    assert (plan.optimizer_requests, plan.honours_n) == (3, True)  # OpenAI on LiteLLM takes n
    assert (plan.train_evaluations, plan.evaluations, plan.selected_on) == (130, 50, "train")
    prompt_price, completion_price = 0.15e-6, 0.6e-6  # gpt-4o-mini in the price map DSPy ships
    expected = (3 * OPTIMIZER_PROMPT_TOKENS * prompt_price + 12 * OPTIMIZER_COMPLETION_TOKENS * completion_price
                + 50 * (200 * prompt_price + 20 * completion_price))
    assert plan.cost == pytest.approx(expected)
    assert plan.describe_cost() == (
        f"OPRO cost estimate: about ${expected:.4f} (200 prompt and 20 completion tokens per evaluation (stated); "
        "1000 prompt tokens per optimizer request and 150 completion tokens per choice (assumed); every planned "
        "evaluation run)")
    assert plan.describe() == (
        "OPRO plan: 3 optimizer requests (one per step asking n=4); at most 50 program runs with the metric (130 on "
        f"training, 0 on validation); selection on training; about ${expected:.4f} ({plan.cost_assumption})")
    unpriced = optimizer.estimate(dspy.Predict("question -> answer"), toy_dataset(10))
    assert unpriced.cost is None and "pass tokens_per_evaluation=(prompt, completion)" in unpriced.cost_assumption
    assert "$" not in unpriced.describe()


def test_estimate_refuses_what_compile_refuses():
    optimizer = OPROTeleprompter(toy_metric, prompt_model="openai/gpt-4o-mini")
    with pytest.raises(TypeError, match="trainset is None"):
        optimizer.estimate(dspy.Predict("question -> answer"), None)  # type: ignore[arg-type]


@pytest.mark.slow
def test_the_quickstarts_plan_line_is_what_the_endpoint_then_served(caplog):
    """The quickstart's program and settings (2 steps x 3 candidates, 20 training and 20 validation problems)
    through LiteLLM to the simulated endpoint: the plan logged before the first call against the endpoint's log."""
    from dspy_opro.testing import SimulatedEndpoint

    problems = quickstart_problems()
    with SimulatedEndpoint() as endpoint:
        optimizer = OPROTeleprompter(exact_integer, prompt_model=endpoint.lm("openai/simulated-optimizer"),
                                     task_model=endpoint.lm("openai/simulated-task"), num_steps=2, num_candidates=3,
                                     num_threads=4, display_progress=False)
        program = dspy.ChainOfThought("question -> answer")
        plan = optimizer.estimate(program, problems[:20], problems[20:40])
        assert endpoint.count(status=None) == 0
        with caplog.at_level(logging.INFO, logger="dspy_opro"):
            compiled = optimizer.compile(program, trainset=problems[:20], valset=problems[20:40])
        run = compiled.opro_run
        assert isinstance(plan, RunPlan) and plan.describe() in caplog.messages
        assert plan.describe() == (
            "OPRO plan: 2 optimizer requests (one per step asking n=3); at most 200 program runs with the metric "
            "(140 on training, 60 on validation); selection on validation")
        assert endpoint.count("opro") == plan.optimizer_requests
        # Every planned evaluation ran but those of replies that were duplicates or skipped (never scored).
        unscored_replies = sum(1 for step in run.steps for reply in step.replies if reply.fate != "new")
        assert endpoint.count("task") == run.metric_calls == plan.evaluations - 20 * unscored_replies
        assert any(message.startswith("OPRO cost estimate: unknown (no known price for") for message in
                   caplog.messages)
