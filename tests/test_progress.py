"""Progress bars per scoring phase, log lines routed around them, the display switch, and the LiteLLM import line.

Bars are read from what tqdm wrote to a stand-in for stderr that says it is a terminal: every rendering of a bar
starts with a carriage return, so the text split on carriage returns and newlines lists them in order.
"""

from __future__ import annotations

import io
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
from dspy_opro.compat import dspy_logging_stream
from dspy_opro.config import Models, OPROConfig
from dspy_opro.record.progress import Progress, best_postfix, import_litellm_announced, shows_bars
from tests.fakes import make_lm, scripted_optimizer, toy_dataset, toy_metric, toy_task_reply

pytestmark = pytest.mark.usefixtures("unconfigured_logging")

BAR = re.compile(r"^(?P<desc>.+?): +\d+%\|[^|]*\| (?P<n>\d+)/(?P<total>\d+) "
                 r"\[[^\]]*?(?:, (?P<postfix>best [^\]]*))?\]$")


def log_line(level: str, name: str, message: str) -> str:
    """The pattern of a whole line from DSPy's log format."""
    return rf"\d{{4}}/\d\d/\d\d \d\d:\d\d:\d\d {level} {name}: {message}"


STEP0 = ["<INS>Do better.</INS>", "<INS>Be better and better.</INS>"]  # training 16.7 and 33.3
STEP1 = ["<INS>Better, better, better.</INS>", "<INS>Do better.</INS>"]  # 50.0 and a duplicate


class Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def renderings(text: str) -> list[tuple[str, int, int, str | None]]:
    """Every bar drawn, in order: (description, count, total, postfix)."""
    drawn = []
    for piece in re.split(r"[\r\n]", text):
        match = BAR.match(piece.rstrip())
        if match:
            drawn.append((match["desc"], int(match["n"]), int(match["total"]), match["postfix"]))
    return drawn


def final_bars(text: str) -> list[tuple[str, int, int, str | None]]:
    """The last drawing of each bar (one per phase)."""
    bars: list[tuple[str, int, int, str | None]] = []
    for drawn in renderings(text):
        if bars and bars[-1][0] == drawn[0]:
            bars[-1] = drawn
        else:
            bars.append(drawn)
    return bars


def stderr_as(monkeypatch, stream: io.StringIO) -> io.StringIO:
    """Send stderr to ``stream`` for the rest of the test (called in the test body: pytest resets stderr between
    a fixture's setup and the call)."""
    monkeypatch.setattr(sys, "stderr", stream)
    monkeypatch.setattr(dspy_logging_stream(), "_enabled", True)  # whatever an earlier test did to DSPy's logging
    return stream


def noisy_metric(logged: list[str]):
    """The toy metric, logging a WARNING (from the evaluation thread) whenever it scores training item 2."""

    def metric(example, prediction, trace=None):
        if example.question == "item 2":
            logged.append(example.question)
            logging.getLogger("dspy_opro.tests").warning("metric saw %s", example.question)
        return toy_metric(example, prediction)

    return metric


def compile_toy(metric=toy_metric, **kwargs) -> dspy.Module:
    task_lm, _ = make_lm(toy_task_reply)
    opt_lm, _ = make_lm(scripted_optimizer(STEP0 + STEP1))
    optimizer = OPROTeleprompter(metric, prompt_model=opt_lm, task_model=task_lm, num_steps=2, num_candidates=2,
                                 num_threads=1, select="validation", top_k=2, **kwargs)
    return optimizer.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(6),
                             valset=toy_dataset(4, prefix="val"))


def test_each_scoring_phase_has_a_bar_with_its_total_final_count_and_best_scores(monkeypatch):
    terminal = stderr_as(monkeypatch, Terminal())
    compiled = compile_toy()
    assert final_bars(terminal.getvalue()) == [
        ("start", 6, 6, "best 0.0"),
        ("step 0: 2 candidates", 12, 12, "best 33.3"),
        ("step 1: 1 candidate", 6, 6, "best 50.0"),
        ("validation: 2 candidates", 8, 8, "best 50.0, val 75.0"),
    ]
    # The first drawing of each phase: nothing done yet, the best score of the phases before.
    firsts = {}
    for drawn in renderings(terminal.getvalue()):
        firsts.setdefault(drawn[0], drawn)
    assert [firsts[desc][1:] for desc in firsts] == [(0, 6, None), (0, 12, "best 0.0"), (0, 6, "best 33.3"),
                                                     (0, 8, "best 50.0")]
    assert compiled.opro_run.candidates[3].val_score == 0.75
    # Each bar is removed when its phase ends: the output ends with the selection's log line, not a bar.
    last_line = terminal.getvalue().rstrip("\n").split("\n")[-1].split("\r")[-1]
    assert re.fullmatch(log_line(level="INFO", name="dspy_opro.run", message=r"OPRO selected candidate 3 .*"),
                        last_line)


def test_label_free_gate_has_a_bar_for_the_anchors_and_one_for_the_candidate(monkeypatch):
    terminal = stderr_as(monkeypatch, Terminal())
    from tests.test_beyond import label_free, labelled

    label_free(["<INS>Better better better better better better.</INS>"], valset=labelled(4, prefix="val"))
    assert final_bars(terminal.getvalue()) == [
        ("start", 6, 6, "best 50.0"),
        ("step 0: 1 candidate", 6, 6, "best 65.0"),
        ("label-free gate: start", 4, 4, "best 65.0, val 50.0"),
        ("label-free gate: candidate 1", 4, 4, "best 65.0, val 57.5"),
    ]


