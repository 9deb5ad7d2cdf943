"""OPRO's time per evaluation against stock ``dspy.Evaluate``: the two ratios of issue 14, probes and unit costs.

One evaluation is one program run on one training example followed by the metric. The script measures, side by
side in one process with interleaved repetitions (the order rotates every repetition; medians reported), on the
same program (``dspy.Predict("question -> answer")``), the same examples and the same thread count:

* **in-process**: DSPy's ``DummyLM`` answering instantly, 4 threads. Here an evaluation costs only DSPy's own work,
  so whatever OPRO adds per evaluation shows in full;
* **LiteLLM**: ``dspy.LM`` through LiteLLM against the simulated OpenAI-compatible endpoint
  (:class:`dspy_opro.testing.SimulatedEndpoint`, in a process of its own, 50 ms per request), 16 threads. The
  endpoint's request log must show exactly one request per evaluation for every run, or the script fails.

For each setting three runners are timed:

* ``dspy.Evaluate(devset=examples, metric=..., num_threads=T)(program)``: the anchor;
* ``OPROTeleprompter(num_steps=0).compile(program, trainset=examples)``: the public API; it scores the program as
  given on every example (step -1) and also pays the per-compile set-up (fingerprints, copies, selection);
* OPRO scoring only: ``OPRORun.scorer.score([start], "train")`` timed alone, the run built beforehand: the
  per-evaluation path (job dispatch, worker, usage capture, recording) and nothing else.

Ratios are wall time over ``dspy.Evaluate``'s wall time; CPU time of the process (all threads) is reported next to
them, since the machine is shared and CPU time is the steadier of the two.

**Probes** (``--probes``; in-process, and two of them on LiteLLM): OPRO scoring only, with one piece of the
per-evaluation path removed (or, for comparison, the per-evaluation DSPy callback of before put back) by a
monkeypatch of :class:`dspy_opro.scoring.usage.UsageCapture` for that run. They show what each piece costs. A probe
whose target no longer exists in the code is reported as not applicable.

**Unit costs** (``--units``): single-thread micro-benchmarks of each piece in microseconds (no thread contention),
against the cost of the DSPy call itself.

    python benchmarks/overhead_per_eval.py             # ratios, probes, unit costs: about 4 minutes on 2 cores
    python benchmarks/overhead_per_eval.py --quick     # fewer repetitions and examples, same report
    python benchmarks/overhead_per_eval.py --no-probes --no-units   # the two ratios only

The report replaces the section between the markers ``<!-- per-evaluation:start -->`` and
``<!-- per-evaluation:end -->`` in ``results/overhead.md`` (``overhead.py`` keeps that section when it rewrites the
file), or goes to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402
from dspy.utils.dummies import DummyLM  # noqa: E402

import dspy_opro.scoring.usage as usage_module  # noqa: E402
from dspy_opro import OPROTeleprompter  # noqa: E402
from dspy_opro.testing import simulated_dataset, simulated_metric  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "overhead.md"
START_MARK = "<!-- per-evaluation:start -->"
END_MARK = "<!-- per-evaluation:end -->"
TASK_MODEL = "openai/sim-task"


def program() -> dspy.Module:
    return dspy.Predict("question -> answer")


def instant_lm() -> dspy.BaseLM:
    """DSPy's DummyLM, answering every request at once with the same chat-formatted answer."""
    return DummyLM({"": {"answer": "7"}})


# ------------------------------------------------------------------------------------------------ the runners


@dataclass
class Timing:
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    @property
    def wall_median(self) -> float:
        return statistics.median(self.wall)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu)


@contextlib.contextmanager
def clock(into: Timing) -> Iterator[None]:
    gc.collect()
    cpu, wall = time.process_time(), time.perf_counter()
    yield
    into.wall.append(time.perf_counter() - wall)
    into.cpu.append(time.process_time() - cpu)


def run_evaluate(lm: dspy.BaseLM, examples: list[dspy.Example], threads: int, into: Timing) -> None:
    student = program()
    evaluator = dspy.Evaluate(devset=examples, metric=simulated_metric, num_threads=threads, display_progress=False,
                              max_errors=len(examples) + 1)
    with clock(into), dspy.context(lm=lm):
        evaluator(student)


