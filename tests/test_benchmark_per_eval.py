"""The report plumbing of benchmarks/overhead_per_eval.py: its section of results/overhead.md is replaced in place,
survives overhead.py's rewrite of the file, and keeps the hand-written diagnosis; probes are ranked by what they
save."""

from __future__ import annotations

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


def test_savings_rank_probes_by_cpu_saved_against_scoring_only():
    def timing(wall: float, cpu: float):
        return per_eval.Timing(wall=[wall], cpu=[cpu])

    timings = {
        per_eval.EVALUATE: timing(1.0, 1.0),
        per_eval.COMPILE: timing(2.0, 2.0),
        per_eval.SCORING: timing(1.8, 1.6),
        "small": timing(1.7, 1.5),
        "big": timing(1.1, 1.0),
    }
    ranked = per_eval.savings(timings, n=100)
    assert [name for name, *_ in ranked] == ["big", "small"]
    name, wall_saved, cpu_saved, wall_ratio, cpu_ratio = ranked[0]
    assert (round(wall_saved), round(cpu_saved), round(wall_ratio, 3), round(cpu_ratio, 3)) == (7000, 6000, 1.1, 1.0)
