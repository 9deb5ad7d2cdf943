"""What is read back is checked, and every failure of the record has its documented type (issue 20, items 5 and 6).

A run record with a journal is made by a compile whose disk fills after step 0's optimizer call: ``state.json``
holds the start and step 0's proposals, ``progress.jsonl`` the evaluations of step 0 that followed. Damaging
either file is then refused by the next compile, before any request reaches the simulated endpoint, with a
:class:`StateFileError` that names the file, the candidate and the field.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import dspy
import pytest

from dspy_opro import LogDirError, OPROTeleprompter
from dspy_opro.errors import StateFileError
from dspy_opro.record.files import LOCK_FILE, PROGRESS_FILE, STATE_FILE, ProgressJournal, load_state
from dspy_opro.testing import SimulatedEndpoint, simulated_dataset, simulated_metric


@pytest.fixture(scope="module")
def endpoint():
    with SimulatedEndpoint() as server:
        yield server


def compile_run(endpoint, log_dir, **options):
    options = {"num_steps": 1, "num_candidates": 2, "num_threads": 1, **options}
    teleprompter = OPROTeleprompter(simulated_metric, prompt_model=endpoint.lm("openai/sim-opt", num_retries=0),
                                    task_model=endpoint.lm("openai/sim-task", num_retries=0), log_dir=log_dir,
                                    **options)
    return teleprompter.compile(dspy.Predict("question -> answer"), trainset=simulated_dataset(3))


@pytest.fixture
def journaled(endpoint, tmp_path, monkeypatch) -> Path:
    """A log_dir whose state.json was last written after step 0's optimizer call, and a journal of step 0."""
    import dspy_opro.record.recorder as recorder

    real_save, saves = recorder.save_state, [0]

    def save_until_full(state, log_dir):
        saves[0] += 1
        if saves[0] > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(state, log_dir)

    monkeypatch.setattr(recorder, "save_state", save_until_full)
    with pytest.raises(LogDirError):
        compile_run(endpoint, tmp_path)
    monkeypatch.setattr(recorder, "save_state", real_save)
    assert len(ProgressJournal.read(tmp_path)) == 6  # two candidates x three examples
    endpoint.reset_log()
    return tmp_path


def edit_state(log_dir: Path, change) -> None:
    path = log_dir / STATE_FILE
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def edit_journal(log_dir: Path, change) -> None:
    path = log_dir / PROGRESS_FILE
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    change(entries)
    path.write_text("".join(json.dumps(entry) + "\n" for entry in entries))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["candidates"][0]["scores"].__setitem__(1, 1.5),
         r"state.json: candidate 0, field scores\[1\]: 1.5 is not a score in \[0, 1\]"),
        (lambda d: d["candidates"][0]["scores"].append(1.0),
         r"state.json: candidate 0, field scores: 4 scores, but the split has 3 examples"),
        (lambda d: d["candidates"][0].__setitem__("score", -0.5),
         r"state.json: candidate 0, field score: -0.5 is not a score in \[0, 1\]"),
    ],
)
def test_a_state_file_with_impossible_scores_is_refused_naming_the_candidate_and_field(endpoint, journaled, change,
                                                                                      message):
    edit_state(journaled, change)
    with pytest.raises(StateFileError, match=message):
        compile_run(endpoint, journaled)
    assert endpoint.requests == []


def _contradict(entries):
    # An entry for the start's example 0, numbered as part of the snapshot, with another score than it records.
    first = dict(entries[0])
    entries.insert(0, {**first, "c": 0, "d": FIRST_DIGEST[0], "i": 0, "s": 1.0 - START_SCORE[0], "m": 1})