def test_log_lines_during_a_bar_are_written_whole_on_their_own_lines(monkeypatch):
    terminal = stderr_as(monkeypatch, Terminal())
    logged = []
    compile_toy(metric=noisy_metric(logged))
    lines = [line for line in terminal.getvalue().split("\n") if "metric saw" in line]
    assert len(lines) == len(logged) == 4  # the start and the three new candidates on training item 2
    for line in lines:
        *before, written = line.split("\r")
        assert re.fullmatch(log_line(level="WARNING", name="dspy_opro.tests", message="metric saw item 2"),
                            written)
        assert BAR.match(before[-2].rstrip())  # the bar as it was ...
        assert before[-1].strip() == ""  # ... cleared, so the line starts at column 0
    # After each line the bar is drawn again, on a line of its own.
    after = [piece.split("\n", 1)[1] for piece in terminal.getvalue().split("metric saw item 2")[1:]]
    assert all(BAR.match(rest.split("\r")[1].rstrip()) for rest in after)
    # After the run: the compile's own handler is gone, and DSPy's handler writes to DSPy's stream again.
    assert logging.getLogger("dspy_opro").handlers == []
    dspy_handler = next(h for h in logging.getLogger("dspy").handlers if h.get_name() == "dspy_handler")
    assert dspy_handler.stream is dspy_logging_stream()


def test_display_progress_false_shows_no_bar_and_keeps_the_log_lines(monkeypatch):
    terminal = stderr_as(monkeypatch, Terminal())
    compile_toy(display_progress=False)
    text = terminal.getvalue()
    assert renderings(text) == [] and "%|" not in text
    assert re.search(log_line(level="INFO", name="dspy_opro.run", message="Step 1: best training score so far "
                                     r"50\.0"), text)


def test_no_bar_when_stderr_is_not_a_terminal(monkeypatch):
    stream = stderr_as(monkeypatch, io.StringIO())
    compile_toy()
    assert "%|" not in stream.getvalue()
    assert "Step 0: best training score so far 33.3" in stream.getvalue()


def test_progress_draws_a_phase_and_removes_it():
    stream = Terminal()
    progress = Progress(display=True, file=stream)
    progress.start_phase("nothing to do", 0)
    assert progress.bar is None and stream.getvalue() == ""
    progress.set_best(0.725)
    progress.start_phase("step 3: 8 candidates", 3)
    for _ in range(3):
        progress.advance()
    progress.set_best(0.8, 0.7)
    progress.end_phase()
    assert progress.bar is None
    assert final_bars(stream.getvalue()) == [("step 3: 8 candidates", 3, 3, "best 80.0, val 70.0")]
    assert renderings(stream.getvalue())[0] == ("step 3: 8 candidates", 0, 3, "best 72.5")
    assert stream.getvalue().split("\r")[-2].strip() == ""  # cleared on close
    progress.close()


def test_best_postfix_and_where_bars_show(tmp_path):
    assert best_postfix(None) == ""
    assert best_postfix(0.725) == "best 72.5"
    assert best_postfix(0.5, 0.75) == "best 50.0, val 75.0"
    assert shows_bars(Terminal()) is True
    assert shows_bars(io.StringIO()) is False
    assert shows_bars(None) is False
    notebook_stream = type("OutStream", (), {"__module__": "ipykernel.iostream", "isatty": lambda self: False})
    assert shows_bars(notebook_stream()) is True
    with open(tmp_path / "log.txt", "w") as file:
        assert shows_bars(file) is False
    assert shows_bars(file) is False  # closed: isatty raises


def test_display_progress_is_checked_and_shapes_no_result():
    with pytest.raises(ValueError, match="display_progress must be a bool"):
        OPROTeleprompter(toy_metric, display_progress="yes")
    lm, _ = make_lm(toy_task_reply)
    models = Models(prompt=lm, task=lm, judge=None)
    shown, hidden = OPROConfig(metric=toy_metric), OPROConfig(metric=toy_metric, display_progress=False)
    assert OPROTeleprompter(toy_metric).config.display_progress is True
    assert shown.recorded_settings(models, ["self"]) == hidden.recorded_settings(models, ["self"])
    program, train = dspy.Predict("question -> answer"), toy_dataset(3)
    assert (shown.fingerprint(models, ["self"], trainset=train, valset=[], program=program)
            == hidden.fingerprint(models, ["self"], trainset=train, valset=[], program=program))


def test_no_litellm_import_for_models_on_other_engines(monkeypatch, caplog):
    monkeypatch.delitem(sys.modules, "litellm", raising=False)
    lm, _ = make_lm(toy_task_reply)
    caplog.set_level(logging.INFO, logger="dspy_opro.record.progress")
    logging.getLogger("dspy_opro.record.progress").addHandler(caplog.handler)
    try:
        assert import_litellm_announced([("optimizer", lm), ("task", lm), ("judge", None)]) is False
    finally:
        logging.getLogger("dspy_opro.record.progress").removeHandler(caplog.handler)
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


def test_dspy_disable_logging_silences_the_log_lines_but_not_the_bars(monkeypatch):
    terminal = stderr_as(monkeypatch, Terminal())
    monkeypatch.setattr(dspy_logging_stream(), "_enabled", False)  # what dspy.disable_logging() sets
    logged = []
    compile_toy(metric=noisy_metric(logged))
    text = terminal.getvalue()
    assert len(logged) == 4
    assert "dspy_opro.run" not in text and "metric saw" not in text
    assert [desc for desc, *_ in final_bars(text)] == ["start", "step 0: 2 candidates", "step 1: 1 candidate",
                                                       "validation: 2 candidates"]
    # No bar is cleared and drawn again for a line that is not written: one clear per phase, when it ends.
    assert len(re.findall(r"\r {20,}\r", text)) == 4
