"""Tests for dspy_opro.extensions.judge: label-free scoring by pairwise self-preference (the fake LMs of
``tests/fakes.py``)."""

from __future__ import annotations

import logging
import math
import re

import dspy
import pytest
from dspy.utils.exceptions import LMError

from dspy_opro.extensions.judge import (
    Judgment,
    PairwiseJudge,
    clamp_preference,
    preference_to_score,
    render_inputs,
    render_trajectory,
)
from tests.fakes import make_lm, system_text, user_text

SECRET = "LABEL-SECRET-42"
CANDIDATE_MARK = "CANDIDATE-TRAJECTORY-MARK"
ANCHOR_MARK = "ANCHOR-TRAJECTORY-MARK"


def request_text(request) -> str:
    return system_text(request) + "\n" + "\n".join(message.text or "" for message in request.messages)


def judge_sections(request) -> tuple[str, str, str]:
    """(task_input, trajectory_a, trajectory_b) as the ChatAdapter laid them out in the judge's user message."""
    text = user_text(request)
    match = re.search(
        r"\[\[ ## task_input ## \]\]\n(.*)\n\n\[\[ ## trajectory_a ## \]\]\n(.*)\n\n\[\[ ## trajectory_b ## \]\]\n(.*)",
        text,
        re.DOTALL,
    )
    assert match, text
    return match.group(1), match.group(2), match.group(3)


def judge_reply(preference, rationale: str = "B handles the task better.") -> str:
    return f"[[ ## rationale ## ]]\n{rationale}\n\n[[ ## preference ## ]]\n{preference}\n\n[[ ## completed ## ]]"


def content_judge(in_b: int, in_a: int):
    """Answers ``in_b`` when the candidate is trajectory B and ``in_a`` when it is trajectory A."""

    def reply(request):
        _, a, b = judge_sections(request)
        if CANDIDATE_MARK in b:
            return judge_reply(in_b)
        assert CANDIDATE_MARK in a
        return judge_reply(in_a)

    return reply


# ---------------------------------------------------------------------------------------------------------------------
# PairwiseJudge


def test_one_order_judge_returns_its_preference_with_one_call():
    lm, engine = make_lm(lambda request: judge_reply(6))
    judgment = PairwiseJudge(lm).compare("question: q", ANCHOR_MARK, CANDIDATE_MARK)
    assert judgment == Judgment(preference=6.0, rationale="B handles the task better.", parsed=True, calls=1)
    assert len(engine.requests) == 1
    _, a, b = judge_sections(engine.requests[0])
    assert ANCHOR_MARK in a and CANDIDATE_MARK in b


def test_both_orders_cancels_a_judge_that_always_favours_position_b():
    lm, engine = make_lm(lambda request: judge_reply(6))
    judgment = PairwiseJudge(lm, both_orders=True).compare("question: q", ANCHOR_MARK, CANDIDATE_MARK)
    assert judgment.preference == 0.0
    assert judgment.parsed is True
    assert judgment.calls == 2
    assert len(engine.requests) == 2
    first_a, first_b = judge_sections(engine.requests[0])[1:]
    second_a, second_b = judge_sections(engine.requests[1])[1:]
    assert ANCHOR_MARK in first_a and CANDIDATE_MARK in first_b
    assert CANDIDATE_MARK in second_a and ANCHOR_MARK in second_b


def test_both_orders_keeps_a_preference_that_follows_the_content():
    lm, engine = make_lm(content_judge(in_b=6, in_a=-6))
    assert PairwiseJudge(lm).compare("question: q", ANCHOR_MARK, CANDIDATE_MARK).preference == 6.0
    judgment = PairwiseJudge(lm, both_orders=True).compare("question: q", ANCHOR_MARK, CANDIDATE_MARK)
    assert judgment.preference == 6.0
    assert judgment.calls == 2
    assert len(engine.requests) == 3


def test_both_orders_can_give_a_half_point():
    lm, _ = make_lm(content_judge(in_b=3, in_a=2))
    judgment = PairwiseJudge(lm, both_orders=True).compare("question: q", ANCHOR_MARK, CANDIDATE_MARK)
    assert judgment.preference == 0.5
    assert judgment.rationale.count("B handles the task better.") == 2


def test_out_of_range_preference_is_clamped():
    lm, _ = make_lm(lambda request: judge_reply(15))
    judgment = PairwiseJudge(lm).compare("question: q", ANCHOR_MARK, CANDIDATE_MARK)
    assert judgment.preference == 10.0 and judgment.parsed is True


