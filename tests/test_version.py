"""``dspy_opro.__version__`` is the installed package's version (its metadata), which is the one ``pyproject.toml``
declares; ``dspy-opro --version`` and ``python -m dspy_opro --version`` print it."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import dspy_opro
from dspy_opro.__main__ import main

ROOT = Path(__file__).resolve().parent.parent


def declared_version() -> str:
    """The ``version`` of the ``[project]`` table of pyproject.toml."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        project = text.split("\n[project]\n", 1)[1].split("\n[", 1)[0]
        return re.search(r'^version = "([^"]+)"$', project, re.M).group(1)
    return tomllib.loads(text)["project"]["version"]


VERSION = declared_version()


def test_version_is_the_package_metadata_which_is_the_pyproject_version() -> None:
    assert dspy_opro.__version__ == importlib.metadata.version("dspy-opro") == VERSION


def test_main_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    captured = capsys.readouterr()
    assert (captured.out.split()[-1], captured.err) == (VERSION, "")


ENV = {**os.environ, "PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


@pytest.mark.slow  # a fresh interpreter
def test_python_m_dspy_opro_version() -> None:
    proc = subprocess.run([sys.executable, "-m", "dspy_opro", "--version"], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"python -m dspy_opro {VERSION}\n", "")


@pytest.mark.slow  # a fresh interpreter
def test_console_script_version() -> None:
    script = Path(sys.executable).parent / "dspy-opro"
    if not script.exists():
        pytest.skip("the dspy-opro console script is not installed in this environment")
    proc = subprocess.run([str(script), "--version"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"dspy-opro {VERSION}\n", "")
