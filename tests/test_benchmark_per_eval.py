"""benchmarks/overhead_per_eval.py: its section of results/overhead.md is replaced in place, survives overhead.py's
rewrite of the file and keeps the hand-written diagnosis; the figures it reports are paired per repetition; a run
whose request log is not one task request per evaluation fails; and its three runners run on the current engine,
in-process and (slow) through LiteLLM against the endpoint in its own process (one repetition, a few examples: a
check that they work, score alike and send one request per evaluation, not a timing)."""

from __future__ import annotations

import pytest

from tests.benchmark_modules import load_benchmark

per_eval = load_benchmark("overhead_per_eval")
START, END = per_eval.START_MARK, per_eval.END_MARK
DIAG_START, DIAG_END = per_eval.DIAGNOSIS_START, per_eval.DIAGNOSIS_END


def test_section_goes_before_machine_then_is_replaced_in_place_keeping_the_diagnosis(tmp_path):
    out = tmp_path / "overhead.md"
    out.write_text("# Overhead\n\ntable\n\n## Machine\n\n- nproc: 2\n", encoding="utf-8")
    per_eval.write_section(f"{START}\nfirst figures\n{END}", out)
    assert out.read_text(encoding="utf-8") == (
        f"# Overhead\n\ntable\n\n{START}\nfirst figures\n{END}\n\n## Machine\n\n- nproc: 2\n")

    text = out.read_text(encoding="utf-8").replace(END, f"{DIAG_START}\nwhy\n{DIAG_END}\n{END}")
    out.write_text(text, encoding="utf-8")
    per_eval.write_section(f"{START}\nsecond figures\n{END}", out)
    assert out.read_text(encoding="utf-8") == (
        f"# Overhead\n\ntable\n\n{START}\nsecond figures\n{DIAG_START}\nwhy\n{DIAG_END}\n{END}\n\n"
        "## Machine\n\n- nproc: 2\n")


def test_existing_section_is_what_overhead_py_carries_over(tmp_path):
    out = tmp_path / "overhead.md"
    assert per_eval.existing_section(out) is None
    out.write_text(f"a\n{START}\nx\n{DIAG_START}\nd\n{DIAG_END}\n{END}\nb\n", encoding="utf-8")
    kept = per_eval.existing_section(out)
    assert kept == f"{START}\nx\n{DIAG_START}\nd\n{DIAG_END}\n{END}"
    # a fresh measurement keeps the old diagnosis
    assert per_eval.keep_diagnosis(f"{START}\nnew\n{END}", kept) == f"{START}\nnew\n{DIAG_START}\nd\n{DIAG_END}\n{END}"
    assert per_eval.keep_diagnosis(f"{START}\nnew\n{END}", None) == f"{START}\nnew\n{END}"


def test_the_order_rotates_every_repetition():
    names = ["a", "b", "c"]
    assert [per_eval.rotated(names, rep) for rep in range(4)] == [
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]


def test_ratios_are_paired_per_repetition_with_their_quartiles():
    anchor = per_eval.Timing(wall=[1.0, 2.0, 1.0, 4.0, 1.0], cpu=[1.0, 1.0, 1.0, 1.0, 1.0])
    timing = per_eval.Timing(wall=[1.1, 2.4, 1.3, 4.0, 1.2], cpu=[2.0, 1.0, 1.5, 1.25, 1.0])
    # per repetition: 1.1, 1.2, 1.3, 1.0, 1.2; the ratio of the medians would be 1.3 / 1.0
    assert tuple(round(x, 3) for x in per_eval.ratio(timing, anchor, "wall")) == (1.2, 1.1, 1.2)
    assert tuple(round(x, 3) for x in per_eval.ratio(timing, anchor, "cpu")) == (1.25, 1.0, 1.5)
    single = per_eval.Timing(wall=[3.0], cpu=[3.0])
    assert per_eval.ratio(single, per_eval.Timing(wall=[2.0], cpu=[2.0]), "wall") == (1.5, 1.5, 1.5)


def test_the_goals_are_printed_for_scoring_only_beside_both_ratios():
    assert per_eval.GOALS == {(per_eval.IN_PROCESS, per_eval.SCORING): 1.15, (per_eval.LITELLM, per_eval.SCORING): 1.10}
    assert per_eval.verdict(1.10, 1.05, 1.10) == "≤ 1.10: met"
    assert per_eval.verdict(1.12, 1.05, 1.10) == "≤ 1.10: met in CPU, not in wall"
    assert per_eval.verdict(1.05, 1.12, 1.10) == "≤ 1.10: met in wall, not in CPU"
    assert per_eval.verdict(1.2, 1.2, 1.15) == "≤ 1.15: not met"
    assert per_eval.verdict(1.2, 1.2, None) == ""