def test_unparseable_judgment_counts_zero_and_warns(caplog):
    lm, engine = make_lm(lambda request: "I cannot decide which one is better.")
    with caplog.at_level(logging.WARNING, logger="dspy_opro.extensions.judge"):
        judgment = PairwiseJudge(lm).compare("question: q", ANCHOR_MARK, CANDIDATE_MARK)
    assert judgment.preference == 0.0
    assert judgment.parsed is False
    # The ChatAdapter retries an unparseable reply once through its JSONAdapter: both calls are counted.
    assert judgment.calls == len(engine.requests) == 2
    warnings = [r for r in caplog.records if r.name == "dspy_opro.extensions.judge" and r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "Unparseable" in warnings[0].getMessage()


def test_one_unparseable_order_counts_zero_for_that_order_only(caplog):
    def reply(request):
        _, a, b = judge_sections(request)
        return judge_reply(4) if CANDIDATE_MARK in b else "no idea"

    lm, engine = make_lm(reply)
    with caplog.at_level(logging.WARNING, logger="dspy_opro.extensions.judge"):
        judgment = PairwiseJudge(lm, both_orders=True).compare("question: q", ANCHOR_MARK, CANDIDATE_MARK)
    assert judgment.preference == 2.0  # (4 - 0) / 2
    assert judgment.parsed is False
    assert judgment.calls == len(engine.requests) == 3  # 1 + (1 + JSON fallback)
    assert any(r.levelno == logging.WARNING and r.name == "dspy_opro.extensions.judge" for r in caplog.records)


def test_lm_errors_propagate():
    def broken(request):
        raise RuntimeError("provider exploded")

    lm, _ = make_lm(broken)
    with pytest.raises(LMError):
        PairwiseJudge(lm).compare("question: q", ANCHOR_MARK, CANDIDATE_MARK)


def test_judge_without_lm_runs_on_the_task_model():
    task_lm, task_engine = make_lm(lambda request: judge_reply(-3))
    with dspy.context(lm=task_lm):
        judgment = PairwiseJudge().compare("question: q", ANCHOR_MARK, CANDIDATE_MARK)
    assert judgment.preference == -3.0
    assert len(task_engine.requests) == 1


def test_explicit_judge_lm_is_used_instead_of_the_task_model():
    task_lm, task_engine = make_lm(lambda request: judge_reply(-3))
    judge_lm, judge_engine = make_lm(lambda request: judge_reply(2))
    with dspy.context(lm=task_lm):
        judgment = PairwiseJudge(judge_lm).compare("question: q", ANCHOR_MARK, CANDIDATE_MARK)
    assert judgment.preference == 2.0
    assert len(task_engine.requests) == 0
    assert len(judge_engine.requests) == 1


def test_judge_prompt_contains_task_input_and_both_trajectories():
    lm, engine = make_lm(lambda request: judge_reply(1))
    task_input = "question: What is the capital of France?"
    anchor = f"Final outputs:\nanswer: Lyon {ANCHOR_MARK}"
    candidate = f"Final outputs:\nanswer: Paris {CANDIDATE_MARK}"
    PairwiseJudge(lm).compare(task_input, anchor, candidate)
    assert len(engine.requests) == 1
    sent_input, sent_a, sent_b = judge_sections(engine.requests[0])
    assert sent_input == task_input
    assert sent_a == anchor
    assert sent_b.startswith(candidate)
    system = request_text(engine.requests[0])
    assert "-10" in system and "+10" in system and "not length" in system


def test_judge_calls_stay_out_of_the_callers_trace():
    lm, _ = make_lm(lambda request: judge_reply(1))
    with dspy.context(trace=[]):
        PairwiseJudge(lm, both_orders=True).compare("question: q", ANCHOR_MARK, CANDIDATE_MARK)
        assert dspy.settings.trace == []


def test_rollout_id_reaches_the_judge_call():
    lm, engine = make_lm(lambda request: judge_reply(1))
    judgment = PairwiseJudge(lm).compare("question: q", ANCHOR_MARK, CANDIDATE_MARK, rollout_id=7)
    assert judgment.calls == len(engine.requests) == 1
    assert lm.history[-1]["kwargs"].get("rollout_id") == 7


# ---------------------------------------------------------------------------------------------------------------------
# clamp_preference / preference_to_score


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (15, (10.0, True)),
        (-12, (-10.0, True)),
        ("3", (3.0, True)),
        ("+3", (3.0, True)),
        (" -2.5 ", (-2.5, True)),
        (7, (7.0, True)),
        (0, (0.0, True)),
        ("abc", (0.0, False)),
        (float("nan"), (0.0, False)),
        (float("inf"), (0.0, False)),
        (None, (0.0, False)),
        (True, (0.0, False)),
    ],
)
def test_clamp_preference(value, expected):
    assert clamp_preference(value) == expected


