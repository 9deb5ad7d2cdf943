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

from dspy_opro.record.files import load_state
from dspy_opro.task.programs import split_instructions
from dspy_opro.testing import arithmetic_tool

pytestmark = pytest.mark.slow  # each example compiles through its own simulated endpoint

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
START = "Given the fields `question`, produce the fields `answer`."


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

    # DSPy's react instruction is the signature's instruction followed by its agent protocol, tool list included.
    # OPRO searches the head only: the run record and the meta-prompt hold heads, the proposals replace the head.
    original = dspy.ReAct("question -> answer", tools=[arithmetic_tool], max_iters=4).react.signature.instructions
    head, tail = split_instructions(original)
    assert head == START and head + tail == original
    assert tail.startswith("\n\nYou are an Agent. In each episode") and "\n(1) arithmetic_tool, whose" in tail
    assert run.candidates[0].instructions["react"] == START
    assert START in run.steps[0].meta_prompt
    assert "You are an Agent" not in run.steps[0].meta_prompt and "arithmetic_tool" not in run.steps[0].meta_prompt
    proposals = [c for c in run.scored() if c.predictor == "react"]
    assert [c.step for c in proposals] == [0, 0, 0]
    assert all(c.instruction and c.instruction != START and "arithmetic_tool" not in c.instruction
               and "You are an Agent" not in c.instruction for c in proposals)
    assert (log_dir / "steps" / "000" / "replies.json").is_file()

    # The compiled agent (here the best candidate changed only 'extract.predict') and the program of the best
    # 'react' proposal both keep the protocol and tool list verbatim after their head.
    best = run.candidates[run.selection.candidate_id]
    assert best.predictor == "extract.predict" and best.instructions["react"] == START
    assert f"\n'react' instruction:\n{best.instructions['react']}{tail}\n\n'extract.predict' instruction:\n" in output
    top = max(proposals, key=lambda c: c.score)
    assert (f"\nBest 'react' proposal (candidate {top.id}, training {100 * top.score:.1f}), as OPRO wrote it:\n"
            f"{top.instruction}\n\n... and as the agent reads it:\n{top.instruction}{tail}\n") in output

    # So every agent run, under every candidate, sees the tool and calls it: with the simulated model that is
    # three task-model calls per program run (the tool call, finish, extract).
    assert run.usage.task.calls == 3 * run.metric_calls


def test_react_agent_answer_step_only(tmp_path, monkeypatch, capsys):
    log_dir = tmp_path / "run"
    args = ["--predictors", "extract.predict", "--steps", "1", "--candidates", "2", "--train", "4", "--log-dir",
            str(log_dir)]
    output = run_example("react_agent.py", args, monkeypatch, capsys)
    run = load_state(log_dir)
    assert run.predictors == ["extract.predict"]
    assert "(1) arithmetic_tool" in output  # the react instruction, tool list included, is returned unchanged
    assert "Best 'react' proposal" not in output  # no react proposal was made


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