def _log(examples, model="sim-task"):
    return [(200, model, "task", example.question) for example in examples]


def test_the_request_log_must_be_one_task_request_per_evaluation():
    examples = per_eval.simulated_dataset(3)
    per_eval.check_requests("run", _log(examples), examples)  # exactly one per example: passes

    with pytest.raises(RuntimeError) as missing:
        per_eval.check_requests("run", _log(examples[:2]), examples)
    assert str(missing.value) == ("run: the endpoint's request log is not one task request per evaluation: "
                                  "2 requests for 3 evaluations; 1 example(s) not asked, 0 asked more than once or "
                                  "not an example's")

    with pytest.raises(RuntimeError) as repeated:
        per_eval.check_requests("run", _log([examples[0], examples[0], examples[1]]), examples)
    assert str(repeated.value).endswith(": 1 example(s) not asked, 1 asked more than once or not an example's")

    extra = [*_log(examples), (200, "sim-task", "opro", None)]
    with pytest.raises(RuntimeError) as other:
        per_eval.check_requests("compile", extra, examples)
    assert str(other.value) == ("compile: the endpoint's request log is not one task request per evaluation: "
                                "4 requests for 3 evaluations; 1 request(s) of kind 'opro', model 'sim-task', status "
                                "200; 0 example(s) not asked, 1 asked more than once or not an example's")

    failed = [(500, "sim-task", "task", examples[0].question), *_log(examples[1:])]
    with pytest.raises(RuntimeError, match=r"evaluation: 1 request\(s\) of kind 'task', model 'sim-task', status 500$"):
        per_eval.check_requests("run", failed, examples)


def test_runners_that_score_differently_fail_the_run():
    per_eval.check_same_scores({"a": per_eval.Timing(scores=[50.0, 50.0]), "b": per_eval.Timing(scores=[50.0])})
    with pytest.raises(RuntimeError) as differ:
        per_eval.check_same_scores({"a": per_eval.Timing(scores=[50.0]), "b": per_eval.Timing(scores=[50.0, 25.0])})
    assert str(differ.value) == "the runners did not score alike: {'a': [50.0], 'b': [25.0, 50.0]}"


def test_quick_keeps_out_and_accepts_the_options_overhead_py_passes():
    args = per_eval.arguments(["--quick", "--no-probes", "--no-units", "--latency", "0.02", "--out", "x.md"])
    assert (args.n_in_process, args.reps, args.n_litellm, args.reps_litellm) == (64, 3, 64, 3)
    assert (args.latency, args.out, args.threads_in_process, args.threads_litellm) == (0.02, "x.md", 4, 16)
    full = per_eval.arguments([])
    assert (full.n_in_process, full.reps, full.n_litellm, full.reps_litellm) == (200, 21, 200, 15)


def test_the_three_runners_run_in_process_and_score_alike(capsys):
    examples = per_eval.simulated_dataset(12)
    timings = per_eval.side_by_side(per_eval.RUNNERS, per_eval.instant_lm(), examples, threads=2, reps=1)
    assert list(timings) == [per_eval.EVALUATE, per_eval.SCORING, per_eval.COMPILE]
    for timing in timings.values():
        assert len(timing.wall) == len(timing.cpu) == len(timing.scores) == 1
    # DummyLM answers "7" to every question: the score is the share of examples whose answer is 7
    expected = round(100 * sum(example.answer == "7" for example in examples) / len(examples), 2)
    assert {score for timing in timings.values() for score in timing.scores} == {expected}
    progress = [line for line in capsys.readouterr().err.splitlines() if line.startswith("  repetition")]
    assert len(progress) == 1
    assert progress[0].startswith("  repetition 1/1: dspy.Evaluate ")
    assert f", {per_eval.SCORING} " in progress[0] and f", {per_eval.COMPILE} " in progress[0]


@pytest.mark.slow  # a process of its own for the endpoint, and LiteLLM's import: about 15 s
def test_the_three_runners_run_through_litellm_with_one_task_request_per_evaluation(monkeypatch):
    from tests.benchmark_modules import BENCHMARKS

    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the endpoint's process imports the script by name
    examples = per_eval.simulated_dataset(6)
    timings = per_eval.litellm_setting(0.0, examples, threads=3, reps=1)  # every run's request log checked
    assert list(timings) == [per_eval.EVALUATE, per_eval.SCORING, per_eval.COMPILE]
    scores = {score for timing in timings.values() for score in timing.scores}
    assert len(scores) == 1 and len(timings[per_eval.SCORING].wall) == 1
