"""The settings of OPROTeleprompter (dspy_opro.core.settings): plain attributes checked when the optimizer is made
and again at compile, and the only source of the recorded settings and the resume fingerprint."""

import inspect
import re

import dspy
import pytest

from dspy_opro import OPROTeleprompter
from dspy_opro.core.settings import (
    CONTINUABLE,
    EXECUTION,
    Models,
    fingerprint,
    recorded_settings,
    resolved_search,
    selection_policy,
)
from tests.fakes import make_lm, scripted_optimizer, toy_dataset, toy_metric, toy_task_reply

NAMES = OPROTeleprompter.setting_names()


def models() -> Models:
    lm, _ = make_lm(toy_task_reply, model="openai/fake-task")
    return Models(prompt=lm, task=lm, judge=None)


def recorded(opt: OPROTeleprompter, *, has_valset: bool = False) -> dict:
    """The settings a run of ``opt`` on 3 training examples records, resolved as compile resolves them."""
    steps, candidates = resolved_search(opt, 3)
    return recorded_settings(opt, NAMES, num_steps=steps, num_candidates=candidates, models=models(),
                             targets=["predict"], has_valset=has_valset)


def printed(opt: OPROTeleprompter, *, trainset, valset, program):
    """The fingerprint a run of ``opt`` has, the valset counted only where its selection uses it (as compile does)."""
    uses_valset = selection_policy(opt, has_valset=bool(valset)).uses_valset
    return fingerprint(recorded(opt, has_valset=bool(valset)), trainset=trainset, valset=valset,
                       uses_valset=uses_valset, program=program)


def test_the_settings_are_plain_attributes_settable_afterwards():
    optimizer = OPROTeleprompter(toy_metric, num_steps=4, predictors=["predict"], log_dir=".")
    assert (optimizer.num_steps, optimizer.predictors, optimizer.log_dir) == (4, ["predict"], ".")
    optimizer.num_steps = 5
    assert optimizer.num_steps == 5 and optimizer.get_params()["num_steps"] == 5


def test_a_bad_value_set_afterwards_is_refused_at_compile_before_any_lm_call():
    task_lm, task_engine = make_lm(toy_task_reply)
    opt_lm, opt_engine = make_lm(scripted_optimizer(["<INS>Better.</INS>"]))
    optimizer = OPROTeleprompter(toy_metric, prompt_model=opt_lm, task_model=task_lm, num_steps=1, num_candidates=1)
    optimizer.num_threads = 0  # taken: a plain attribute
    assert optimizer.num_threads == 0
    with pytest.raises(ValueError) as raised:
        optimizer.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(3))
    assert str(raised.value) == "num_threads must be an int >= 1 or None; got 0"
    assert task_engine.requests == [] and opt_engine.requests == []


@pytest.mark.parametrize("bad", [True, 1.0, -1])
def test_bools_and_floats_are_not_counts(bad):
    with pytest.raises(ValueError, match="num_steps must be an int >= 0"):
        OPROTeleprompter(toy_metric, num_steps=bad)


def test_recorded_settings_hold_the_budgets_and_the_resolved_models():
    settings = recorded(OPROTeleprompter(toy_metric, max_metric_calls=50, max_cost=1.5))
    assert (settings["max_metric_calls"], settings["max_cost"]) == (50, 1.5)
    assert (settings["num_steps"], settings["num_candidates"]) == (10, 8)  # None resolved to the authors' values
    assert (settings["task_model"], settings["prompt_model"], settings["judge_model"]) == (
        "openai/fake-task", "openai/fake-task", None)
    assert settings["targets"] == ["predict"] and settings["metric"].startswith("tests.fakes.toy_metric#")