def run_compile(lm: dspy.BaseLM, examples: list[dspy.Example], threads: int, into: Timing) -> None:
    optimizer = OPROTeleprompter(metric=simulated_metric, prompt_model=lm, task_model=lm, num_steps=0,
                                 num_threads=threads)
    with clock(into):
        compiled = optimizer.compile(program(), trainset=examples)
    _check_scored(compiled.opro_run, len(examples))


def run_scoring(lm: dspy.BaseLM, examples: list[dspy.Example], threads: int, into: Timing) -> None:
    """Time ``OPRORun.scorer.score`` of the starting program alone; the run is built (and announced) first."""
    from dspy_opro.run import OPRORun

    optimizer = OPROTeleprompter(metric=simulated_metric, prompt_model=lm, task_model=lm, num_steps=0,
                                 num_threads=threads)
    run = OPRORun(optimizer.config, program(), examples, None)
    run._announce()
    try:
        with clock(into):
            run.scorer.score([run.state.candidates[0]], "train")
    finally:
        run.evaluator.close()
        run.recorder.close()
        progress = getattr(run, "_progress", None)
        if progress is not None:
            progress.close()
    _check_scored(run.state, len(examples))


def _check_scored(state: Any, n: int) -> None:
    start = state.candidates[0]
    if start.status != "scored" or sum(score is not None for score in start.scores) != n:
        raise RuntimeError(f"OPRO did not score the {n} examples: status {start.status}, {start.reason}")


# ------------------------------------------------------------------------------------------------ probes


def _probe_patches() -> dict[str, dict[tuple[Any, str], Any]]:
    """Probe name -> {(owner, attribute): replacement}. Each changes one piece of OPRO's per-evaluation path
    (:class:`dspy_opro.scoring.usage.UsageCapture`, which :func:`dspy_opro.scoring.evaluation.run_example` uses
    twice per evaluation: once for the program, once for the metric)."""
    capture_cls = getattr(usage_module, "UsageCapture", None)
    counter_cls = getattr(usage_module, "LMCallCounter", None)
    if capture_cls is None:
        return {}
    original_active = capture_cls.active

    def no_capture(self: Any, **overrides: Any) -> Any:
        return dspy.context(**overrides)

    def no_usage(self: Any, **_: Any) -> dict[str, Any]:
        return {}

    def no_sink(self: Any, **overrides: Any) -> Any:
        return dspy.context(usage_tracker=self._tracker, **overrides)

    probes: dict[str, dict[tuple[Any, str], Any]] = {
        "without the usage capture (no tracker, no history sink, no `ModelUsage`)": {
            (capture_cls, "active"): no_capture, (capture_cls, "result"): no_usage},
        "without the history sink (calls, cache hits, costs)": {(capture_cls, "active"): no_sink},
        "without building `ModelUsage` and `state.usage.record`": {(capture_cls, "result"): no_usage},
    }
    if counter_cls is not None:
        def with_callback(self: Any, **overrides: Any) -> Any:
            self._watch_in_flight()  # what every evaluation paid before: a DSPy callback in the settings
            return original_active(self, **overrides)

        probes["with the per-evaluation DSPy callback of before (`LMCallCounter` in the settings)"] = {
            (capture_cls, "active"): with_callback}
    return probes


@contextlib.contextmanager
def patched(replacements: dict[tuple[Any, str], Any]) -> Iterator[None]:
    saved = [(owner, name, owner.__dict__[name]) for owner, name in replacements]
    for (owner, name), value in replacements.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def run_probe(replacements: dict[tuple[Any, str], Any]) -> Callable[..., None]:
    def runner(lm: dspy.BaseLM, examples: list[dspy.Example], threads: int, into: Timing) -> None:
        with patched(replacements):
            run_scoring(lm, examples, threads, into)

    return runner


# ------------------------------------------------------------------------------------------------ side by side


