"""The package's shape on the code itself: the subpackages say what they own, the top level is small, and a
default compile loads no extension (the import rules themselves are checked against docs/architecture.md in
tests/test_docs.py)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dspy_opro"

SUBPACKAGES = ("core", "scoring", "task", "record", "extensions", "testing")

@pytest.mark.parametrize("subpackage", SUBPACKAGES)
def test_each_subpackage_says_what_it_owns_and_what_it_may_import(subpackage):
    docstring = ast.get_docstring(ast.parse((PACKAGE / subpackage / "__init__.py").read_text(encoding="utf-8")))
    assert docstring and len(docstring.split()) > 40
    assert "import" in docstring.lower()


def test_the_top_level_is_small():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "checks.py", "compat.py", "errors.py", "state.py"]


_DEFAULT_COMPILE = """
import json, sys
import dspy
from dspy_opro import OPROTeleprompter
from tests.fakes import make_lm, toy_dataset, toy_metric, toy_task_reply

task_lm, _ = make_lm(toy_task_reply)
opt_lm, _ = make_lm(lambda request, n: "<INS>Better.</INS>", model="openai/opt")
OPROTeleprompter(toy_metric, prompt_model=opt_lm, task_model=task_lm, num_steps=1, num_candidates=2,
                 display_progress=False).compile(dspy.Predict("question -> answer"), trainset=toy_dataset(4))
print(json.dumps(sorted(m for m in sys.modules if m.startswith("dspy_opro"))))
"""


@pytest.mark.slow
def test_a_default_compile_loads_no_extension():
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")
    out = subprocess.run([sys.executable, "-c", _DEFAULT_COMPILE], env=env, cwd=ROOT, check=True,
                         capture_output=True, text=True)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert [m for m in loaded if m.startswith("dspy_opro.extensions.")] == []
    assert "dspy_opro.extensions" in loaded  # the options' dataclasses, which the settings are checked against