def test_preference_to_score():
    assert preference_to_score(-10) == 0.0
    assert preference_to_score(0) == 0.5
    assert preference_to_score(10) == 1.0
    assert preference_to_score(5) == 0.75
    assert preference_to_score(12) == 1.0
    with pytest.raises(ValueError):
        preference_to_score(math.nan)


# ---------------------------------------------------------------------------------------------------------------------
# Rendering

LONG_OBSERVATION = "OBS-HEAD-" + "x" * 4982 + "-OBS-TAIL"
assert len(LONG_OBSERVATION) == 5000


def search(query: str) -> str:
    """Search the web."""
    return LONG_OBSERVATION


def react_reply(request) -> str:
    text = user_text(request)
    if "next_thought" in request_text(request):
        if "[[ ## observation_0 ## ]]" not in text:
            return (
                "[[ ## next_thought ## ]]\nI should search for the capital.\n\n"
                '[[ ## next_tool_name ## ]]\nsearch\n\n[[ ## next_tool_args ## ]]\n{"query": "capital of France"}\n\n'
                "[[ ## completed ## ]]"
            )
        return (
            "[[ ## next_thought ## ]]\nI have enough to answer.\n\n"
            "[[ ## next_tool_name ## ]]\nfinish\n\n[[ ## next_tool_args ## ]]\n{}\n\n[[ ## completed ## ]]"
        )
    return "[[ ## reasoning ## ]]\nThe search says Paris.\n\n[[ ## answer ## ]]\nParis\n\n[[ ## completed ## ]]"


@pytest.fixture
def react_run():
    example = dspy.Example(question="What is the capital of France?", answer=SECRET).with_inputs("question")
    lm, engine = make_lm(react_reply)
    agent = dspy.ReAct("question -> answer", tools=[search], max_iters=5)
    with dspy.context(lm=lm):
        prediction = agent(**example.inputs())
    assert len(engine.requests) == 3  # two ReAct steps and the extraction
    return example, prediction


def test_render_inputs_shows_only_inputs():
    example = dspy.Example(question="What is the capital of France?", answer=SECRET).with_inputs("question")
    assert render_inputs(example) == "question: What is the capital of France?"
    multi = dspy.Example(context="ctx", question="q?", answer=SECRET).with_inputs("context", "question")
    assert render_inputs(multi) == "context: ctx\nquestion: q?"
    with pytest.raises(ValueError):
        render_inputs(dspy.Example(question="q", answer=SECRET))


def test_render_react_trajectory(react_run):
    example, prediction = react_run
    rendered = render_trajectory(prediction, label_fields=("answer",))
    expected_order = [
        "Step 1",
        "Thought: I should search for the capital.",
        "Tool: search",
        'Arguments: {"query": "capital of France"}',
        "Observation: OBS-HEAD-",
        "-OBS-TAIL",
        "Step 2",
        "Thought: I have enough to answer.",
        "Tool: finish",
        "Arguments: {}",
        "Observation: Completed.",
        "Final outputs:",
        "reasoning: The search says Paris.",
        "answer: Paris",
    ]
    positions = [rendered.index(piece) for piece in expected_order]
    assert positions == sorted(positions), rendered
    # The long observation is cut head and tail to at most 600 characters, reporting what it omitted.
    observation_line = next(line for line in rendered.splitlines() if line.startswith("Observation: OBS-HEAD-"))
    observation = observation_line[len("Observation: ") :]
    assert len(observation) <= 600
    omitted = int(re.search(r" … \[(\d+) chars omitted\] … ", observation).group(1))
    visible = len(observation) - len(f" … [{omitted} chars omitted] … ")
    assert visible + omitted == 5000
    assert observation.endswith("-OBS-TAIL")
    assert "trajectory" not in rendered
    assert SECRET not in rendered
    assert SECRET not in render_inputs(example)


