"""``import dspy_opro`` stays cheap: it pulls in no heavy package on top of ``import dspy``; a compile whose models
are custom engines never imports LiteLLM."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

_PROBE = """
import json, sys
import dspy
before = set(sys.modules)
import dspy_opro
from dspy_opro import OPRO, OPROTeleprompter, RunState
print(json.dumps(sorted(set(sys.modules) - before)))
"""


@pytest.mark.slow  # a fresh interpreter
def test_import_adds_no_heavy_package():
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, check=True, capture_output=True, text=True)
    added = json.loads(out.stdout.strip().splitlines()[-1])
    assert {name.split(".")[0] for name in added} == {"dspy_opro"}  # no numpy, litellm, matplotlib, tqdm, ...
    # The run, the extensions and the test server load when a compile (or a test) needs them.
    assert [name for name in added if name == "dspy_opro.core.run" or name.startswith(("dspy_opro.extensions.",
                                                                                   "dspy_opro.testing"))] == []


_COMPILE_PROBE = """
import json, sys
import dspy
from dspy_opro import OPROTeleprompter
from tests.fakes import make_lm, toy_dataset, toy_metric, toy_task_reply

task_lm, _ = make_lm(toy_task_reply, model="openai/gpt-4o-mini")  # priced: the price map is read
opt_lm, _ = make_lm(lambda request, n: "<INS>Better.</INS>", model="openai/opt")
dspy.disable_logging()
compiled = OPROTeleprompter(toy_metric, prompt_model=opt_lm, task_model=task_lm, num_steps=1, num_candidates=2,
                            num_threads=2, max_cost=10.0).compile(dspy.Predict("question -> answer"),
                                                                  trainset=toy_dataset(4))
run = compiled.opro_run
print(json.dumps({"litellm": sorted(m for m in sys.modules if m.split(".")[0] == "litellm"),
                  "cost": run.usage.task.cost, "calls": run.usage.task.calls}))
"""


@pytest.mark.slow  # a fresh interpreter
def test_a_compile_with_custom_engines_does_not_import_litellm():
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", _COMPILE_PROBE], env=env, cwd=root, check=True, capture_output=True,
                         text=True)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    # 8 task calls (4 examples x the start and one new instruction: the second reply is a duplicate) of 10 prompt
    # and 5 completion tokens each, priced at gpt-4o-mini's $0.15 and $0.60 per million tokens.
    assert report == {"litellm": [], "cost": pytest.approx(8 * (10 * 0.15 + 5 * 0.6) / 1e6), "calls": 8}
