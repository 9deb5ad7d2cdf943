"""OPROConfig: validated once, frozen, and the only source of the recorded settings and the resume fingerprint."""

import dataclasses

import dspy
import pytest

from dspy_opro import OPROTeleprompter
from dspy_opro.config import CONTINUABLE_SETTINGS, Models, OPROConfig
from tests.fakes import make_lm, toy_dataset, toy_metric, toy_task_reply


def models() -> Models:
    lm, _ = make_lm(toy_task_reply, model="openai/fake-task")
    return Models(prompt=lm, task=lm, judge=None)


def test_the_teleprompter_holds_one_frozen_config():
    optimizer = OPROTeleprompter(toy_metric, num_steps=4, predictors=["predict"], log_dir=".")
    assert isinstance(optimizer.config, OPROConfig)
    assert (optimizer.config.num_steps, optimizer.config.predictors, optimizer.config.log_dir) == (4, ("predict",), ".")
    with pytest.raises(dataclasses.FrozenInstanceError):
        optimizer.config.num_steps = 5


@pytest.mark.parametrize("bad", [True, 1.0, -1])
def test_bools_and_floats_are_not_counts(bad):
    with pytest.raises(ValueError, match="num_steps must be an int >= 0"):
        OPROConfig(metric=toy_metric, num_steps=bad)


def test_recorded_settings_hold_the_budgets_and_the_resolved_models():
    config = OPROConfig(metric=toy_metric, max_metric_calls=50, max_cost=1.5)
    settings = config.recorded_settings(models(), ["predict"])
    assert (settings["max_metric_calls"], settings["max_cost"]) == (50, 1.5)
    assert (settings["task_model"], settings["prompt_model"], settings["judge_model"]) == (
        "openai/fake-task", "openai/fake-task", None)
    assert settings["targets"] == ["predict"] and settings["metric"].startswith("tests.fakes.toy_metric#")


def test_budgets_and_num_steps_stay_out_of_the_fingerprint():
    trainset, program = toy_dataset(3), dspy.Predict("question -> answer")
    prints = [OPROConfig(metric=toy_metric, **changes).fingerprint(models(), ["predict"], trainset=trainset,
                                                                   valset=[], program=program)
              for changes in ({}, {"num_steps": 20}, {"max_metric_calls": 9}, {"max_cost": 0.5})]
    assert len({p.config for p in prints}) == 1
    assert not set(CONTINUABLE_SETTINGS) & set(prints[0].settings)
    other = OPROConfig(metric=toy_metric, num_candidates=4).fingerprint(models(), ["predict"], trainset=trainset,
                                                                        valset=[], program=program)
    assert other.config != prints[0].config and other.settings["num_candidates"] == 4


def test_the_valset_counts_only_where_the_run_uses_it():
    trainset, valset, program = toy_dataset(3), toy_dataset(2), dspy.Predict("question -> answer")
    unused = OPROConfig(metric=toy_metric, select="train").fingerprint(models(), ["predict"], trainset=trainset,
                                                                       valset=valset, program=program)
    used = OPROConfig(metric=toy_metric, select="validation").fingerprint(models(), ["predict"], trainset=trainset,
                                                                          valset=valset, program=program)
    assert unused.valset == OPROConfig(metric=toy_metric).fingerprint(
        models(), ["predict"], trainset=trainset, valset=[], program=program).valset
    assert used.valset != unused.valset
    # select="auto" (the default) is select="validation" with a valset and select="train" without one, fingerprint
    # and all: a run resumes under the explicit setting it amounts to.
    auto = OPROConfig(metric=toy_metric)
    assert auto.fingerprint(models(), ["predict"], trainset=trainset, valset=valset, program=program) == used
    assert auto.fingerprint(models(), ["predict"], trainset=trainset, valset=[], program=program) == \
        OPROConfig(metric=toy_metric, select="train").fingerprint(models(), ["predict"], trainset=trainset,
                                                                  valset=[], program=program)


def test_resolve_models_turns_strings_into_litellm_lms_and_falls_back_to_settings():
    task, _ = make_lm(toy_task_reply)
    with dspy.context(lm=task):
        resolved = OPROConfig(metric=toy_metric, prompt_model="openai/gpt-4o-mini").resolve_models()
    assert resolved.task is task and resolved.prompt.model == "openai/gpt-4o-mini"
    assert resolved.prompt.engine == "litellm" and resolved.judge is None
    with pytest.raises(ValueError, match="no task model"):
        OPROConfig(metric=toy_metric).resolve_models()


def test_every_field_has_a_group_a_kind_and_a_sentence():
    for spec in dataclasses.fields(OPROConfig):
        assert spec.metadata["kind"] in ("search", "continuable", "execution"), spec.name
        assert spec.metadata["doc"].endswith((".", ")")) and len(spec.metadata["doc"]) > 20, spec.name


def test_recorded_and_fingerprinted_settings_follow_the_kinds():
    config = OPROConfig(metric=lambda example, prediction: 1.0)
    recorded = config.recorded_settings(models(), ["predict"])
    kinds = {spec.name: spec.metadata["kind"] for spec in dataclasses.fields(OPROConfig)}
    assert {name for name, kind in kinds.items() if kind != "execution"} <= set(recorded)
    assert not {name for name, kind in kinds.items() if kind == "execution"} & set(recorded)
    import dspy

    printed = config.fingerprint(models(), ["predict"], trainset=[], valset=[], program=dspy.Predict("q -> a"))
    assert not {name for name, kind in kinds.items() if kind != "search"} & set(printed.settings)