def test_budgets_num_steps_and_max_errors_stay_out_of_the_fingerprint():
    trainset, program = toy_dataset(3), dspy.Predict("question -> answer")
    prints = [printed(OPROTeleprompter(toy_metric, **changes), trainset=trainset, valset=[], program=program)
              for changes in ({}, {"num_steps": 20}, {"max_metric_calls": 9}, {"max_cost": 0.5}, {"max_errors": 0},
                              {"max_errors": None})]
    assert len({p.config for p in prints}) == 1
    assert not set(CONTINUABLE) & set(prints[0].settings)
    other = printed(OPROTeleprompter(toy_metric, num_candidates=4), trainset=trainset, valset=[], program=program)
    assert other.config != prints[0].config and other.settings["num_candidates"] == 4


def test_the_valset_counts_only_where_the_run_uses_it():
    trainset, valset, program = toy_dataset(3), toy_dataset(2), dspy.Predict("question -> answer")
    unused = printed(OPROTeleprompter(toy_metric, select="train"), trainset=trainset, valset=valset, program=program)
    used = printed(OPROTeleprompter(toy_metric, select="validation"), trainset=trainset, valset=valset,
                   program=program)
    assert unused.valset == printed(OPROTeleprompter(toy_metric), trainset=trainset, valset=[],
                                    program=program).valset
    assert used.valset != unused.valset
    # select="auto" (the default) is select="validation" with a valset and select="train" without one, fingerprint
    # and all: a run resumes under the explicit setting it amounts to.
    auto = OPROTeleprompter(toy_metric)
    assert printed(auto, trainset=trainset, valset=valset, program=program) == used
    assert printed(auto, trainset=trainset, valset=[], program=program) == \
        printed(OPROTeleprompter(toy_metric, select="train"), trainset=trainset, valset=[], program=program)


def test_resolve_turns_strings_into_litellm_lms_and_falls_back_to_settings():
    task, _ = make_lm(toy_task_reply)
    with dspy.context(lm=task):
        resolved = Models.resolve(OPROTeleprompter(toy_metric, prompt_model="openai/gpt-4o-mini"))
    assert resolved.task is task and resolved.prompt.model == "openai/gpt-4o-mini"
    assert isinstance(resolved.prompt, dspy.LM) and resolved.prompt.engine == "litellm" and resolved.judge is None
    with pytest.raises(ValueError, match="no task model"):
        Models.resolve(OPROTeleprompter(toy_metric))


def documented_settings() -> list[tuple[str, str]]:
    """The ``Args:`` entries of OPROTeleprompter's docstring: ``(name, text)`` in order."""
    doc = inspect.getdoc(OPROTeleprompter)
    args = doc[doc.index("\nArgs:\n") + len("\nArgs:\n"):]
    entries = re.split(r"^    (?=\w+: )", args, flags=re.M)[1:]
    return [(entry.split(":", 1)[0], " ".join(entry.split(":", 1)[1].split())) for entry in entries]


def test_every_setting_has_a_kind_and_is_documented_once_in_the_docstring():
    assert NAMES[:3] == ["metric", "prompt_model", "task_model"] and NAMES[-1] == "track_stats"
    assert set(CONTINUABLE) <= set(NAMES) and set(EXECUTION) <= set(NAMES)
    assert not set(CONTINUABLE) & set(EXECUTION)
    documented = documented_settings()
    assert [name for name, _ in documented] == NAMES  # each once, in the signature's order
    for name, text in documented:
        assert text.endswith((".", ")")) and len(text) > 20, name


def test_recorded_and_fingerprinted_settings_follow_the_kinds():
    settings = recorded(OPROTeleprompter(lambda example, prediction: 1.0))
    assert {name for name in NAMES if name not in EXECUTION} <= set(settings)
    assert not set(EXECUTION) & set(settings)
    assert set(CONTINUABLE) <= set(settings)
    print_ = fingerprint(settings, trainset=[], valset=[], uses_valset=False, program=dspy.Predict("q -> a"))
    assert not (set(CONTINUABLE) | set(EXECUTION)) & set(print_.settings)
    assert {name for name in NAMES if name not in CONTINUABLE + EXECUTION} <= set(print_.settings)
