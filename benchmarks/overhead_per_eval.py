"""OPRO's time per evaluation against stock ``dspy.Evaluate``, side by side in one process (issue 14, item 2).

One evaluation is one program run on one training example followed by the metric. Each candidate's scoring in OPRO
is one ``dspy.Evaluate`` call (:class:`dspy_opro.scoring.engine.CandidateEvaluate`); each example of it goes through
OPRO's budget and the round's places, its :class:`~dspy_opro.scoring.engine.Runner` (persistent daemon threads, for
the hard ``timeout``, 900 s by default), ``run_example`` (classification, an
evaluation usage tracker) and the run's ``record_result`` (usage, count, journal, score), and every LM call of the
run passes the :class:`~dspy_opro.scoring.usage.UsageMeter` callback in the task LM's own ``callbacks``. This
script measures what all that costs per evaluation, against ``dspy.Evaluate`` on the same program
(``dspy.Predict("question -> answer")``), the same examples (``simulated_dataset``), the same metric
(``simulated_metric``) and the same thread count, in two settings:

* **in-process**: DSPy's ``DummyLM`` answering at once, 4 threads, 200 examples. An evaluation costs only DSPy's
  own work here, so whatever OPRO adds per evaluation shows in full. Goal: OPRO scoring only at most 1.15x;
* **LiteLLM**: ``dspy.LM(engine="litellm", cache=False, num_retries=0)`` against
  :class:`dspy_opro.testing.SimulatedEndpoint` in a process of its own (its serving does not take this process's
  GIL), 50 ms per request, 16 threads, 200 examples. After every run the endpoint's request log must show exactly
  one ``task`` request per evaluation, answered 200, one for each example's question and nothing else, or the script
  fails. Goal: OPRO scoring only at most 1.10x.

Three runners, each once per repetition, the order rotated every repetition (after one untimed warm-up each):

* ``dspy.Evaluate(devset=examples, metric=metric, num_threads=T)(program)`` under ``dspy.context(lm=lm)``: the
  anchor;
* OPRO scoring only: ``OPRORun(OPROTeleprompter(metric, prompt_model=lm, task_model=lm, num_steps=0,
  num_threads=T, display_progress=False), program, examples, None)`` built untimed, then
  ``run.scorer.score([run.state.candidates[0]], "train")`` timed alone inside ``with run.meter.attached([lm])``
  (as ``OPRORun.execute`` attaches it); afterwards every example must have a score and ``metric_calls`` must be the
  number of examples;
* OPRO's public API: ``OPROTeleprompter(..., num_steps=0).compile(program, trainset=examples)``, which scores the
  program as given on every example (step -1) and also pays the per-compile set-up (data checks, fingerprints,
  program copies, selection, the returned program).

Every run of every runner must give the same score (``dspy.Evaluate``'s percentage against OPRO's mean of the
start), so all three did the same work. Figures per runner: the median wall and process CPU time (all threads) per
evaluation; ratios: the median, and the quartiles, of the per-repetition ratios to ``dspy.Evaluate`` of the same
repetition (runners of one repetition ran close in time, so pairing cancels the drift of a shared machine's load).
CPU ratios are the steadier figure on a shared machine; wall ratios are what a user waits.

    python benchmarks/overhead_per_eval.py           # both settings: 21 + 15 repetitions, about 3 minutes on 2 cores
    python benchmarks/overhead_per_eval.py --quick   # 3 repetitions of 64 examples in each setting, same report
    python benchmarks/overhead_per_eval.py --no-litellm --reps 25   # in-process only, more repetitions

The report replaces the section between ``<!-- per-evaluation:start -->`` and ``<!-- per-evaluation:end -->`` of
``results/overhead.md`` (or of ``--out``; ``--no-write`` prints only), keeping a hand-written diagnosis between
``<!-- diagnosis:start -->`` and ``<!-- diagnosis:end -->`` inside it; ``overhead.py`` calls :func:`build_section`
and keeps the section when it rewrites the file. ``--no-probes`` and ``--no-units`` are accepted and ignored (the
probes and unit costs of the previous engine's internals are gone; ``overhead.py`` still passes them).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402
from dspy.utils.dummies import DummyLM  # noqa: E402

from dspy_opro import OPROTeleprompter  # noqa: E402
from dspy_opro.testing import SimulatedEndpoint, simulated_dataset, simulated_metric  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "overhead.md"
START_MARK = "<!-- per-evaluation:start -->"
END_MARK = "<!-- per-evaluation:end -->"
DIAGNOSIS_START = "<!-- diagnosis:start -->"
DIAGNOSIS_END = "<!-- diagnosis:end -->"
TASK_MODEL = "openai/sim-task"

EVALUATE = "dspy.Evaluate"
SCORING = "OPRO scoring only (OPRORun.scorer.score)"
COMPILE = "OPRO compile(num_steps=0)"
IN_PROCESS, LITELLM = "in-process", "LiteLLM"
GOALS = {(IN_PROCESS, SCORING): 1.15, (LITELLM, SCORING): 1.10}  # the most OPRO scoring only may cost, as a ratio


def program() -> dspy.Module:
    return dspy.Predict("question -> answer")


def instant_lm() -> dspy.BaseLM:
    """DSPy's DummyLM, answering every request at once with the same chat-formatted answer."""
    return DummyLM({"": {"answer": "7"}})


