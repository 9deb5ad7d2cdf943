"""The run record on disk: one run per log_dir, damaged files, what resume accepts and refuses, file modes."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import dspy
import pytest

from dspy_opro.__main__ import main as cli
from dspy_opro.errors import RunInProgressError, StateFileError
from dspy_opro.record.files import PROGRESS_FILE, ProgressJournal, load_state
from dspy_opro.state import digest
from dspy_opro.task.programs import callable_fingerprint
from tests.fakes import make_lm, toy_dataset, toy_metric, toy_task_reply
from tests.resume_job import build

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def outcome(compiled):
    run = compiled.opro_run
    return (compiled.signature.instructions, [(c.instruction, c.status, c.score, c.scores) for c in run.candidates])


def compile_job(log_dir, call_log=None, **options):
    teleprompter, program, trainset, task_engine, opt_engine = build(str(log_dir), call_log, **options)
    return teleprompter.compile(program, trainset=trainset, valset=options.get("_valset")), task_engine, opt_engine


@pytest.mark.slow  # a second process holds the lock
def test_a_second_process_on_the_same_log_dir_is_refused_at_once(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from dspy_opro.record.files import LogDirLock; "
         "lock = LogDirLock(sys.argv[1]); lock.acquire(); print('locked', flush=True); sys.stdin.read()",
         str(tmp_path)],
        cwd=ROOT, env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        teleprompter, program, trainset, task_engine, opt_engine = build(str(tmp_path))
        with pytest.raises(RunInProgressError, match=f"an OPRO run is in progress in {tmp_path}"):
            teleprompter.compile(program, trainset=trainset)
        assert (len(task_engine.requests), len(opt_engine.requests)) == (0, 0)
        assert not (tmp_path / "state.json").exists()
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    compiled, task_engine, _ = compile_job(tmp_path)  # the lock died with its process
    assert compiled.opro_run.status == "finished" and len(task_engine.requests) == compiled.opro_run.metric_calls


def test_the_journal_ignores_a_torn_multibyte_last_line_and_appends_on_a_new_line(tmp_path):
    path = tmp_path / PROGRESS_FILE
    whole = json.dumps({"c": 1, "i": 0, "a": "é"}, ensure_ascii=False).encode("utf-8")
    path.write_bytes(whole + b"\n" + '{"c": 1, "i": 1, "a": "é'.encode()[:-1])  # cut inside "é"
    assert ProgressJournal.read(tmp_path) == [{"c": 1, "i": 0, "a": "é"}]
    journal = ProgressJournal(tmp_path)
    journal.append({"c": 1, "i": 2})
    journal.close()
    assert ProgressJournal.read(tmp_path) == [{"c": 1, "i": 0, "a": "é"}, {"c": 1, "i": 2}]
    assert path.read_bytes().endswith(b'\xc3\n{"c": 1, "i": 2}\n')


@pytest.mark.slow  # SIGKILLs a child process running a compile
def test_a_killed_run_with_a_torn_journal_resumes_to_the_uninterrupted_result(tmp_path):
    full, full_engine, _ = compile_job(tmp_path / "full")
    expected = outcome(full)
    child = subprocess.run([sys.executable, "-m", "tests.resume_job", str(tmp_path / "crash"),
                            str(tmp_path / "before.log"), "12"], cwd=ROOT, env=ENV, capture_output=True, timeout=300)
    assert child.returncode == -9, child.stderr
    journal = tmp_path / "crash" / PROGRESS_FILE
    # Everything since step 0's snapshot (taken after its optimizer call): candidate 1's five evaluations and
    # candidate 2's first; the snapshot comes after the step, not after every candidate.
    assert [(e["c"], e["i"]) for e in ProgressJournal.read(tmp_path / "crash")] == [(1, i) for i in range(5)] + [(2, 0)]
    journal.write_bytes(journal.read_bytes() + '{"c": 1, "i": 1, "o": "ok", "a": "ü'.encode()[:-1])
    compiled, task_engine, _ = compile_job(tmp_path / "crash")
    assert outcome(compiled) == expected
    assert len(task_engine.requests) == len(full_engine.requests) - 11  # all but the 11 recorded before the kill


@pytest.mark.parametrize("damage", [b'{"schema_version": 1, "fingerprint": {"con', b"\xff\xfe{}", b"", b"[]"])
def test_a_damaged_state_file_is_reported_by_compile_and_by_the_report_command(finished_job, damage, capsys):
    (finished_job / "state.json").write_bytes(damage)
    teleprompter, program, trainset, task_engine, _ = build(str(finished_job))
    with pytest.raises(StateFileError, match="state.json is corrupt"):
        teleprompter.compile(program, trainset=trainset)
    assert task_engine.requests == []
    assert cli(["report", str(finished_job), "--no-plot"]) == 2
    assert "state.json is corrupt" in capsys.readouterr().err


def read_only_command() -> list[str]:
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: cannot make a folder read-only")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search"]


@pytest.mark.slow  # compiles in a child process
def test_a_finished_run_in_a_read_only_log_dir_returns_its_result(tmp_path):
    log_dir = tmp_path / "run"
    expected = compile_job(log_dir)[0].signature.instructions
    for path in [log_dir, *log_dir.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    script = ("import sys; from tests.resume_job import build; t, p, d, task, opt = build(sys.argv[1]); "
              "c = t.compile(p, trainset=d); print(c.signature.instructions, len(task.requests), "
              "len(opt.requests), sep='|')")
    try:
        child = subprocess.run([*read_only_command(), sys.executable, "-c", script, str(log_dir)], cwd=ROOT, env=ENV,
                               capture_output=True, text=True, timeout=300)
        probe = subprocess.run([*read_only_command(), "touch", str(log_dir / "probe")], capture_output=True)
    finally:
        for path in [log_dir, *log_dir.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
    assert probe.returncode != 0  # the folder really was read-only for the child
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout.strip().split("|") == [expected, "0", "0"]


def test_state_json_has_the_mode_of_the_other_files(finished_job_template):
    log_dir, _ = finished_job_template
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in log_dir.iterdir() if path.is_file()}
    assert modes["state.json"] == modes["report.md"] == modes[PROGRESS_FILE]
    assert modes["state.json"] == 0o666 & ~_umask()


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def test_raising_num_steps_continues_a_finished_run_from_its_last_step(tmp_path):
    before, after = tmp_path / "before.log", tmp_path / "after.log"
    first, _, _ = compile_job(tmp_path / "run", str(before), num_steps=2)
    assert len(first.opro_run.steps) == 2 and first.opro_run.status == "finished"
    continued, _, opt_engine = compile_job(tmp_path / "run", str(after), num_steps=4)
    full, full_engine, _ = compile_job(tmp_path / "full", num_steps=4)
    assert outcome(continued) == outcome(full)
    assert len(opt_engine.requests) == 2 * 3  # steps 2 and 3 only, one request per candidate
    pairs_before, pairs_after = before.read_text().splitlines(), after.read_text().splitlines()
    assert set(pairs_before) & set(pairs_after) == set()
    assert len(pairs_before) + len(pairs_after) == len(full_engine.requests)


def test_the_valset_counts_only_where_it_is_used(tmp_path):
    task_lm, _ = make_lm(toy_task_reply)

    def run(log_dir, valset, **options):
        teleprompter, program, trainset, task_engine, _ = build(str(log_dir), **options)
        compiled = teleprompter.compile(program, trainset=trainset, valset=valset)
        return compiled, task_engine

    run(tmp_path / "train", toy_dataset(3, prefix="val"), select="train")
    _, task_engine = run(tmp_path / "train", toy_dataset(2, prefix="val"), select="train")
    assert task_engine.requests == []  # select="train" never uses the valset: the saved result
    run(tmp_path / "validation", toy_dataset(3, prefix="val"), select="validation", top_k=1)
    with pytest.raises(StateFileError, match="belongs to a different run: the valset"):
        run(tmp_path / "validation", toy_dataset(2, prefix="val"), select="validation", top_k=1)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"num_candidates": 2, "temperature": 0.5}, "num_candidates: 3 -> 2; temperature: 1.0 -> 0.5"),
        ({"metric": lambda example, prediction, trace=None: 1.0}, "metric: \"tests.fakes.toy_metric#"),
    ],
)
def test_a_refusal_names_each_differing_setting_with_old_and_new_value(finished_job, change, named):
    teleprompter, program, trainset, task_engine, _ = build(str(finished_job), **change)
    with pytest.raises(StateFileError, match="belongs to a different run: the optimizer configuration") as refusal:
        teleprompter.compile(program, trainset=trainset)
    assert named in str(refusal.value)
    assert task_engine.requests == []


def lambda_metric(constant):
    return lambda example, prediction, trace=None: toy_metric(example, prediction) * constant


@pytest.mark.parametrize(
    ("first", "second", "same"),
    [
        (lambda_metric(1.0), lambda_metric(1.0), True),
        (lambda_metric(1.0), lambda_metric(0.5), False),  # the same code, another closure value
        (lambda e, p, t=None: 1.0, lambda e, p, t=None: 0.0, False),  # two lambdas
    ],
)
def test_the_fingerprint_sees_the_metrics_code_and_closure(tmp_path, caplog, first, second, same):
    """An edited metric of the same name (its code or closure changed) resumes the run: the saved scores are kept,
    and a warning says they are the old metric's."""
    compile_job(tmp_path, metric=first)
    teleprompter, program, trainset, task_engine, _ = build(str(tmp_path), metric=second)
    with caplog.at_level(logging.WARNING, logger="dspy_opro"):
        teleprompter.compile(program, trainset=trainset)
    warned = [m for m in caplog.messages if m.startswith("The metric changed since the saved run")]
    assert len(warned) == (0 if same else 1)
    if not same:
        assert warned[0] == (
            f"The metric changed since the saved run ({callable_fingerprint(first)} -> {callable_fingerprint(second)}):"
            " none of its evaluations raised in the metric, so the finished run's result is returned as the old "
            "metric scored it (a new log_dir scores everything with the new one)")
    assert task_engine.requests == []