def test_labels_never_reach_the_judge(react_run):
    example, prediction = react_run
    task_input = render_inputs(example)
    candidate = render_trajectory(prediction, label_fields=example.labels().keys())
    anchor = render_trajectory(dspy.Prediction(answer="Lyon"), label_fields=example.labels().keys())
    lm, engine = make_lm(content_judge(in_b=5, in_a=-5))
    judgment = PairwiseJudge(lm, both_orders=True).compare(task_input, anchor, candidate + f"\n{CANDIDATE_MARK}")
    assert judgment.preference == 5.0
    assert len(engine.requests) == 2
    for request in engine.requests:
        text = request_text(request)
        assert SECRET not in text
        assert "What is the capital of France?" in text
        assert "Thought: I should search for the capital." in text


def test_render_chain_of_thought_trace():
    lm, _ = make_lm(
        lambda request: (
            "[[ ## reasoning ## ]]\nFrance's capital is Paris.\n\n[[ ## answer ## ]]\nParis\n\n[[ ## completed ## ]]"
        )
    )
    program = dspy.ChainOfThought("question -> answer")
    with dspy.context(lm=lm, trace=[]):
        prediction = program(question="What is the capital of France?")
        trace = list(dspy.settings.trace)
    assert len(trace) == 1
    rendered = render_trajectory(prediction, trace)
    assert rendered == (
        "Step 1 (question -> reasoning, answer)\n"
        "Inputs:\n"
        "question: What is the capital of France?\n"
        "Outputs:\n"
        "reasoning: France's capital is Paris.\n"
        "answer: Paris"
    )
    # Without a trace, the prediction's fields.
    assert render_trajectory(prediction) == "Final outputs:\nreasoning: France's capital is Paris.\nanswer: Paris"


def test_render_multi_step_trace_withholds_label_named_inputs_but_shows_outputs():
    def reply(request):
        text = request_text(request)
        if "`verdict`" in text:
            return "[[ ## verdict ## ]]\nconsistent\n\n[[ ## completed ## ]]"
        return "[[ ## answer ## ]]\nParis\n\n[[ ## completed ## ]]"

    lm, _ = make_lm(reply)
    answer = dspy.Predict("question -> answer")
    check = dspy.Predict("question, answer -> verdict")
    with dspy.context(lm=lm, trace=[]):
        first = answer(question="q?")
        # A misbuilt program that hands the dataset's label to a predictor input.
        final = check(question="q?", answer=SECRET)
        trace = list(dspy.settings.trace)
    assert first.answer == "Paris"
    rendered = render_trajectory(final, trace, label_fields=("answer",))
    assert SECRET not in rendered
    assert "Step 1 (question -> answer)" in rendered and "answer: Paris" in rendered  # the program's own output
    assert "Step 2 (question, answer -> verdict)" in rendered and "verdict: consistent" in rendered
    assert "Final outputs:" not in rendered  # identical to the last step's outputs


def test_render_failure():
    assert render_trajectory(ValueError("boom")) == "The program failed: ValueError: boom"
    lm, _ = make_lm(lambda request: "[[ ## answer ## ]]\nParis\n\n[[ ## completed ## ]]")
    with dspy.context(lm=lm, trace=[]):
        dspy.Predict("question -> answer")(question="q?")
        trace = list(dspy.settings.trace)
    rendered = render_trajectory(RuntimeError("second stage crashed"), trace)
    assert rendered.startswith("Step 1 (question -> answer)")
    assert rendered.endswith("\n\nThe program failed: RuntimeError: second stage crashed")


def test_render_truncates_the_whole_rendering_head_and_tail():
    long_answer = "START-" + "y" * 10_000 + "-END"
    rendered = render_trajectory(dspy.Prediction(answer=long_answer), max_chars=300)
    assert len(rendered) <= 300
    assert rendered.startswith("Final outputs:\nanswer: START-")
    assert rendered.endswith("-END")
    omitted = int(re.search(r"\[(\d+) chars omitted\]", rendered).group(1))
    full = len("Final outputs:\nanswer: ") + len(long_answer)
    assert len(rendered) - len(f" … [{omitted} chars omitted] … ") + omitted == full


def test_render_non_prediction_output():
    assert render_trajectory("just a string") == "Final output:\njust a string"
    assert render_trajectory({"answer": 42, "items": [1, 2]}) == "Final outputs:\nanswer: 42\nitems: [1, 2]"