def side_by_side(runners: dict[str, Callable[..., None]], lm: dspy.BaseLM, examples: list[dspy.Example],
                 threads: int, reps: int, check: Callable[[str], None] | None = None) -> dict[str, Timing]:
    """Every runner once per repetition, the order rotated each time; ``check(name)`` after every run."""
    timings = {name: Timing() for name in runners}
    names = list(runners)
    for name in names:  # warm-up: lazy imports, first calls, thread pools
        runners[name](lm, examples[: min(8, len(examples))], threads, Timing())
    for rep in range(reps):
        order = names[rep % len(names):] + names[: rep % len(names)]
        for name in order:
            runners[name](lm, examples, threads, timings[name])
            if check is not None:
                check(name)
        print(f"  repetition {rep + 1}/{reps}: " + ", ".join(
            f"{timings[name].wall[-1]:.3f}s" for name in names), file=sys.stderr, flush=True)
    return timings


def litellm_setting(latency: float, examples: list[dspy.Example], threads: int, reps: int,
                    runners: dict[str, Callable[..., None]]) -> dict[str, Timing]:
    """The runners against the simulated endpoint through LiteLLM; each run must send exactly one request per
    example, counted in the endpoint's own log."""
    sys.path.insert(0, str(Path(__file__).parent))
    from overhead import Server  # the endpoint in a process of its own, with its request log

    server = Server(latency, "process")
    try:
        lm = dspy.LM(TASK_MODEL, api_base=server.base_url, api_key="x", engine="litellm", cache=False, num_retries=0)
        expected: dict[str, int] = {}

        def reset_then(name: str) -> None:
            log = server.log()
            ok = sum(1 for status, model, _ in log if status == 200 and model == TASK_MODEL.split("/", 1)[1])
            if name in expected and ok != expected[name]:
                raise RuntimeError(f"{name}: the endpoint answered {ok} requests, expected {expected[name]}")
            server.reset()

        wrapped = {}
        for name, runner in runners.items():
            expected[name] = len(examples)

            def reset_first(lm_: Any, examples_: Any, threads_: int, into: Timing, _runner: Any = runner) -> None:
                server.reset()
                _runner(lm_, examples_, threads_, into)

            wrapped[name] = reset_first
        return side_by_side(wrapped, lm, examples, threads, reps, check=reset_then)
    finally:
        server.close()


# ------------------------------------------------------------------------------------------------ unit costs


def per_call(function: Callable[[], Any], repeat: int, rounds: int = 5) -> float:
    """CPU microseconds per call of ``function``: the median over ``rounds`` rounds of ``repeat`` calls."""
    results = []
    for _ in range(rounds):
        gc.collect()
        started = time.process_time()
        for _ in range(repeat):
            function()
        results.append((time.process_time() - started) / repeat * 1e6)
    return statistics.median(results)


def paired_functions(functions: dict[str, Callable[[], Any]], repeat: int, rounds: int = 7) -> dict[str, float]:
    """CPU microseconds per call of each function, measured in turn within every round; the first is the base, and
    every other figure is the median over rounds of its difference to the base in the same round."""
    names = list(functions)
    per_round: dict[str, list[float]] = {name: [] for name in names}
    for function in functions.values():  # warm
        function()
    for _ in range(rounds):
        for name in names:
            per_round[name].append(per_call(functions[name], repeat, rounds=1))
    base = names[0]
    result = {base: statistics.median(per_round[base])}
    for name in names[1:]:
        result[name] = statistics.median(v - b for v, b in zip(per_round[name], per_round[base], strict=True))
    return result