def test_the_fingerprint_sees_the_demos_content(tmp_path):
    def program(answer):
        predict = dspy.Predict("question -> answer")
        predict.demos = [dspy.Example(question="item 9", answer=answer)]
        return predict

    teleprompter, _, trainset, _, _ = build(str(tmp_path))
    teleprompter.compile(program("a9"), trainset=trainset)
    teleprompter, _, trainset, task_engine, _ = build(str(tmp_path))
    with pytest.raises(StateFileError, match="the program's structure, instructions or demos"):
        teleprompter.compile(program("wrong"), trainset=trainset)
    assert task_engine.requests == []


@pytest.mark.slow  # SIGKILLs a child process running a compile
def test_a_journal_entry_for_another_instruction_is_ignored(tmp_path):
    full, full_engine, _ = compile_job(tmp_path / "full")
    child = subprocess.run([sys.executable, "-m", "tests.resume_job", str(tmp_path / "crash"),
                            str(tmp_path / "before.log"), "12"], cwd=ROOT, env=ENV, capture_output=True, timeout=300)
    assert child.returncode == -9, child.stderr
    journal = tmp_path / "crash" / PROGRESS_FILE
    *kept, entry = ProgressJournal.read(tmp_path / "crash")
    saved = load_state(tmp_path / "crash")
    assert [e["d"] for e in [*kept, entry]] == [saved.candidates[e["c"]].md5 for e in [*kept, entry]]
    # The same slot, written by a run of another instruction (another process on this folder, say).
    foreign = {**entry, "d": "0123456789abcdef", "s": 1.0 - entry["s"]}
    journal.write_text("".join(json.dumps(e) + "\n" for e in [*kept, foreign]))
    compiled, task_engine, _ = compile_job(tmp_path / "crash")
    assert outcome(compiled) == outcome(full)
    assert len(task_engine.requests) == len(full_engine.requests) - 10  # the foreign entry's evaluation runs again


