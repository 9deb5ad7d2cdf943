"""``dspy-opro --version`` and ``python -m dspy_opro --version`` print the package version."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import dspy_opro
from dspy_opro.__main__ import main

ROOT = Path(__file__).resolve().parent.parent


def project_version() -> str:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]


def test_version_is_read_from_the_installed_package_metadata() -> None:
    from importlib.metadata import version

    assert dspy_opro.__version__ == version("dspy-opro") == project_version() == "0.3.0"


def test_main_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip().endswith(f" {project_version()}") and captured.err == ""


def test_python_m_dspy_opro_version() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    proc = subprocess.run([sys.executable, "-m", "dspy_opro", "--version"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"python -m dspy_opro {project_version()}\n", "")


def test_console_script_version() -> None:
    script = Path(sys.executable).parent / "dspy-opro"
    if not script.exists():
        pytest.skip("the dspy-opro console script is not installed in this environment")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    proc = subprocess.run([str(script), "--version"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"dspy-opro {project_version()}\n", "")