def unit_costs(repeat: int) -> list[tuple[str, float, str]]:
    """(what, microseconds, per what) for the pieces of OPRO's per-evaluation path, one thread, no contention."""
    from dspy.dsp.utils.settings import thread_local_overrides

    from dspy_opro.record.files import ProgressJournal, save_state
    from dspy_opro.record.state import RunState, UsageRecord
    from dspy_opro.run import OPRORun
    from dspy_opro.scoring.evaluation import ExampleJob, run_example
    from dspy_opro.task.programs import with_instructions

    lm = instant_lm()
    example = simulated_dataset(1)[0]
    student = program()
    settings = {"lm": lm}
    rows: list[tuple[str, float, str]] = []

    def under(overrides: dict[str, Any]) -> Callable[[], None]:
        def predict_and_metric() -> None:
            with dspy.context(**overrides):
                simulated_metric(example, student(**example.inputs()))

        return predict_and_metric

    job = ExampleJob(candidate_id=1, index=0, program=student, example=example, metric=simulated_metric,
                     failure_score=0.0, settings=settings)
    lm_with_callback = instant_lm()
    lm_with_callback.callbacks = [usage_module.LMCallCounter()]
    costs = paired_functions({
        "base": under(settings),
        "run_example": lambda: run_example(job),
        "callback": under({**settings, "callbacks": [usage_module.LMCallCounter()]}),
        "lm callback": under({"lm": lm_with_callback}),
        "tracker": under({**settings, "usage_tracker": usage_module._SharedTracker()}),
    }, repeat)
    rows.append(("`Predict` + metric with DummyLM in a `dspy.context(lm=...)`: the evaluation itself (what "
                 "`dspy.Evaluate` pays per item, apart from its executor)", costs["base"], "evaluation"))
    rows.append(("+ OPRO's `run_example` around it instead (usage capture for the program and the metric, the "
                 "result)", costs["run_example"], "evaluation"))
    rows.append(("+ a DSPy callback in the settings (`LMCallCounter`, what every evaluation paid before; now only "
                 "a program that forks): DSPy's callback path on every module, adapter and LM call",
                 costs["callback"], "evaluation"))
    rows.append(("+ the same callback on the LM instance only (`lm.callbacks`), for comparison",
                 costs["lm callback"], "evaluation"))
    rows.append(("+ a usage tracker in the context (`_SharedTracker`)", costs["tracker"], "evaluation"))

    overrides = {"lm": lm, "trace": []}

    def enter_exit() -> None:
        with dspy.context(**overrides):
            pass

    rows.append(("`dspy.context(lm=..., trace=[])`: enter and exit once", per_call(enter_exit, repeat), "context"))

    def capture_and_result() -> Any:
        capture = usage_module.UsageCapture()
        capture._tracker.add_usage("dummy", {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15})
        return capture.result()

    rows.append(("`UsageCapture()` + one tracker entry + `result()` (builds a `ModelUsage`, price looked up)",
                 per_call(capture_and_result, repeat), "evaluation"))
    usage = capture_and_result()
    totals = UsageRecord()
    rows.append(("`state.usage.record(\"task\", usage)` (main thread)",
                 per_call(lambda: totals.record("task", usage), repeat), "evaluation"))

    def new_job() -> Any:
        thread_local_overrides.get().copy()
        return ExampleJob(candidate_id=1, index=0, program=student, example=example, metric=simulated_metric,
                          failure_score=0.0, settings=settings)

    rows.append(("`ExampleJob(...)` + the overrides copy at submission", per_call(new_job, repeat), "evaluation"))

    import tqdm

    with open(os.devnull, "w") as sink:
        bar = tqdm.tqdm(total=10**9, disable=False, leave=False, file=sink)
        rows.append(("`tqdm.update(1)` (bar shown, as on a terminal)", per_call(lambda: bar.update(1), repeat),
                     "evaluation"))
        bar.close()
    quiet = tqdm.tqdm(total=10**9, disable=None)
    rows.append(("`tqdm.update(1)` (bar off: output is not a terminal, as here)",
                 per_call(lambda: quiet.update(1), repeat), "evaluation"))

    with tempfile.TemporaryDirectory() as folder:
        journal = ProgressJournal(folder)
        entry = {"c": 3, "i": 17, "o": "ok", "s": 1.0, "e": None, "a": None, "split": "train"}
        rows.append(("`ProgressJournal.append` (json line + flush; with `log_dir` only)",
                     per_call(lambda: journal.append(entry), repeat), "evaluation"))
        journal.close()

        state = _state_with(RunState, n=300, candidates=9)
        rows.append(("`save_state`, 9 candidates x 300 examples (with `log_dir` only)",
                     per_call(lambda: save_state(state, folder), max(3, repeat // 200)), "save"))

    examples = simulated_dataset(300)
    optimizer = OPROTeleprompter(metric=simulated_metric, prompt_model=lm, task_model=lm, num_steps=0)

    def set_up() -> None:
        OPRORun(optimizer.config, student, examples, None).recorder.close()

    rows.append(("`OPRORun(...)` set-up for 300 examples (fingerprints, label keys, program copy), divided by 300",
                 per_call(set_up, 5) / 300, "example, once per compile"))
    name = next(iter(student.named_predictors()))[0]
    instructions = {name: "Solve the word problem and give the final number."}
    rows.append(("`with_instructions` (a program deep copy with new instructions)",
                 per_call(lambda: with_instructions(student, instructions), max(10, repeat // 20)), "candidate"))
    return rows


def litellm_unit_costs(repeat: int) -> list[tuple[str, float, str]]:
    """Client CPU microseconds per ``Predict`` + metric through LiteLLM (endpoint in its own process, no latency),
    and what ``run_example``, a DSPy callback or a usage tracker adds; one thread."""
    from dspy_opro.scoring.evaluation import ExampleJob, run_example

    sys.path.insert(0, str(Path(__file__).parent))
    from overhead import Server

    server = Server(0.0, "process")
    try:
        lm = dspy.LM(TASK_MODEL, api_base=server.base_url, api_key="x", engine="litellm", cache=False, num_retries=0)
        example = simulated_dataset(1)[0]
        student = program()
        settings = {"lm": lm}

        def under(overrides: dict[str, Any]) -> Callable[[], None]:
            def predict_and_metric() -> None:
                with dspy.context(**overrides):
                    simulated_metric(example, student(**example.inputs()))

            return predict_and_metric

        job = ExampleJob(candidate_id=1, index=0, program=student, example=example, metric=simulated_metric,
                         failure_score=0.0, settings=settings)
        costs = paired_functions({
            "base": under(settings),
            "run_example": lambda: run_example(job),
            "callback": under({**settings, "callbacks": [usage_module.LMCallCounter()]}),
            "tracker": under({**settings, "usage_tracker": usage_module._SharedTracker()}),
        }, repeat, rounds=15)
        return [
            ("LiteLLM: `Predict` + metric, client CPU (endpoint in another process, no latency)", costs["base"],
             "evaluation"),
            ("LiteLLM: + OPRO's `run_example` around it instead", costs["run_example"], "evaluation"),
            ("LiteLLM: + the DSPy callback (`LMCallCounter`) in the settings", costs["callback"], "evaluation"),
            ("LiteLLM: + the usage tracker (`_SharedTracker`) in the context", costs["tracker"], "evaluation"),
        ]
    finally:
        server.close()


def _state_with(state_cls: Any, *, n: int, candidates: int) -> Any:
    from dspy_opro.record.state import Candidate, Fingerprint

    state = state_cls(fingerprint=Fingerprint(config="c", trainset="t", valset="v", program="p"), config={},
                      predictors=["predict"], train_size=n, val_size=0)
    for i in range(candidates):
        state.candidates.append(Candidate(id=i, step=i - 1, predictor=None if i == 0 else "predict",
                                          instruction=f"instruction {i}", instructions={"predict": f"instruction {i}"},
                                          md5=f"{i:032x}", status="scored", scores=[1.0, 0.0] * (n // 2), score=0.5))
    return state


# ------------------------------------------------------------------------------------------------ report

EVALUATE = "dspy.Evaluate"
COMPILE = "OPRO compile(num_steps=0)"
SCORING = "OPRO scoring only (OPRORun.scorer.score)"
NO_CAPTURE = "without the usage capture (no tracker, no history sink, no `ModelUsage`)"
OLD_CALLBACK = "with the per-evaluation DSPy callback of before (`LMCallCounter` in the settings)"


def paired(values: list[float], anchors: list[float], combine: Callable[[float, float], float]) -> list[float]:
    """``combine(value, anchor)`` per repetition: runners of one repetition ran close in time, so pairing them
    cancels the drift of a shared machine's load."""
    return [combine(value, anchor) for value, anchor in zip(values, anchors, strict=True)]


def ratio(timing: Timing, anchor: Timing, kind: str) -> tuple[float, float, float]:
    """(median, first quartile, third quartile) of the per-repetition ratios of ``kind`` ("wall" or "cpu")."""
    ratios = paired(getattr(timing, kind), getattr(anchor, kind), lambda value, base: value / base)
    if len(ratios) < 2:
        return ratios[0], ratios[0], ratios[0]
    q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return statistics.median(ratios), q1, q3


def table(setting: str, timings: dict[str, Timing], n: int) -> list[str]:
    anchor = timings[EVALUATE]
    rows = []
    for name, timing in timings.items():
        probe = name not in (EVALUATE, COMPILE, SCORING)
        label = f"probe: scoring {name}" if probe else name
        wall, wall_q1, wall_q3 = ratio(timing, anchor, "wall")
        cpu, cpu_q1, cpu_q3 = ratio(timing, anchor, "cpu")
        rows.append(f"| {setting} | {label} | {1e6 * timing.wall_median / n:.0f} | **{wall:.3f}** | "
                    f"{wall_q1:.2f}–{wall_q3:.2f} | {1e6 * timing.cpu_median / n:.0f} | {cpu:.3f} | "
                    f"{cpu_q1:.2f}–{cpu_q3:.2f} |")
    return rows


def savings(timings: dict[str, Timing], n: int) -> list[tuple[str, float, float, float, float]]:
    """(probe, wall and CPU microseconds saved per evaluation against scoring only, wall and CPU ratio with it),
    most CPU saved first; savings are medians of per-repetition differences."""
    base, anchor = timings[SCORING], timings[EVALUATE]

    def saved(timing: Timing, kind: str) -> float:
        return 1e6 * statistics.median(paired(getattr(base, kind), getattr(timing, kind), lambda b, t: b - t)) / n

    found = [(name, saved(timing, "wall"), saved(timing, "cpu"), ratio(timing, anchor, "wall")[0],
              ratio(timing, anchor, "cpu")[0])
             for name, timing in timings.items() if name not in (EVALUATE, COMPILE, SCORING)]
    return sorted(found, key=lambda item: -item[2])


def render(args: argparse.Namespace, in_process: dict[str, Timing] | None, litellm: dict[str, Timing] | None,
           units: list[tuple[str, float, str]] | None, skipped: list[str]) -> str:
    text = [
        START_MARK,
        "## Overhead per evaluation: OPRO against `dspy.Evaluate` (issue 14, item 2)",
        "",
        f"Written by `{args.command}` "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}). Same program "
        "(`dspy.Predict(\"question -> answer\")`), same examples (`simulated_dataset`), same thread count, one "
        "process, runners interleaved (order rotated every repetition), medians. Ratios: against `dspy.Evaluate` "
        "in the same setting. In-process: DSPy's `DummyLM`, "
        f"{args.threads_in_process} threads, {args.n_in_process} examples, {args.reps} repetitions. LiteLLM: "
        f"`dspy.LM(engine=\"litellm\", cache=False, num_retries=0)` against the simulated endpoint (its own process, "
        f"{1000 * args.latency:.0f} ms per request), {args.threads_litellm} threads, {args.n_litellm} examples, "
        f"{args.reps_litellm} repetitions; every run's requests counted at the endpoint's log (one per "
        "evaluation, checked). `OPRO compile(num_steps=0)` also pays the per-compile set-up; `OPRO scoring only` "
        "times `OPRORun.scorer.score` of the program as given, the run built beforehand. µs per evaluation: medians "
        "over repetitions; ratios: medians (and quartiles) of the per-repetition ratios to `dspy.Evaluate` of the "
        "same repetition. Probes: scoring only, with one "
        "piece of the per-evaluation path removed by a monkeypatch for that run (the script's docstring and "
        "`_probe_patches` say what each does). CPU: process CPU time (all threads); the machine is shared with "
        "other work, so CPU ratios are the steadier figure.",
        "",
        "| setting | runner | wall µs / evaluation | wall ratio | quartiles | CPU µs / evaluation | CPU ratio "
        "| quartiles |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    if in_process is not None:
        text += table(f"in-process, {args.threads_in_process} threads", in_process, args.n_in_process)
    if litellm is not None:
        text += table(f"LiteLLM, {args.threads_litellm} threads", litellm, args.n_litellm)
    text.append("")
    if skipped:
        text += [f"Probes not applicable to this code: {', '.join(skipped)}.", ""]
    if in_process is not None and len(in_process) > 3:
        text += ["Probes ranked by the CPU time they save per evaluation (in-process, against scoring only; "
                 "differences under about 30 µs are within the noise of this shared machine):", "",
                 "| probe | wall µs saved / evaluation | CPU µs saved / evaluation | wall ratio | CPU ratio |",
                 "| --- | ---: | ---: | ---: | ---: |"]
        text += [f"| {name} | {wall:.0f} | {cpu:.0f} | {wall_ratio:.3f} | {cpu_ratio:.3f} |"
                 for name, wall, cpu, wall_ratio, cpu_ratio in savings(in_process, args.n_in_process)]
        text.append("")
    if units is not None:
        text += ["Unit costs, one thread, no contention: CPU µs, medians over rounds. Rows starting with + are "
                 "the extra cost over the row above them that names the evaluation, measured in the same rounds.",
                 "", "| piece | µs | per |", "| --- | ---: | --- |"]
        text += [f"| {label} | {value:.1f} | {per} |" for label, value, per in units]
        text.append("")
    text.append(END_MARK)
    return "\n".join(text)


DIAGNOSIS_START = "<!-- diagnosis:start -->"
DIAGNOSIS_END = "<!-- diagnosis:end -->"


def keep_diagnosis(section: str, old_section: str | None) -> str:
    """Carry the hand-written diagnosis (between the diagnosis markers) of ``old_section`` into ``section``."""
    if not old_section or DIAGNOSIS_START not in old_section or DIAGNOSIS_END not in old_section:
        return section
    diagnosis = DIAGNOSIS_START + old_section.split(DIAGNOSIS_START, 1)[1].split(DIAGNOSIS_END, 1)[0] + DIAGNOSIS_END
    return section.replace(END_MARK, diagnosis + "\n" + END_MARK)


def write_section(section: str, out: Path) -> None:
    """Replace the marked section of ``out`` (or append it before ``## Machine``, or at the end), keeping the
    hand-written diagnosis of the section it replaces."""
    section = keep_diagnosis(section, existing_section(out))
    existing = out.read_text(encoding="utf-8") if out.exists() else ""
    if START_MARK in existing and END_MARK in existing:
        head, rest = existing.split(START_MARK, 1)
        tail = rest.split(END_MARK, 1)[1]
        updated = head + section + tail
    elif "## Machine" in existing:
        head, tail = existing.split("## Machine", 1)
        updated = head + section + "\n\n## Machine" + tail
    else:
        updated = existing + ("\n" if existing else "") + section + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(updated, encoding="utf-8")


def measure(args: argparse.Namespace) -> tuple[dict[str, Timing] | None, dict[str, Timing] | None, list[str]]:
    """Both settings, side by side; returns (in-process timings, LiteLLM timings, probes skipped)."""
    base_runners: dict[str, Callable[..., None]] = {EVALUATE: run_evaluate, COMPILE: run_compile,
                                                     SCORING: run_scoring}
    probes = _probe_patches() if args.probes else {}
    skipped = [] if probes or not args.probes else ["all (dspy_opro.scoring.usage has no UsageCapture)"]
    in_process = litellm = None
    if args.in_process:
        print(f"in-process: DummyLM, {args.threads_in_process} threads, {args.n_in_process} examples",
              file=sys.stderr)
        runners = {**base_runners, **{name: run_probe(patch) for name, patch in probes.items()}}
        in_process = side_by_side(runners, instant_lm(), simulated_dataset(args.n_in_process),
                                  args.threads_in_process, args.reps)
    if args.litellm:
        print(f"LiteLLM: simulated endpoint, {args.threads_litellm} threads, {args.n_litellm} examples",
              file=sys.stderr)
        runners = dict(base_runners)
        for name in (NO_CAPTURE, OLD_CALLBACK):
            if name in probes:
                runners[name] = run_probe(probes[name])
        litellm = litellm_setting(args.latency, simulated_dataset(args.n_litellm), args.threads_litellm,
                                  args.reps_litellm, runners)
    return in_process, litellm, skipped


def print_ratios(name: str, timings: dict[str, Timing], n: int) -> None:
    anchor = timings[EVALUATE]
    for runner, timing in timings.items():
        print(f"{name:<10} {runner:<60} wall {1e6 * timing.wall_median / n:7.0f} us/eval "
              f"x{ratio(timing, anchor, 'wall')[0]:.3f}  cpu {1e6 * timing.cpu_median / n:7.0f} us/eval "
              f"x{ratio(timing, anchor, 'cpu')[0]:.3f}")


def parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parse.add_argument("--n-in-process", type=int, default=300, help="examples, in-process")
    parse.add_argument("--threads-in-process", type=int, default=4)
    parse.add_argument("--reps", type=int, default=9, help="repetitions, in-process")
    parse.add_argument("--n-litellm", type=int, default=200, help="examples, LiteLLM")
    parse.add_argument("--threads-litellm", type=int, default=16)
    parse.add_argument("--reps-litellm", type=int, default=9)
    parse.add_argument("--latency", type=float, default=0.05, help="seconds per request at the endpoint")
    parse.add_argument("--no-in-process", dest="in_process", action="store_false")
    parse.add_argument("--no-litellm", dest="litellm", action="store_false")
    parse.add_argument("--no-probes", dest="probes", action="store_false")
    parse.add_argument("--no-units", dest="units", action="store_false")
    parse.add_argument("--unit-repeat", type=int, default=2000, help="calls per round of a unit cost")
    parse.add_argument("--quick", action="store_true", help="3 repetitions of 100 examples; 3 on LiteLLM of 64")
    parse.add_argument("--out", default=str(RESULTS))
    parse.add_argument("--no-write", dest="write", action="store_false")
    return parse


def existing_section(out: Path) -> str | None:
    """The marked section already in ``out``, if any (``overhead.py`` keeps it when it rewrites the file)."""
    text = out.read_text(encoding="utf-8") if out.exists() else ""
    if START_MARK not in text or END_MARK not in text:
        return None
    return START_MARK + text.split(START_MARK, 1)[1].split(END_MARK, 1)[0] + END_MARK


def build_section(argv: list[str]) -> str:
    """Measure as the command line ``argv`` says and return the report section (``overhead.py`` calls this)."""
    args = _arguments(argv)
    dspy.disable_logging()
    in_process, litellm, skipped = measure(args)
    units = all_unit_costs(args) if args.units else None
    return render(args, in_process, litellm, units, skipped)


def all_unit_costs(args: argparse.Namespace) -> list[tuple[str, float, str]]:
    rows = unit_costs(args.unit_repeat)
    if args.litellm:
        rows += litellm_unit_costs(max(10, args.unit_repeat // 40))
    return rows


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    args = parser().parse_args(argv)
    args.command = " ".join(["python benchmarks/overhead_per_eval.py", *(argv if argv is not None else sys.argv[1:])])
    if args.quick:
        args.n_in_process, args.reps, args.n_litellm, args.reps_litellm = 100, 3, 64, 3
        args.unit_repeat = 300
    return args


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    dspy.disable_logging()
    in_process, litellm, skipped = measure(args)
    if in_process is not None:
        print_ratios("in-process", in_process, args.n_in_process)
    if litellm is not None:
        print_ratios("LiteLLM", litellm, args.n_litellm)
    units = all_unit_costs(args) if args.units else None
    for label, value, per in units or []:
        print(f"{value:8.1f} us per {per:<10} {label}")
    if args.write:
        write_section(render(args, in_process, litellm, units, skipped), Path(args.out))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