class ThresholdMetric:
    def __init__(self, threshold):
        self.threshold = threshold

    def __call__(self, example, prediction, trace=None):
        return toy_metric(example, prediction) >= self.threshold


def graded(example, prediction, trace=None, *, weight=1.0):
    return toy_metric(example, prediction) * weight


def test_the_metric_fingerprint_of_callable_objects_and_partials():
    import functools

    from dspy_opro.task.programs import callable_fingerprint

    assert callable_fingerprint(ThresholdMetric(1)) == callable_fingerprint(ThresholdMetric(1))
    assert callable_fingerprint(ThresholdMetric(1)) != callable_fingerprint(ThresholdMetric(0.5))
    assert callable_fingerprint(functools.partial(graded, weight=1.0)) == callable_fingerprint(
        functools.partial(graded, weight=1.0))
    assert callable_fingerprint(functools.partial(graded, weight=1.0)) != callable_fingerprint(
        functools.partial(graded, weight=0.5))
    assert callable_fingerprint(graded).startswith("tests.test_record_files.graded#")
    assert callable_fingerprint(None) is None


def test_a_version_1_record_is_read_with_its_cut_short_candidates_migrated(tmp_path):
    """Version 1 said "unscored" with a reason beginning "cut short" for a candidate a budget stopped; version 2 says
    "cut_short". Another version is refused, naming both."""
    fixture = json.loads((Path(__file__).parent / "fixtures" / "state_small.json").read_text(encoding="utf-8"))
    stopped, outage = fixture["candidates"][1], fixture["candidates"][2]
    stopped.update(status="unscored", reason="cut short: max_metric_calls=40 reached")
    outage.update(status="unscored", reason="LM failures on 2 examples after a retry; last: RateLimitError")
    (tmp_path / "state.json").write_text(json.dumps({**fixture, "schema_version": 1}), encoding="utf-8")
    state = load_state(tmp_path)
    assert state.schema_version == 2
    assert (state.candidates[1].status, state.candidates[1].reason) == ("cut_short", stopped["reason"])
    assert state.candidates[2].status == "unscored"
    (tmp_path / "state.json").write_text(json.dumps({**fixture, "schema_version": 3}), encoding="utf-8")
    with pytest.raises(StateFileError, match="has schema version 3; this dspy-opro reads version 2"):
        load_state(tmp_path)


