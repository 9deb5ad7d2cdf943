"""Bad input fails before any LM call, with an error that names the fix."""

import dspy
import pytest

from dspy_opro import HardDiverse, OPROTeleprompter, PairwisePreference, Racing, ValGate
from tests.fakes import make_lm, toy_dataset, toy_metric, toy_task_reply


@pytest.fixture
def lm():
    return make_lm(toy_task_reply)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"metric": 3}, TypeError, "metric must be callable"),
        ({"prompt_model": 42}, TypeError, "prompt_model must be a dspy.LM or a LiteLLM model string"),
        ({"prompt_model": " "}, ValueError, "prompt_model is an empty string"),
        ({"task_model": 42}, TypeError, "task_model must be a dspy.LM or a LiteLLM model string"),
        ({"task_model": ""}, ValueError, "task_model is an empty string"),
        ({"metric": lambda example: 1.0}, TypeError, r"cannot be called as metric\(example, prediction\)"),
        ({"num_steps": -1}, ValueError, "num_steps must be an int >= 0"),
        ({"num_candidates": 0}, ValueError, "num_candidates must be an int >= 1"),
        ({"num_exemplars": 1.5}, ValueError, "num_exemplars must be an int >= 0"),
        ({"exemplar_selection": "hardest"}, ValueError, "exemplar_selection must be"),
        ({"exemplar_selection": "hard_diverse", "val_gate": 0.5}, ValueError, "val_gate must be a bool"),
        ({"num_score_buckets": 0}, ValueError, "num_score_buckets"),
        ({"instruction_pos": "before_Q"}, ValueError, "needs include_qa=True"),
        ({"instruction_pos": "A_begin", "include_qa": True}, ValueError, "cannot start the answer with a given text"),
        ({"instruction_pos": "A_begin"}, ValueError, "cannot start the answer with a given text"),
        ({"optimizer_family": "claude"}, ValueError, "optimizer_family"),
        ({"score_threshold": 2}, ValueError, "score_threshold"),
        ({"max_instruction_chars": 0}, ValueError, "max_instruction_chars must be an int >= 1"),
        ({"temperature": -0.5}, ValueError, "temperature must be a number"),
        ({"predictors": "self"}, TypeError, "predictors must be a non-empty list"),
        ({"select": "test"}, ValueError, "select must be one of 'auto', 'train', 'validation'"),
        ({"top_k": 0}, ValueError, "top_k must be an int >= 1"),
        ({"max_metric_calls": 0}, ValueError, "max_metric_calls must be an int >= 1"),
        ({"max_cost": -1.0}, ValueError, "max_cost must be a number"),
        ({"num_threads": 0}, ValueError, "num_threads must be an int >= 1"),
        ({"executor": object()}, TypeError, "executor must be a concurrent.futures.Executor"),
        ({"failure_score": 2.0}, ValueError, "failure_score must be a number in"),
        ({"metric": None}, ValueError, r"for label-free OPRO pass metric=dspy_opro.PairwisePreference\(judge_model"),
        ({"racing": Racing(), "val_gate": "yes"}, ValueError, "val_gate must be a bool"),
    ],
)
def test_constructor_checks(kwargs, error, message):
    args = {"metric": toy_metric, **kwargs}
    metric = args.pop("metric")
    with pytest.raises(error, match=message):
        OPROTeleprompter(metric, **args)


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: Racing(alpha=1.0), ValueError, r"Racing\(alpha=...\) must be a number in \(0.0, 1.0\)"),
        (lambda: HardDiverse(theta=1.2), ValueError, r"HardDiverse\(theta=...\) must be a number in \[0.0, 1.0\]"),
        (lambda: ValGate(min_delta=-0.1), ValueError, r"ValGate\(min_delta=...\) must be a number in \[0.0, 1.0\]"),
        (lambda: PairwisePreference(judge_model=7), TypeError, "judge_model must be a dspy.LM or a LiteLLM model"),
        (lambda: PairwisePreference(judge_model=" "), ValueError, "judge_model is an empty string"),
        (lambda: PairwisePreference(both_orders="yes"), ValueError, "both_orders must be a bool"),
    ],
)
def test_extension_options_are_checked_when_made(make, error, message):
    with pytest.raises(error, match=message):
        make()


@pytest.mark.parametrize(
    ("setup", "error", "message"),
    [
        (lambda: {"trainset": []}, ValueError, "trainset is empty"),
        (lambda: {"trainset": [dspy.Example(question="q", answer="a")]}, ValueError, r"with_inputs\('question'"),
        (lambda: {"trainset": [{"question": "q"}]}, TypeError, "not a dspy.Example"),
        (lambda: {"program": dspy.Module()}, ValueError, "the program has no predictors"),
        (lambda: {"predictors": ["nope"]}, ValueError, r"unknown predictors \['nope'\]; the program's predictors are"),
        (lambda: {"select": "validation"}, ValueError, "select='validation' needs a valset"),
        (lambda: {"val_gate": True}, ValueError, "val_gate=True needs a valset"),
        (lambda: {"num_exemplars": 9}, ValueError, "num_exemplars=9 exceeds the trainset size 6"),
        (lambda: {"no_task_model": True}, ValueError, "no task model: pass task_model="),
        (lambda: {"program": "not a module"}, TypeError, "needs a dspy.Module"),
    ],
)
def test_compile_checks_before_any_lm_call(lm, setup, error, message):
    task_lm, engine = lm
    options = setup()
    trainset = options.pop("trainset", toy_dataset(6))
    program = options.pop("program", dspy.Predict("question -> answer"))
    task_model = None if options.pop("no_task_model", False) else task_lm
    optimizer = OPROTeleprompter(toy_metric, prompt_model=task_lm, task_model=task_model, **options)
    with pytest.raises(error, match=message):
        optimizer.compile(program, trainset=trainset)
    assert engine.requests == []


def test_prompt_model_string_becomes_a_litellm_lm():
    from dspy_opro.core.settings import Models

    task_lm, _ = make_lm(toy_task_reply)
    lm = Models.resolve(OPROTeleprompter(toy_metric, prompt_model="openai/gpt-4o-mini", task_model=task_lm)).prompt
    assert isinstance(lm, dspy.LM) and lm.model == "openai/gpt-4o-mini" and lm.engine == "litellm"
