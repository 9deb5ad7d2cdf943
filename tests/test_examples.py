"""examples/react_agent.py, examples/judge_metric.py and examples/load_compiled.py, run as scripts, offline.

Each runs in this process through ``runpy`` with ``__name__ == "__main__"`` and its own command line, against the
simulated endpoint (the default without ``--lm``). The statements docs/examples.md makes about their output are
checked here. (examples/quickstart.py is run by tests/test_quickstart.py, examples/compare_optimizers.py by
tests/test_compare.py.)
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import dspy
import pytest

from dspy_opro.state import load_state

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name: str, args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``examples/<name>`` as ``python examples/<name> ARGS`` would, and return what it printed."""
    monkeypatch.setattr(sys, "argv", [str(EXAMPLES / name), *args])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(EXAMPLES / name), run_name="__main__")
    output = capsys.readouterr().out
    assert exit_info.value.code == 0, output
    assert output.startswith("Running offline against a simulated model at http://127.0.0.1:") or name.startswith(
        "load_compiled")
    return output


def test_react_agent(tmp_path, monkeypatch, capsys):
    log_dir = tmp_path / "run"
    output = run_example("react_agent.py", ["--log-dir", str(log_dir)], monkeypatch, capsys)
    assert "Predictors: ['react', 'extract.predict']" in output
    assert "Training accuracy: start " in output
    assert "Usage (several LM calls per agent run):" in output
    run = load_state(log_dir)
    assert [step.predictor for step in run.steps] == ["react", "extract.predict"]  # the default: 2 steps
    # Several task-model calls per agent run: a tool call, finish, extract.
    assert run.usage.task.calls > run.metric_calls
    # The start's react instruction carries DSPy's tool list; the proposals for it replace the whole text.
    assert "(1) arithmetic_tool" in run.candidates[0].instructions["react"]
    proposals = [c.instruction for c in run.candidates if c.predictor == "react"]
    assert proposals and all("arithmetic_tool" not in text for text in proposals)
    assert (log_dir / "steps" / "000" / "replies.json").is_file()


def test_react_agent_answer_step_only(tmp_path, monkeypatch, capsys):
    log_dir = tmp_path / "run"
    args = ["--predictors", "extract.predict", "--steps", "1", "--candidates", "2", "--train", "4", "--log-dir",
            str(log_dir)]
    output = run_example("react_agent.py", args, monkeypatch, capsys)
    run = load_state(log_dir)
    assert run.predictors == ["extract.predict"]
    assert "(1) arithmetic_tool" in output  # the react instruction, tool list included, is returned unchanged


def test_judge_metric(tmp_path, monkeypatch, capsys):
    output = run_example("judge_metric.py", ["--log-dir", str(tmp_path)], monkeypatch, capsys)
    # The first meta-prompt's problems: the program's own answer where the judge agreed, its feedback where not.
    assert "Ground truth answer:\n47\n" in output
    assert ("Ground truth answer:\nThe answer '28' is wrong; a checker worked it out as: I compute 16 * 2 - 9, "
            "which gives 23.\n") in output
    assert "(no reference answer available)" not in output
    run = load_state(tmp_path)
    calls = int(output.rsplit("Judge calls (recorded under the task role): ", 1)[1].split()[0])
    assert calls == run.usage.by_model["openai/simulated-judge"].calls == run.metric_calls  # one per program run
    assert run.usage.task.calls == 2 * run.metric_calls  # the program's call and the judge's, both "task"


def test_load_compiled(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    first = run_example("load_compiled.py", [], monkeypatch, capsys)
    assert first.startswith("Optimized and saved the program to opro_program.json")
    saved = json.loads((tmp_path / "opro_program.json").read_text(encoding="utf-8"))
    instruction = saved["predict"]["signature"]["instructions"]
    assert f"Loaded instruction: {instruction}\n" in first
    assert "Held-out accuracy: " in first and "Runner-up on held-out: " in first
    assert (tmp_path / "opro_run" / "state.json").is_file()

    second = run_example("load_compiled.py", [], monkeypatch, capsys)
    assert "Optimized and saved" not in second  # the saved program is reused
    assert second.splitlines()[0] == f"Loaded instruction: {instruction}"
    program = dspy.ChainOfThought("question -> answer")
    program.load(str(tmp_path / "opro_program.json"))
    assert program.predict.signature.instructions == instruction == load_state("opro_run").candidates[
        load_state("opro_run").selection.candidate_id].instructions["predict"]