@pytest.mark.parametrize(
    ("forged", "field"),
    [
        ({"u": {"openai/fake": {"calls": 1, "prompt_tokens": -1000}}}, "field u (usage): not a usage record"),
        ({"u": {"openai/fake": {"calls": 1, "cost": -7.5}}}, "field u (usage): not a usage record"),
        ({"m": 10**9}, "field m (evaluation count): 1000000000 is more than the record's 65 evaluations and the 1 "
                       "journal lines up to this one could hold"),
    ],
)
def test_a_journal_line_with_usage_or_a_count_that_cannot_be_true_is_refused(tmp_path, forged, field):
    from dspy_opro.record.files import journal_entry

    compile_job(tmp_path)
    state = load_state(tmp_path)
    start = state.candidates[0]
    line = {"c": 0, "d": start.md5, "i": 0, "o": "ok", "s": start.scores[0], "e": None, "a": None, "split": "train",
            "u": {}, "m": 12} | forged
    with pytest.raises(StateFileError) as refused:
        journal_entry(line, state, path=tmp_path / PROGRESS_FILE, line=1)
    assert field in str(refused.value) and str(refused.value).startswith(f"{tmp_path / PROGRESS_FILE}, line 1: ")


def test_a_record_with_negative_usage_is_refused_naming_the_field(tmp_path):
    compile_job(tmp_path)
    raw = json.loads((tmp_path / "state.json").read_text())
    raw["usage"]["task"]["cost"] = -7.5
    (tmp_path / "state.json").write_text(json.dumps(raw))
    with pytest.raises(StateFileError) as refused:
        load_state(tmp_path)
    message = str(refused.value)
    assert "does not hold a valid OPRO run record" in message and "usage.task.cost" in message
    assert "greater than or equal to 0" in message


FINGERPRINT_SCRIPT = """
import dspy, numpy
from dspy_opro.task.programs import dataset_fingerprint

class Photo:
    def __init__(self, pixels):
        self.pixels = pixels

rows = [dspy.Example(question="q", image=Photo(numpy.arange(12).reshape(3, 4)), marker=object(),
                     raw=b"abc", tags={"b", "a"}).with_inputs("question", "image")]
print(dataset_fingerprint(rows))
"""


def test_the_trainset_fingerprint_is_the_same_in_every_process_for_objects_whose_repr_holds_an_address():
    prints = [subprocess.run([sys.executable, "-c", FINGERPRINT_SCRIPT], cwd=ROOT, env=ENV, capture_output=True,
                             text=True, timeout=120) for _ in range(2)]
    assert all(p.returncode == 0 for p in prints), prints[0].stderr[-2000:]
    assert prints[0].stdout == prints[1].stdout and len(prints[0].stdout.strip()) == 16


def test_the_trainset_fingerprint_sees_a_change_in_the_middle_of_a_large_array():
    import numpy

    from dspy_opro.task.programs import dataset_fingerprint

    def rows(values):
        return [dspy.Example(question="q", features=values).with_inputs("question", "features")]

    values = numpy.zeros(100_000)
    before = dataset_fingerprint(rows(values))
    changed = values.copy()
    changed[50_000] = 1.0
    assert str(values) == str(changed)  # what the fingerprint saw before: numpy elides the middle
    assert dataset_fingerprint(rows(changed)) != before == dataset_fingerprint(rows(values.copy()))
    # Plain JSON data fingerprints as it always did: saved runs resume.
    plain = [dspy.Example(question="q", answer="a").with_inputs("question")]
    assert dataset_fingerprint(plain) == digest([{"data": {"question": "q", "answer": "a"}, "inputs": ["question"]}])