# ------------------------------------------------------------------------------------------------ the runners


@dataclass
class Timing:
    """One runner's times, one entry per repetition, and the score of each of its runs."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)

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


Runner = Callable[[dspy.BaseLM, list[dspy.Example], int, Timing], None]


def run_evaluate(lm: dspy.BaseLM, examples: list[dspy.Example], threads: int, into: Timing) -> None:
    """Stock ``dspy.Evaluate``: the anchor."""
    student = program()
    with clock(into), dspy.context(lm=lm):
        result = dspy.Evaluate(devset=examples, metric=simulated_metric, num_threads=threads)(student)
    if len(result.results) != len(examples):
        raise RuntimeError(f"dspy.Evaluate returned {len(result.results)} results for {len(examples)} examples")
    into.scores.append(float(result.score))


def optimizer_for(lm: dspy.BaseLM, threads: int) -> OPROTeleprompter:
    return OPROTeleprompter(simulated_metric, prompt_model=lm, task_model=lm, num_steps=0, num_threads=threads,
                            display_progress=False)


def run_scoring(lm: dspy.BaseLM, examples: list[dspy.Example], threads: int, into: Timing) -> None:
    """``OPRORun.scorer.score`` of the program as given, timed alone; the run is built untimed first."""
    from dspy_opro.core.run import OPRORun

    run = OPRORun(optimizer_for(lm, threads), program(), examples, None)
    try:
        with run.meter.attached([lm]), clock(into):
            run.scorer.score([run.state.candidates[0]], "train")
    finally:
        run.runner.close()
        run.recorder.close()
    into.scores.append(scored_percent(run.state, len(examples)))


def run_compile(lm: dspy.BaseLM, examples: list[dspy.Example], threads: int, into: Timing) -> None:
    """OPRO's public API with no step: the start scored on every example, and the compile's own set-up."""
    optimizer = optimizer_for(lm, threads)
    with clock(into):
        compiled = optimizer.compile(program(), trainset=examples)
    into.scores.append(scored_percent(compiled.opro_run, len(examples)))


def scored_percent(state: Any, n: int) -> float:
    """The start's mean as ``dspy.Evaluate`` gives a score (a percentage, 2 decimals), once every one of the ``n``
    examples has a score and the run counted ``n`` evaluations; RuntimeError otherwise."""
    start = state.candidates[0]
    scored = sum(score is not None for score in start.scores)
    if scored != n or len(start.scores) != n or state.metric_calls != n or start.status != "scored":
        raise RuntimeError(f"OPRO scored {scored} of {n} examples in {state.metric_calls} evaluations (status "
                           f"{start.status}: {start.reason})")
    return round(100 * sum(start.scores) / n, 2)


RUNNERS: dict[str, Runner] = {EVALUATE: run_evaluate, SCORING: run_scoring, COMPILE: run_compile}


# ------------------------------------------------------------------------------------------------ side by side


def rotated(names: Sequence[str], rep: int) -> list[str]:
    """The order of repetition ``rep``: ``names`` rotated left by ``rep`` places."""
    shift = rep % len(names)
    return [*names[shift:], *names[:shift]]


def side_by_side(runners: dict[str, Runner], lm: dspy.BaseLM, examples: list[dspy.Example], threads: int,
                 reps: int, before: Callable[[], None] | None = None,
                 after: Callable[[str, list[dspy.Example]], None] | None = None) -> dict[str, Timing]:
    """Every runner once per repetition, the order rotated each time, after an untimed warm-up of each (lazy
    imports, first calls, thread pools); ``before()`` and ``after(name, examples)`` around every run."""
    names = list(runners)
    warm = examples[: min(8, len(examples))]
    for name in names:
        if before is not None:
            before()
        runners[name](lm, warm, threads, Timing())
        if after is not None:
            after(name, warm)
    timings = {name: Timing() for name in names}
    for rep in range(reps):
        for name in rotated(names, rep):
            if before is not None:
                before()
            runners[name](lm, examples, threads, timings[name])
            if after is not None:
                after(name, examples)
        print(f"  repetition {rep + 1}/{reps}: " + ", ".join(
            f"{name} {timings[name].wall[-1]:.3f}s wall {timings[name].cpu[-1]:.3f}s cpu" for name in names),
            file=sys.stderr, flush=True)
    check_same_scores(timings)
    return timings


def check_same_scores(timings: dict[str, Timing]) -> None:
    """Every run of every runner scored the same (RuntimeError naming the runs that did not)."""
    found = {name: sorted(set(timing.scores)) for name, timing in timings.items()}
    if len({score for scores in found.values() for score in scores}) > 1:
        raise RuntimeError(f"the runners did not score alike: {found}")


# ------------------------------------------------------------------------------------------------ the endpoint


def _serve(latency: float, conn: Any) -> None:
    """Child process: serve the simulated endpoint; answer ``reset``, ``log`` and ``stop`` on ``conn``."""
    from dspy_opro.testing.adapter_prompts import parse_adapter_prompt
    from dspy_opro.testing.task_model import question_of

    def question(messages: list[dict]) -> str | None:
        prompt = parse_adapter_prompt(messages)
        return question_of(prompt) if prompt is not None else None

    with SimulatedEndpoint(latency=latency) as endpoint:
        conn.send(endpoint.base_url)
        while True:
            command = conn.recv()
            if command == "reset":
                endpoint.reset_log()
                conn.send(None)
            elif command == "log":
                conn.send([(r.status, r.model, r.kind, question(r.messages)) for r in endpoint.requests])
            else:
                conn.send(None)
                return


class EndpointProcess:
    """:class:`SimulatedEndpoint` in a process of its own, with its request log: ``(status, model, kind,
    question)`` per request since the last reset."""

    def __init__(self, latency: float):
        context = mp.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(latency, child), daemon=True)
        self._process.start()
        self.base_url: str = self._conn.recv()

    def reset(self) -> None:
        self._conn.send("reset")
        self._conn.recv()

    def log(self) -> list[tuple[int, str | None, str, str | None]]:
        self._conn.send("log")
        return self._conn.recv()

    def close(self) -> None:
        self._conn.send("stop")
        self._conn.recv()
        self._process.join(10)


def check_requests(name: str, log: Sequence[tuple[int, str | None, str, str | None]],
                   examples: Sequence[dspy.Example], model: str = TASK_MODEL.split("/", 1)[1]) -> None:
    """RuntimeError unless ``log`` is exactly one ``task`` request of ``model``, answered 200, per example's question
    (and nothing else)."""
    problems = []
    if len(log) != len(examples):
        problems.append(f"{len(log)} requests for {len(examples)} evaluations")
    others = Counter((status, logged, kind) for status, logged, kind, _ in log
                     if (status, logged, kind) != (200, model, "task"))
    problems += [f"{count} request(s) of kind {kind!r}, model {logged!r}, status {status}"
                 for (status, logged, kind), count in sorted(others.items(), key=str)]
    asked = Counter(question for *_, question in log)
    expected = Counter(example.question for example in examples)
    if asked != expected:
        missing, extra = expected - asked, asked - expected
        problems.append(f"{sum(missing.values())} example(s) not asked, {sum(extra.values())} asked more than once "
                        "or not an example's")
    if problems:
        raise RuntimeError(f"{name}: the endpoint's request log is not one task request per evaluation: "
                           + "; ".join(problems))


def litellm_setting(latency: float, examples: list[dspy.Example], threads: int, reps: int) -> dict[str, Timing]:
    """The runners through LiteLLM against the endpoint in its own process; every run's requests checked."""
    endpoint = EndpointProcess(latency)
    try:
        lm = dspy.LM(TASK_MODEL, api_base=endpoint.base_url, api_key="x", engine="litellm", cache=False,
                     num_retries=0)
        return side_by_side(RUNNERS, lm, examples, threads, reps, before=endpoint.reset,
                            after=lambda name, run_examples: check_requests(name, endpoint.log(), run_examples))
    finally:
        endpoint.close()


