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

pytestmark = [pytest.mark.slow, pytest.mark.compat]


def test_quickstart_runs_offline_saves_reloads_and_starts_afresh_unless_resumed(tmp_path):
    """One folder, three runs: a first run read in full, a run with other settings, then that run resumed."""
    out_dir = tmp_path / "qs"
    out = out_dir / "program.json"
    proc = _run(["--steps", "2", "--candidates", "3", "--out-dir", str(out_dir)])
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
    assert "| Role | Calls | Cache hits | Prompt tokens | Cached prompt tokens | Completion tokens | Cost |" in stdout
    for label in ("| optimizer | 2 | 0 |", "| task |", "| total |", "`openai/simulated-task`",
                  "`openai/simulated-optimizer`"):
        assert label in stdout

    assert "Loaded the saved program back and asked:" in stdout
    assert out.is_file()
    fresh = dspy.ChainOfThought("question -> answer")
    fresh.load(str(out))
    assert fresh.predict.signature.instructions == best

    # It ends by naming every file it wrote, all in its folder.
    tail = lines[lines.index(f"Files written to {out_dir}/:") + 1 :]
    named = [line.split()[0] for line in tail]
    assert named == [str(out_dir / name) for name in ("program.json", "report.md", "trajectory.png", "state.json",
                                                      "steps")]
    assert (out_dir / "report.md").read_text(encoding="utf-8").startswith("# OPRO run report")
    assert (out_dir / "trajectory.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in (out_dir / "steps").iterdir()) == ["000", "001"]
    assert not list(ROOT.glob("quickstart_compiled.json"))

    # A second run with other settings starts a new run record instead of refusing the old one, and removes only
    # the files a quickstart run writes.
    (out_dir / "notes.txt").write_text("mine", encoding="utf-8")
    other = ["--steps", "1", "--candidates", "2", "--train", "6", "--out-dir", str(out_dir)]
    proc = _run(other)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Resuming the OPRO run" not in proc.stderr
    assert sorted(p.name for p in (out_dir / "steps").iterdir()) == ["000"]
    assert (out_dir / "notes.txt").read_text(encoding="utf-8") == "mine"
    proc = _run([*other, "--resume"])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "is complete; returning its result without LM calls" in proc.stderr  # resumed, not started afresh
    assert sorted(p.name for p in (out_dir / "steps").iterdir()) == ["000"]


def test_quickstart_output_folder_is_ignored_by_git():
    assert "runs/" in (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()


def _run(args):
    # offline must not need (or use) an API key or base URL
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    for key in ("OPENAI_API_KEY", "OPENAI_API_BASE", "OPENAI_BASE_URL"):
        env.pop(key, None)
    return subprocess.run([sys.executable, "examples/quickstart.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