V02 = Path(__file__).parent / "fixtures" / "v0.2"  # records written by dspy-opro 0.2 (commit 8e8c112)


def compile_v02(log_dir):
    from dspy_opro import OPROTeleprompter
    from dspy_opro.testing import SimulatedEndpoint, simulated_dataset, simulated_metric

    with SimulatedEndpoint() as endpoint:
        optimizer = OPROTeleprompter(simulated_metric, prompt_model=endpoint.lm("openai/sim-opt", num_retries=0),
                                     task_model=endpoint.lm("openai/sim-task", num_retries=0), num_steps=2,
                                     num_candidates=2, num_threads=1, log_dir=str(log_dir))
        run = optimizer.compile(dspy.Predict("question -> answer"), trainset=simulated_dataset(4)).opro_run
        return run, [r.kind for r in endpoint.requests]


@pytest.mark.parametrize(("record", "served"), [
    ("finished", []),  # its result, at once
    ("failed", ["opro"] + ["task"] * 8 + ["opro"] + ["task"] * 8),  # stopped before step 0: the start is kept
    ("killed", ["task"] * 6 + ["opro"] + ["task"] * 8),  # killed in step 0 (2 of its 8 journaled): the rest, step 1
])
def test_a_record_of_dspy_opro_0_2_is_migrated_and_resumes(tmp_path, record, served):
    shutil.copytree(V02 / record, tmp_path / record)
    saved = json.loads((V02 / record / "state.json").read_text())
    assert saved["schema_version"] == 1 and "racing_alpha" in saved["fingerprint"]["settings"]
    run, kinds = compile_v02(tmp_path / record)
    assert kinds == served and run.status == "finished" and run.schema_version == 2
    assert run.metric_calls == saved["metric_calls"] + kinds.count("task") + (2 if record == "killed" else 0)
    assert "racing_alpha" not in run.fingerprint.settings and run.fingerprint.settings["racing"] is False


def test_a_label_free_record_of_0_2_is_refused_with_advice_that_works(tmp_path):
    raw = json.loads((V02 / "finished" / "state.json").read_text())
    raw["fingerprint"]["settings"]["label_free"] = raw["config"]["label_free"] = True
    (tmp_path / "state.json").write_text(json.dumps(raw))
    with pytest.raises(StateFileError) as refused:
        load_state(tmp_path)
    assert str(refused.value) == (
        f"{tmp_path / 'state.json'} was written by dspy-opro 0.2 for label-free OPRO (metric=None with judge_model), "
        "which 0.3 runs with another metric, metric=dspy_opro.PairwisePreference(judge_model=...): its scores cannot "
        "be resumed. Compile with a new log_dir (the 0.2 record stays readable by `python -m dspy_opro report`).")


def _forge(tmp_path, change):
    compile_job(tmp_path)
    raw = json.loads((tmp_path / "state.json").read_text())
    change(raw)
    (tmp_path / "state.json").write_text(json.dumps(raw))


def _swap_candidates(raw):
    raw["candidates"][1], raw["candidates"][2] = raw["candidates"][2], raw["candidates"][1]
    raw["candidates"][1]["id"], raw["candidates"][2]["id"] = 1, 2


@pytest.mark.parametrize(("change", "named"), [
    (lambda raw: raw["candidates"][1].update(id=7), "candidate 1, field id: 7 is not its position 1 in candidates"),
    (lambda raw: raw["selection"].update(candidate_id=99),
     "candidate 99, field selection.candidate_id: the record has candidates 0 to "),
    (lambda raw: raw["steps"][0]["replies"][0].update(candidate_id=-3),
     "candidate -3, field steps[0].replies candidate_id: the record has candidates 0 to "),
    (_swap_candidates, "candidate 1, field instruction: "),
])
def test_a_forged_record_is_refused_naming_the_field(tmp_path, change, named):
    _forge(tmp_path, change)
    with pytest.raises(StateFileError) as refused:
        load_state(tmp_path)
    assert named in str(refused.value)
    assert str(refused.value).endswith("The record was changed outside dspy-opro: restore it from a backup, or "
                                       "delete the log_dir to start afresh.")
    teleprompter, program, trainset, task_engine, _ = build(str(tmp_path))
    with pytest.raises(StateFileError):
        teleprompter.compile(program, trainset=trainset)
    assert task_engine.requests == []