FIRST_DIGEST: list[str] = []
START_SCORE: list[float] = []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda e: e[0].__setitem__("s", 1.5), r"progress.jsonl, line 1: candidate 1, field s \(score\): 1.5"),
        (lambda e: e[2].__setitem__("i", 99), r"progress.jsonl, line 3: candidate 1, field i \(example\): 99"),
        (lambda e: e[1].__setitem__("c", 42), r"progress.jsonl, line 2: candidate 42, field c \(candidate\)"),
        (lambda e: e[0].__setitem__("o", "great"), r"line 1: candidate 1, field o \(outcome\)"),
        (_contradict, r"line 1: candidate 0, field s \(score\) of train example 0 is .*, but state.json records"),
    ],
)
def test_a_forged_journal_line_is_refused_naming_the_file_the_candidate_and_the_field(endpoint, journaled, change,
                                                                                      message):
    saved = load_state(journaled)
    FIRST_DIGEST[:] = [saved.candidates[0].md5]
    START_SCORE[:] = [saved.candidates[0].scores[0]]
    edit_journal(journaled, change)
    with pytest.raises(StateFileError, match=message):
        compile_run(endpoint, journaled)
    assert endpoint.requests == []


def test_an_intact_journal_is_replayed_whatever_the_candidates_saved_status(endpoint, journaled):
    # The snapshot says the step's candidates were left unscored by an outage; their journaled scores still count.
    edit_state(journaled, lambda d: [c.update(status="unscored", reason="LM failures on 3 examples after a retry; "
                                              "last: LMServerError") for c in d["candidates"][1:]])
    compiled = compile_run(endpoint, journaled)
    assert endpoint.count("task") == 0 and endpoint.count("opro") == 0  # nothing bought again
    assert [c.status for c in compiled.opro_run.candidates] == ["scored", "scored", "scored"]
    assert compiled.opro_run.metric_calls == 9


def test_an_empty_log_dir_is_refused_naming_the_fix(endpoint):
    with pytest.raises(LogDirError, match=r"log_dir='' names no folder; pass a folder path .* or log_dir=None"):
        compile_run(endpoint, "")
    assert endpoint.requests == []


def test_a_run_lock_that_is_a_folder_is_refused_naming_the_fix(endpoint, tmp_path):
    (tmp_path / LOCK_FILE).mkdir()
    with pytest.raises(LogDirError, match=r"run.lock' is not a file, so the run cannot take its lock there. Remove"):
        compile_run(endpoint, tmp_path)
    assert endpoint.requests == []


def test_a_disk_that_fills_while_journaling_is_a_log_dir_error_and_the_resume_rebuys_one(endpoint, tmp_path,
                                                                                       monkeypatch):
    real_append, appended = ProgressJournal.append, [0]

    def append_until_full(self, entry):
        appended[0] += "k" not in entry  # evaluations only (an optimizer reply's entry has a kind, "k")
        if appended[0] == 5:  # the journal line of step 0's second evaluation: the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_append(self, entry)

    monkeypatch.setattr(ProgressJournal, "append", append_until_full)
    endpoint.reset_log()
    with pytest.raises(LogDirError, match="No space left on device. What was saved before is kept; free disk space"):
        compile_run(endpoint, tmp_path)
    saved = load_state(tmp_path)
    assert saved.status == "failed" and saved.stop_reason.startswith("LogDirError")
    assert saved.metric_calls == 5 and saved.candidates[1].scores[:2] == [saved.candidates[1].scores[0], None]
    monkeypatch.setattr(ProgressJournal, "append", real_append)
    served = endpoint.count("task")
    assert served == 3 + 2
    resumed = compile_run(endpoint, tmp_path).opro_run
    assert endpoint.count("task") - served == 6 - 1  # step 0's six, less the one recorded before the disk filled
    assert resumed.status == "finished" and resumed.metric_calls == endpoint.count("task")


def test_a_full_disk_at_the_journals_close_is_a_log_dir_error_and_frees_the_lock(endpoint, tmp_path, monkeypatch):
    """The journal's last buffered write fails as the run closes it: a LogDirError naming the fix, not a bare
    OSError, and the lock is released, so that the next compile in the same process (a notebook) goes on."""
    real_close, closes = ProgressJournal.close, [0]

    def close_on_a_full_disk(self):
        closes[0] += 1
        real_close(self)
        if closes[0] == 1:
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ProgressJournal, "close", close_on_a_full_disk)
    with pytest.raises(LogDirError, match="No space left on device. What was saved before is kept; free disk space "
                                          "and compile again with the same log_dir to resume"):
        compile_run(endpoint, tmp_path)
    served = endpoint.count("task")
    run = compile_run(endpoint, tmp_path).opro_run  # no RunInProgressError: the lock went with the error
    assert run.status == "finished" and endpoint.count("task") == served