# ------------------------------------------------------------------------------------------------ report


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, first quartile, third quartile); all three the value itself for a single value."""
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return statistics.median(values), q1, q3


def ratio(timing: Timing, anchor: Timing, kind: str) -> tuple[float, float, float]:
    """(median, first quartile, third quartile) of the per-repetition ratios of ``kind`` (``"wall"`` or ``"cpu"``)
    of ``timing`` to ``anchor``."""
    values = [value / base for value, base in zip(getattr(timing, kind), getattr(anchor, kind), strict=True)]
    return quartiles(values)


def verdict(wall: float, cpu: float, goal: float | None) -> str:
    if goal is None:
        return ""
    if wall <= goal and cpu <= goal:
        return f"≤ {goal:.2f}: met"
    if cpu <= goal:
        return f"≤ {goal:.2f}: met in CPU, not in wall"
    if wall <= goal:
        return f"≤ {goal:.2f}: met in wall, not in CPU"
    return f"≤ {goal:.2f}: not met"


def rows(setting: str, timings: dict[str, Timing], n: int, threads: int) -> list[str]:
    anchor = timings[EVALUATE]
    lines = []
    for name, timing in timings.items():
        wall, wall_q1, wall_q3 = ratio(timing, anchor, "wall")
        cpu, cpu_q1, cpu_q3 = ratio(timing, anchor, "cpu")
        lines.append(f"| {setting}, {threads} threads | {name} | {1e6 * timing.wall_median / n:.0f} | **{wall:.3f}** "
                     f"| {wall_q1:.2f}–{wall_q3:.2f} | {1e6 * timing.cpu_median / n:.0f} | **{cpu:.3f}** | "
                     f"{cpu_q1:.2f}–{cpu_q3:.2f} | {verdict(wall, cpu, GOALS.get((setting, name)))} |")
    return lines


def render(args: argparse.Namespace, in_process: dict[str, Timing] | None, litellm: dict[str, Timing] | None,
           load: tuple[tuple[float, ...], tuple[float, ...]] | None = None) -> str:
    """The report section, markers included."""
    settings = []
    if in_process is not None:
        settings.append(f"In-process: DSPy's `DummyLM`, {args.threads_in_process} threads, {args.n_in_process} "
                        f"examples, {args.reps} repetitions")
    if litellm is not None:
        settings.append(f"LiteLLM: `dspy.LM(engine=\"litellm\", cache=False, num_retries=0)` against "
                        f"`SimulatedEndpoint` in its own process ({1000 * args.latency:.0f} ms per request), "
                        f"{args.threads_litellm} threads, {args.n_litellm} examples, {args.reps_litellm} "
                        "repetitions, the endpoint's log checked after every run (exactly one task request per "
                        "evaluation, one per example)")
    loads = ""
    if load is not None:
        loads = (f" Load average (1, 5, 15 min) {', '.join(f'{x:.1f}' for x in load[0])} at the start, "
                 f"{', '.join(f'{x:.1f}' for x in load[1])} at the end, on {os.cpu_count()} cores.")
    text = [
        START_MARK,
        "## Overhead per evaluation: OPRO against `dspy.Evaluate` (issue 14, item 2)",
        "",
        f"Written by `{args.command}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}), DSPy "
        f"{dspy.__version__}. Same program (`dspy.Predict(\"question -> answer\")`), same examples "
        "(`simulated_dataset`), same metric, same thread count, one process; each repetition runs every runner once, "
        "the order rotated every repetition, after an untimed warm-up. " + "; ".join(settings) + ". "
        "`OPRO scoring only` times `run.scorer.score([start], \"train\")` of an `OPRORun` built beforehand, with the "
        "run's `UsageMeter` attached to the LM; `OPRO compile(num_steps=0)` also pays the compile's set-up. Every "
        "run of every runner gave the same score (checked). µs per evaluation: medians over the repetitions; "
        "ratios: medians and quartiles of the per-repetition ratios to `dspy.Evaluate` of the same repetition. "
        "CPU: the process's CPU time (all threads), the steadier figure on this shared machine." + loads,
        "",
        "| setting | runner | wall µs / evaluation | wall ratio | quartiles | CPU µs / evaluation | CPU ratio "
        "| quartiles | goal (scoring only) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    if in_process is not None:
        text += rows(IN_PROCESS, in_process, args.n_in_process, args.threads_in_process)
    if litellm is not None:
        text += rows(LITELLM, litellm, args.n_litellm, args.threads_litellm)
    text += ["", END_MARK]
    return "\n".join(text)


def print_ratios(setting: str, timings: dict[str, Timing], n: int) -> None:
    anchor = timings[EVALUATE]
    for name, timing in timings.items():
        wall, cpu = ratio(timing, anchor, "wall"), ratio(timing, anchor, "cpu")
        goal = verdict(wall[0], cpu[0], GOALS.get((setting, name)))
        print(f"{setting:<10} {name:<42} wall {1e6 * timing.wall_median / n:6.0f} us/eval x{wall[0]:.3f} "
              f"({wall[1]:.2f}-{wall[2]:.2f})  cpu {1e6 * timing.cpu_median / n:6.0f} us/eval x{cpu[0]:.3f} "
              f"({cpu[1]:.2f}-{cpu[2]:.2f})  {goal}")


# ------------------------------------------------------------------------------------------------ the section


def existing_section(out: Path) -> str | None:
    """The marked section already in ``out``, if any (``overhead.py`` keeps it when it rewrites the file)."""
    text = out.read_text(encoding="utf-8") if out.exists() else ""
    if START_MARK not in text or END_MARK not in text:
        return None
    return START_MARK + text.split(START_MARK, 1)[1].split(END_MARK, 1)[0] + END_MARK


def keep_diagnosis(section: str, old_section: str | None) -> str:
    """Carry the hand-written diagnosis (between the diagnosis markers) of ``old_section`` into ``section``."""
    if not old_section or DIAGNOSIS_START not in old_section or DIAGNOSIS_END not in old_section:
        return section
    diagnosis = DIAGNOSIS_START + old_section.split(DIAGNOSIS_START, 1)[1].split(DIAGNOSIS_END, 1)[0] + DIAGNOSIS_END
    return section.replace(END_MARK, diagnosis + "\n" + END_MARK)


def write_section(section: str, out: Path) -> None:
    """Replace the marked section of ``out`` (or insert it before ``## Machine``, or append it), keeping the
    hand-written diagnosis of the section it replaces."""
    section = keep_diagnosis(section, existing_section(out))
    existing = out.read_text(encoding="utf-8") if out.exists() else ""
    if START_MARK in existing and END_MARK in existing:
        head, rest = existing.split(START_MARK, 1)
        updated = head + section + rest.split(END_MARK, 1)[1]
    elif "## Machine" in existing:
        head, tail = existing.split("## Machine", 1)
        updated = head + section + "\n\n## Machine" + tail
    else:
        updated = existing + ("\n" if existing else "") + section + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(updated, encoding="utf-8")


# ------------------------------------------------------------------------------------------------ command line


def parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parse.add_argument("--n-in-process", type=int, default=200, help="examples, in-process")
    parse.add_argument("--threads-in-process", type=int, default=4)
    parse.add_argument("--reps", type=int, default=21, help="repetitions, in-process")
    parse.add_argument("--n-litellm", type=int, default=200, help="examples, LiteLLM")
    parse.add_argument("--threads-litellm", type=int, default=16)
    parse.add_argument("--reps-litellm", type=int, default=15, help="repetitions, LiteLLM")
    parse.add_argument("--latency", type=float, default=0.05, help="seconds per request at the endpoint")
    parse.add_argument("--no-in-process", dest="in_process", action="store_false")
    parse.add_argument("--no-litellm", dest="litellm", action="store_false")
    parse.add_argument("--quick", action="store_true", help="3 repetitions of 64 examples in each setting")
    parse.add_argument("--out", default=str(RESULTS), help="the report whose section is replaced")
    parse.add_argument("--no-write", dest="write", action="store_false", help="print the figures only")
    for gone in ("--no-probes", "--no-units"):  # options of the previous engine's probes; overhead.py passes them
        parse.add_argument(gone, action="store_true", help=argparse.SUPPRESS)
    return parse


def arguments(argv: list[str] | None) -> argparse.Namespace:
    args = parser().parse_args(argv)
    args.command = " ".join(["python benchmarks/overhead_per_eval.py", *(argv if argv is not None else sys.argv[1:])])
    if args.quick:
        args.n_in_process = args.n_litellm = 64
        args.reps = args.reps_litellm = 3
    return args


def measure(args: argparse.Namespace) -> tuple[dict[str, Timing] | None, dict[str, Timing] | None]:
    """Both settings (as ``args`` says): (in-process timings, LiteLLM timings)."""
    in_process = litellm = None
    if args.in_process:
        print(f"in-process: DummyLM, {args.threads_in_process} threads, {args.n_in_process} examples, {args.reps} "
              "repetitions", file=sys.stderr)
        in_process = side_by_side(RUNNERS, instant_lm(), simulated_dataset(args.n_in_process),
                                  args.threads_in_process, args.reps)
    if args.litellm:
        print(f"LiteLLM: simulated endpoint ({1000 * args.latency:.0f} ms), {args.threads_litellm} threads, "
              f"{args.n_litellm} examples, {args.reps_litellm} repetitions", file=sys.stderr)
        litellm = litellm_setting(args.latency, simulated_dataset(args.n_litellm), args.threads_litellm,
                                  args.reps_litellm)
    return in_process, litellm


def build_section(argv: list[str]) -> str:
    """Measure as the command line ``argv`` says and return the report section (``overhead.py`` calls this)."""
    args = arguments(argv)
    dspy.disable_logging()
    before = os.getloadavg()
    in_process, litellm = measure(args)
    return render(args, in_process, litellm, (before, os.getloadavg()))


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    dspy.disable_logging()
    before = os.getloadavg()
    in_process, litellm = measure(args)
    load = (before, os.getloadavg())
    if in_process is not None:
        print_ratios(IN_PROCESS, in_process, args.n_in_process)
    if litellm is not None:
        print_ratios(LITELLM, litellm, args.n_litellm)
    print(f"load average {load[0][0]:.1f} at the start, {load[1][0]:.1f} at the end")
    if args.write:
        write_section(render(args, in_process, litellm, load), Path(args.out))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
