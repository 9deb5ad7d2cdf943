"""The progress bar is DSPy's own (one per ``dspy.Evaluate`` call, that is per candidate's evaluation), the display
switch shapes no result, and the line that announces LiteLLM's import."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import dspy
import pytest

from dspy_opro import OPROTeleprompter
from dspy_opro.record.observers import import_litellm_announced
from tests.fakes import make_lm, scripted_optimizer, toy_dataset, toy_metric, toy_task_reply

STEP0 = ["<INS>Do better.</INS>", "<INS>Be better and better.</INS>"]  # training 16.7 and 33.3


def compile_toy(**options):
    task_lm, _ = make_lm(toy_task_reply)
    opt_lm, _ = make_lm(scripted_optimizer(STEP0), model="openai/opt")
    # One thread: the two single-choice optimizer requests (a custom engine is not known to take n) go in sample
    # order, so that the scripted replies become candidates 1 and 2 in order; a round's two evaluation calls still
    # run at once, sharing the one place, each with its bar.
    optimizer = OPROTeleprompter(toy_metric, prompt_model=opt_lm, task_model=task_lm, num_steps=1, num_candidates=2,
                                 num_exemplars=1, num_threads=1, **options)
    return optimizer.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(6))


def final_bars(text: str) -> list[str]:
    """The full rendering of each bar (``Average Metric: 1.00 / 6 (16.7%)``), in the order the bars filled: a
    round's candidates are evaluated at once, a bar each on its own line."""
    return re.findall(r"(Average Metric: [\d.]+ / \d+ \([\d.]+%\)): 100%", text)


@pytest.fixture
def terminal(monkeypatch):
    """As on a console: DSPy's bars show (captured standard output is not a terminal)."""
    monkeypatch.setattr("dspy_opro.scoring.scorer.shows_bars", lambda: True)


def test_each_candidates_evaluation_shows_dspys_bar_with_its_score(capsys, terminal):
    run = compile_toy().opro_run
    bars = final_bars(capsys.readouterr().out)
    assert [c.score for c in run.candidates] == [0.0, 1 / 6, 2 / 6]
    assert bars[0] == "Average Metric: 0.00 / 6 (0.0%)"  # the start, alone in its round
    assert sorted(bars[1:]) == ["Average Metric: 1.00 / 6 (16.7%)", "Average Metric: 2.00 / 6 (33.3%)"]


def test_no_bar_goes_to_a_file_or_pipe(capsys):
    compile_toy()
    assert "Average Metric" not in capsys.readouterr().out


def test_display_progress_false_shows_no_bar_and_shapes_no_result(capsys, terminal):
    shown = compile_toy().opro_run
    capsys.readouterr()
    hidden = compile_toy(display_progress=False).opro_run
    assert "Average Metric" not in capsys.readouterr().out
    assert shown.fingerprint == hidden.fingerprint and shown.config == hidden.config
    assert [c.scores for c in shown.candidates] == [c.scores for c in hidden.candidates]
    with pytest.raises(ValueError, match="display_progress must be a bool"):
        OPROTeleprompter(toy_metric, display_progress="yes")


def test_no_litellm_import_for_models_on_other_engines(monkeypatch, caplog):
    monkeypatch.delitem(sys.modules, "litellm", raising=False)
    lm, _ = make_lm(toy_task_reply)
    with caplog.at_level(logging.INFO, logger="dspy_opro.record.observers"):
        assert import_litellm_announced([("optimizer", lm), ("task", lm), ("judge", None)]) is False
    assert "litellm" not in sys.modules
    assert caplog.records == []


_LITELLM_PROBE = """
import json, logging, sys
import dspy
from dspy_opro import OPROTeleprompter
from dspy_opro.testing import SimulatedEndpoint, simulated_dataset, simulated_metric

seen = []

class Keep(logging.Handler):
    def emit(self, record):
        seen.append([record.getMessage(), "litellm" in sys.modules])

logging.getLogger("dspy_opro").addHandler(Keep())
logging.getLogger("dspy_opro").setLevel(logging.INFO)  # a logger configured by the user: its level is theirs
with SimulatedEndpoint() as endpoint:
    for _ in range(2):
        OPROTeleprompter(simulated_metric, prompt_model=endpoint.lm("openai/simulated-optimizer"),
                         task_model=endpoint.lm("openai/simulated-task"), num_steps=0).compile(
            dspy.Predict("question -> answer"), trainset=simulated_dataset(3))
        seen.append(["-- compiled --", True])
print(json.dumps(seen))
"""


@pytest.mark.slow
@pytest.mark.skipif(dspy.__version__ < "3.4", reason="DSPy before 3.4 imports LiteLLM with itself")
def test_litellm_import_is_announced_once_before_it_happens():
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True",
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(_LITELLM_PROBE)], env=env, check=True,
                         capture_output=True, text=True)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    importing = [i for i, (message, _) in enumerate(seen) if message.startswith("Importing LiteLLM")]
    assert importing == [0]  # the first line of the first run, and not again
    assert seen[0] == ["Importing LiteLLM for the optimizer model 'openai/simulated-optimizer' and the task model "
                       "'openai/simulated-task' (its first use in this process takes a few seconds)", False]
    assert seen[1][0].startswith("OPRO: 0 steps") and seen[1][1] is True  # imported by the time the run announces
    assert [message for message, _ in seen].count("-- compiled --") == 2
