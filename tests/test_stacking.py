"""Optimizers stacked on OPRO's output and OPRO on theirs, for real, against the simulated endpoint.

OPRO's result is not marked compiled (as COPRO and MIPROv2 leave theirs), so BootstrapFewShot, MIPROv2 and OPRO
itself compile it again; OPRO compiles a BootstrapFewShot result and keeps its demos. Every count is the endpoint's.
"""

import dspy
import pytest

from benchmarks.simulated_peers import PEERS
from dspy_opro import OPRO
from dspy_opro.testing import SimulatedEndpoint, simulated_dataset, simulated_metric

TASK, OPTIMIZER = "openai/sim-task", "openai/sim-optimizer"
pytestmark = pytest.mark.compat  # the compatibility subset: stacking, on every DSPy 3.x CI installs


START = "Given the fields `question`, produce the fields `answer`."


@pytest.fixture
def endpoint():
    with SimulatedEndpoint(responders=PEERS) as server:
        yield server


def opro(endpoint, **settings) -> OPRO:
    options = {"num_steps": 1, "num_candidates": 2, "num_threads": 2, "display_progress": False, **settings}
    return OPRO(simulated_metric, prompt_model=endpoint.lm(OPTIMIZER), task_model=endpoint.lm(TASK), **options)


def task_calls(endpoint) -> int:
    return endpoint.count("task")


@pytest.mark.slow  # a compile, then another optimizer's
def test_opro_then_bootstrap_fewshot(endpoint):
    trainset = simulated_dataset(4, seed=3)
    first = opro(endpoint).compile(dspy.Predict("question -> answer"), trainset=trainset)
    assert getattr(first, "_compiled", False) is False
    with dspy.context(lm=endpoint.lm(TASK)):
        second = dspy.BootstrapFewShot(metric=simulated_metric, max_bootstrapped_demos=2, max_labeled_demos=2,
                                       max_rounds=1).compile(first, trainset=trainset)
    # OPRO's instruction is kept and BootstrapFewShot's demos are added to it.
    selected = first.opro_run.candidates[first.opro_run.selection.candidate_id]
    assert second.signature.instructions == first.signature.instructions == selected.instructions["self"]
    assert 1 <= len(second.demos) <= 2
    assert second._compiled is True


@pytest.mark.slow  # a compile, then another optimizer's
def test_bootstrap_fewshot_then_opro_keeps_the_demos(endpoint):
    trainset = simulated_dataset(4, seed=3)
    with dspy.context(lm=endpoint.lm(TASK)):
        first = dspy.BootstrapFewShot(metric=simulated_metric, max_bootstrapped_demos=2, max_labeled_demos=0,
                                      max_rounds=1).compile(dspy.Predict("question -> answer"), trainset=trainset)
    demos = [demo.toDict() for demo in first.demos]
    assert len(demos) == 2
    endpoint.reset_log()
    second = opro(endpoint).compile(first, trainset=trainset)
    assert [demo.toDict() for demo in second.demos] == demos
    # every scored candidate ran with the demos: each task request shows them (2 demos of 4 examples)
    scored = [c for c in second.opro_run.candidates if c.status == "scored"]
    assert task_calls(endpoint) == 4 * len(scored) == second.opro_run.metric_calls
    shown = demos[0]["question"]
    task_requests = [r for r in endpoint.requests if r.kind == "task"]
    assert all(shown in str(r.messages) for r in task_requests)


@pytest.mark.slow  # a compile, then another optimizer's
def test_opro_then_opro_continues_from_the_first_result(endpoint):
    trainset = simulated_dataset(4, seed=3)
    first = opro(endpoint).compile(dspy.Predict("question -> answer"), trainset=trainset)
    endpoint.reset_log()
    second = opro(endpoint, seed=1).compile(first, trainset=trainset)
    start = second.opro_run.candidates[0]
    assert start.instructions == {"self": first.signature.instructions}
    assert start.score == first.opro_run.best().score
    assert second.opro_run.best().score >= start.score
    assert task_calls(endpoint) == second.opro_run.metric_calls


@pytest.mark.slow  # a compile, then another optimizer's
def test_opro_then_miprov2_instructions_only(endpoint):
    pytest.importorskip("optuna", reason="MIPROv2 needs the optional optuna dependency")
    trainset = simulated_dataset(6, seed=3)
    first = opro(endpoint).compile(dspy.Predict("question -> answer"), trainset=trainset)
    endpoint.reset_log()
    mipro = dspy.MIPROv2(metric=simulated_metric, prompt_model=endpoint.lm(OPTIMIZER), task_model=endpoint.lm(TASK),
                         auto=None, num_candidates=2, max_bootstrapped_demos=0, max_labeled_demos=0, num_threads=2,
                         seed=9, verbose=False)
    with dspy.context(lm=endpoint.lm(TASK)):
        second = mipro.compile(first, trainset=trainset, valset=trainset, num_trials=2, minibatch=False)
    # MIPROv2's candidates include the program it was given: OPRO's instruction, which it proposes around.
    proposed = [str(r.messages) for r in endpoint.requests if r.kind == "mipro"]
    assert proposed and any(first.signature.instructions in text for text in proposed)
    assert isinstance(second.signature.instructions, str) and second.signature.instructions
    assert second.demos == []
