"""What a saved program carries of its run: a short summary by default (the record stays in log_dir), the whole
record with ``track_stats=True``; both load with ``dspy.load`` and answer as the compiled program does."""

from pathlib import Path

import dspy
import pytest

from dspy_opro import OPRO, OPRORunSummary, RunState
from dspy_opro.record.files import load_state
from dspy_opro.testing import SimulatedEndpoint, simulated_dataset, simulated_metric

pytestmark = [pytest.mark.slow, pytest.mark.compat]  # two compiles, saved and loaded back


def folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One compile per ``track_stats`` value (4 steps x 4 candidates on 20 examples), saved both ways."""
    root = tmp_path_factory.mktemp("saving")
    out = {}
    with SimulatedEndpoint() as endpoint:
        for track_stats in (False, True):
            optimizer = OPRO(simulated_metric, prompt_model=endpoint.lm("openai/sim-optimizer"),
                             task_model=endpoint.lm("openai/sim-task"), num_steps=4, num_candidates=4,
                             num_threads=4, display_progress=False, log_dir=root / f"run-{track_stats}",
                             track_stats=track_stats)
            compiled = optimizer.compile(dspy.Predict("question -> answer"), trainset=simulated_dataset(20))
            compiled.save(str(root / f"program-{track_stats}"), save_program=True)
            compiled.save(str(root / f"program-{track_stats}.json"))
            out[track_stats] = (compiled, root)
        yield out, endpoint


def test_the_saved_program_carries_a_summary_and_loads(saved):
    programs, endpoint = saved
    compiled, root = programs[False]
    record = compiled.opro_run
    assert isinstance(record, RunState) and len(record.candidates) > 10  # whole in memory
    folder = root / "program-False"
    loaded = dspy.load(str(folder), allow_pickle=True)
    summary = loaded.opro_run
    assert isinstance(summary, OPRORunSummary)
    chosen = record.candidates[record.selection.candidate_id]
    assert (summary.candidate_id, summary.score, summary.step, summary.instructions) == (
        chosen.id, chosen.score, chosen.step, chosen.instructions)
    assert (summary.metric_calls, summary.status, summary.selected_by) == (record.metric_calls, "finished", "train")
    assert summary.log_dir == str((root / "run-False").resolve())
    assert load_state(summary.log_dir).model_dump() == record.model_dump()
    assert [entry["score"] for entry in loaded.candidate_programs] == [
        entry["score"] for entry in compiled.candidate_programs]
    assert all("program" not in entry for entry in loaded.candidate_programs)
    assert loaded.signature.instructions == compiled.signature.instructions
    # The whole folder (program.pkl and metadata.json) is a few KB; the record it leaves out is 20 KB and more.
    assert folder_size(folder) < 10_000 < (root / "run-False" / "state.json").stat().st_size
    # It answers as the compiled program does.
    question = simulated_dataset(1, seed=9)[0].question
    with dspy.context(lm=endpoint.lm("openai/sim-task")):
        assert loaded(question=question).answer == compiled(question=question).answer


def test_track_stats_carries_the_whole_record(saved):
    programs, _ = saved
    compiled, root = programs[True]
    loaded = dspy.load(str(root / "program-True"), allow_pickle=True)
    assert isinstance(loaded.opro_run, RunState)
    assert loaded.opro_run.model_dump() == compiled.opro_run.model_dump()
    assert len(loaded.candidate_programs) == len(compiled.candidate_programs)
    assert all(isinstance(entry["program"], dspy.Predict) for entry in loaded.candidate_programs)
    assert folder_size(root / "program-True") > 4 * folder_size(root / "program-False")


@pytest.mark.parametrize("track_stats", [False, True])
def test_the_json_save_holds_the_program_state_alone(saved, track_stats):
    programs, _ = saved
    compiled, root = programs[track_stats]
    path = root / f"program-{track_stats}.json"
    assert path.stat().st_size < 1_000
    fresh = dspy.Predict("question -> answer")
    fresh.load(str(path))
    assert fresh.signature.instructions == compiled.signature.instructions


@pytest.mark.parametrize("how", ["deepcopy", "reset_copy", "copy.deepcopy"])
def test_a_copy_of_the_compiled_program_keeps_the_candidate_programs_and_the_whole_record(saved, how):
    """``deepcopy()`` (which ``reset_copy()`` and BootstrapFewShot call) copies; it does not summarize as pickling
    does: every entry keeps its program, which answers as the candidate's instructions say."""
    import copy

    programs, _ = saved
    compiled, _ = programs[False]
    copied = {"deepcopy": compiled.deepcopy, "reset_copy": compiled.reset_copy,
              "copy.deepcopy": lambda: copy.deepcopy(compiled)}[how]()
    original = compiled.candidate_programs
    assert len(copied.candidate_programs) == len(original) > 10
    assert [(e["score"], e["instructions"], e["step"]) for e in copied.candidate_programs] == [
        (e["score"], e["instructions"], e["step"]) for e in original]
    for entry in copied.candidate_programs:
        assert entry["program"] is not None and all(entry["program"] is not e["program"] for e in original)
        assert {n: p.signature.instructions for n, p in entry["program"].named_predictors()} == entry["instructions"]
    assert isinstance(copied.opro_run, RunState) and copied.opro_run is not compiled.opro_run
    assert copied.opro_run.model_dump() == compiled.opro_run.model_dump()


def test_a_pickled_compiled_program_carries_the_summary_and_the_candidates_without_their_programs(saved):
    import cloudpickle

    programs, _ = saved
    compiled, _ = programs[False]
    restored = cloudpickle.loads(cloudpickle.dumps(compiled))
    assert isinstance(restored.opro_run, OPRORunSummary)
    assert restored.opro_run.candidate_id == compiled.opro_run.selection.candidate_id
    assert [sorted(e) for e in restored.candidate_programs] == [
        ["instructions", "score", "step", "val_score"]] * len(compiled.candidate_programs)
