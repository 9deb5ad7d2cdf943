"""The offline quickstart, run as a user would: a subprocess from the repository root."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import dspy
import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def test_quickstart_runs_offline_saves_and_reloads(tmp_path):
    out = tmp_path / "q.json"
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    for key in ("OPENAI_API_KEY", "OPENAI_API_BASE", "OPENAI_BASE_URL"):  # offline must not need (or use) these
        env.pop(key, None)
    proc = subprocess.run(
        [sys.executable, "examples/quickstart.py", "--steps", "2", "--candidates", "3", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    stdout = proc.stdout
    lines = stdout.splitlines()
    assert re.fullmatch(r"Running offline against a simulated model at http://127\.0\.0\.1:\d+/v1 .*", lines[0])

    # The trajectory table: the start and one row per step.
    assert "Score trajectory (training accuracy, 0-100):" in stdout
    assert "| step | predictor | scored | best this step | best so far |" in stdout
    rows = [line for line in lines if re.match(r"\| -?\d+ \| ", line)]
    assert [row.split("|")[1].strip() for row in rows] == ["-1", "0", "1"]
    assert rows[0].split("|")[2].strip() == "start"

    # The best instruction, on the line after its heading.
    heading = next(i for i, line in enumerate(lines) if line.startswith("Best instruction ("))
    assert lines[heading + 1].startswith("  ")
    best = lines[heading + 1].strip()
    assert best and best != "Given the fields `question`, produce the fields `answer`."
    assert re.search(r"^Training \d+\.\d, validation (\d+\.\d|n/a)$", stdout, re.M)

    # The usage table, both roles and both models. The simulated optimizer is an OpenAI model on LiteLLM, which
    # honours n: one call per step (2), not one per candidate (2 x 3).
    assert "Usage:" in stdout
    assert "| Role | Calls | Cache hits | Prompt tokens | Completion tokens | Cost |" in stdout
    for label in ("| optimizer | 2 | 0 |", "| task |", "| total |", "`openai/simulated-task`",
                  "`openai/simulated-optimizer`"):
        assert label in stdout

    assert f"Saved the compiled program to {out}" in stdout
    assert "Loaded it back and asked:" in stdout
    assert out.is_file()
    fresh = dspy.ChainOfThought("question -> answer")
    fresh.load(str(out))
    assert fresh.predict.signature.instructions == best
