"""examples/custom_engine.py, the offline route for a user's own task: run as a script, its counts checked."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "custom_engine.py"


def test_the_custom_engine_example_optimizes_its_own_task(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE)])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(EXAMPLE), run_name="__main__")
    assert exit_info.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "OPRO plan: 3 optimizer requests (1 single-choice request per step: 'local/scripted' is not known to honour "
        "n); at most 40 program runs with the metric (40 on training, 0 on validation); selection on training",
        "Training accuracy: start 60.0, best 100.0",
        "Best instruction: Read the review; watch for negation such as 'not good' before classifying.",
        "Task calls: 40, optimizer calls: 3",  # as planned: 10 examples x (start + 3 candidates), one per step
    ]
