"""How close OPRO's wall time comes to what the request count, the latency and the parallelism allow.

Against the simulated OpenAI-compatible endpoint with a fixed latency per request (default 50 ms), through
LiteLLM (``engine="litellm"``, no cache, no retries), the script runs at 1, 4, 16 and 32 threads:

* **OPRO** on ``dspy.Predict("question -> answer")`` (one request per evaluation), ``--steps`` steps x
  ``--candidates`` candidates over ``--train`` training examples;
* **COPRO** with about the same number of task evaluations (``breadth * depth * train``);
* **stock ``dspy.Evaluate``** (``num_threads=T``) over the same number of requests as OPRO's evaluations: the
  peer anchor.

Each run's wall time is set against its floor, the critical path through the run's barriers when every request
takes exactly the latency ``L`` and nothing else costs time:

* OPRO: step -1 scores the starting program (``ceil(train / T) * L``); then each step has a proposal phase (the
  proposer sends the ``num_candidates`` optimizer calls on ``min(T, num_candidates)`` threads:
  ``ceil(num_candidates / T) * L``; where it asks for ``n`` completions in one request, the step's optimizer
  requests ``r`` replace ``num_candidates``: ``ceil(r / T) * L``) and, after that barrier, a scoring phase (all the
  step's new candidates on all training examples, fanned out together: ``ceil(evaluations_in_step / T) * L``);
* COPRO: per depth round, its proposal call(s) (one ``Predict`` with ``n`` choices, sent one after the other:
  ``optimizer_requests * L`` in all), then each candidate through its own ``dspy.Evaluate`` at ``T`` threads, one
  after the other (``breadth * ceil(train / T) * L`` per round);
* stock Evaluate: ``ceil(requests / T) * L``.

A request is *lost* when the client sent it but the server did not answer it with 200, and an evaluation is lost
when it is missing from the optimizer's record; both are counted in the ``lost`` column.

The client's CPU time during each run is reported too: every request costs the client DSPy + LiteLLM work under
one GIL, so a run cannot take less wall time than its client CPU time; ``wall / max(floor, CPU)`` shows how close
a run comes to that bound.

The endpoint runs in a process of its own by default (``--server process``), so that serving does not take the
client's GIL; ``--server thread`` runs it in the client process. It sets TCP_NODELAY and writes each response in one
piece. COPRO's proposal prompts are answered by the simulated peers of :mod:`benchmarks.simulated_peers`,
plugged into the endpoint as its responders.

The script also measures a synthetic run record (:class:`dspy_opro.state.RunState`) of 200 steps x 8 candidates x
1000 training examples: its size in memory (tracemalloc) and the time to save and reload it.

    python benchmarks/overhead.py            # writes benchmarks/results/overhead.md
    python benchmarks/overhead.py --quick    # a short run, same report
    python benchmarks/overhead.py --profile 32   # also profile OPRO at 32 threads with py-spy

It also measures the two per-evaluation ratios of issue 14 with ``overhead_per_eval.py`` (OPRO's time per
evaluation against stock ``dspy.Evaluate``, side by side: in-process with ``DummyLM`` at 4 threads, through LiteLLM
at 16 threads) and writes them as that script's section of the report; ``--no-ratios`` skips them and keeps the
section already in the file.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import math
import multiprocessing as mp
import os
import platform
import random
import sys
import tempfile
import threading
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: the repository root, for benchmarks.simulated_peers
    sys.path.insert(0, str(ROOT))

import dspy  # noqa: E402

from benchmarks.simulated_peers import PEERS  # noqa: E402  (COPRO's proposals)
from dspy_opro import OPROTeleprompter  # noqa: E402
from dspy_opro.record.files import load_state, save_state  # noqa: E402
from dspy_opro.state import Candidate, Fingerprint, Reply, RunState, Selection, Step  # noqa: E402
from dspy_opro.testing import SimulatedEndpoint, simulated_dataset, simulated_metric  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "overhead.md"
TASK_MODEL = "openai/sim-task"
OPTIMIZER_MODEL = "openai/sim-optimizer"


# ------------------------------------------------------------------------------------------------ the endpoint


def _serve(latency: float, conn: Any) -> None:
    """Child process: serve the simulated endpoint and answer log commands on ``conn``."""
    with SimulatedEndpoint(latency=latency, responders=PEERS) as endpoint:
        conn.send(endpoint.base_url)
        while True:
            command = conn.recv()
            if command == "reset":
                endpoint.reset_log()
                conn.send(None)
            elif command == "log":
                conn.send([(r.status, r.model, r.kind) for r in endpoint.requests])
            else:
                conn.send(None)
                return


class Server:
    """The simulated endpoint, in a child process (default) or a thread of this one, with its request log."""

    def __init__(self, latency: float, mode: str = "process"):
        self.mode = mode
        self._endpoint: SimulatedEndpoint | None = None
        if mode == "thread":
            self._endpoint = SimulatedEndpoint(latency=latency, responders=PEERS).start()
            self.base_url = self._endpoint.base_url
        else:
            context = mp.get_context("spawn")
            self._conn, child = context.Pipe()
            self._process = context.Process(target=_serve, args=(latency, child), daemon=True)
            self._process.start()
            self.base_url = self._conn.recv()

    def reset(self) -> None:
        if self._endpoint is not None:
            self._endpoint.reset_log()
        else:
            self._conn.send("reset")
            self._conn.recv()

    def log(self) -> list[tuple[int, str | None, str]]:
        """(status, model, kind) of every request since the last reset."""
        if self._endpoint is not None:
            return [(r.status, r.model, r.kind) for r in self._endpoint.requests]
        self._conn.send("log")
        return self._conn.recv()

    def close(self) -> None:
        if self._endpoint is not None:
            self._endpoint.stop()
        else:
            self._conn.send("stop")
            self._conn.recv()
            self._process.join(10)


class SentCounter:
    """Counts the LM calls the client starts (with num_retries=0 and LiteLLM, one call is one request)."""

    def __init__(self) -> None:
        self.sent = 0
        self._lock = threading.Lock()

    def add(self) -> None:
        with self._lock:
            self.sent += 1


class CountingLM(dspy.LM):
    """``dspy.LM`` counting its calls. Not a DSPy callback: any callback puts every module, adapter and LM call of
    every run on DSPy's slower callback path, which would blur the comparison. Copies (``lm.copy()``) share the
    counter."""

    def __init__(self, *args: Any, counter: SentCounter, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.counter = counter

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.counter.add()
        return super().__call__(*args, **kwargs)


# ------------------------------------------------------------------------------------------------ the runs


@dataclass
class Result:
    optimizer: str
    threads: int
    requests: int
    wall: float
    floor: float
    lost: int
    detail: str = ""
    cpu: float = 0.0  # CPU seconds of the client process during the run (all its threads)

    @property
    def ratio(self) -> float:
        return self.wall / self.floor

    @property
    def cpu_ratio(self) -> float:
        """Wall time against the larger of the floor and the client's CPU time (one GIL: CPU time is a floor too)."""
        return self.wall / max(self.floor, self.cpu)


@dataclass
class Bench:
    server: Server
    task_lm: dspy.LM
    prompt_lm: dspy.LM
    counter: SentCounter
    trainset: list[dspy.Example]
    latency: float
    steps: int
    candidates: int
    last_cpu: float = 0.0

    def _measure(self, run: Any) -> tuple[Any, float, int, int]:
        """Run ``run()`` on a fresh log; returns (its value, wall seconds, requests received, requests lost)."""
        self.server.reset()
        gc.collect()
        sent_before = self.counter.sent
        cpu_started = time.process_time()
        started = time.perf_counter()
        value = run()
        wall = time.perf_counter() - started
        self.last_cpu = time.process_time() - cpu_started
        log = self.server.log()
        sent = self.counter.sent - sent_before
        answered = sum(1 for status, _, _ in log if status == 200)
        return value, wall, len(log), max(0, sent - answered) + sum(1 for status, _, _ in log if status != 200)

    def opro(self, threads: int, profiler: Any = None) -> Result:
        optimizer = OPROTeleprompter(metric=simulated_metric, prompt_model=self.prompt_lm, task_model=self.task_lm,
                                     num_steps=self.steps, num_candidates=self.candidates, num_threads=threads)

        def run() -> Any:
            with profiler if profiler is not None else contextlib.nullcontext():
                return optimizer.compile(dspy.Predict("question -> answer"), trainset=self.trainset)

        compiled, wall, requests, lost = self._measure(run)
        state = compiled.opro_run
        n_train, latency = len(self.trainset), self.latency
        # The proposer sends num_candidates one-choice requests on min(T, num_candidates) threads, or, where the
        # provider takes OpenAI's n, one request for all of them: the phase is ceil(requests_in_step / T) waves.
        optimizer_requests = sum(1 for _, model, _ in self.server.log() if model == _served(OPTIMIZER_MODEL))
        per_step = math.ceil(optimizer_requests / max(1, len(state.steps)))
        floor = math.ceil(n_train / threads) * latency  # step -1
        missing = sum(score is None for score in state.candidates[0].scores)
        evaluations = n_train
        for record in state.steps:
            new = [c for c in state.candidates if c.step == record.step and c.status != "skipped"]
            done = sum(score is not None for c in new for score in c.scores)
            missing += len(new) * n_train - done
            evaluations += done
            floor += math.ceil(per_step / threads) * latency  # the proposal barrier
            floor += math.ceil(done / threads) * latency  # the scoring barrier
        return Result("OPRO", threads, requests, wall, floor, lost + missing,
                      f"{evaluations} evaluations, {optimizer_requests} optimizer requests", self.last_cpu)

    def copro(self, threads: int, evaluations: int) -> Result:
        n_train = len(self.trainset)
        breadth, depth = copro_shape(evaluations // n_train, self.steps)
        optimizer = dspy.COPRO(metric=simulated_metric, prompt_model=self.prompt_lm, breadth=breadth, depth=depth)

        def run() -> Any:
            # COPRO prints the optimizer's last exchange (inspect_history inside a debug f-string) at every round.
            with dspy.context(lm=self.task_lm), open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
                return optimizer.compile(dspy.Predict("question -> answer"), trainset=self.trainset,
                                         eval_kwargs={"num_threads": threads, "display_progress": False})

        _, wall, requests, lost = self._measure(run)
        log = self.server.log()
        proposals = sum(1 for _, model, _ in log if model == _served(OPTIMIZER_MODEL))
        task = sum(1 for status, model, _ in log if model == _served(TASK_MODEL) and status == 200)
        expected = breadth * depth * n_train
        floor = (proposals + breadth * depth * math.ceil(n_train / threads)) * self.latency
        return Result("COPRO", threads, requests, wall, floor, lost + max(0, expected - task),
                      f"breadth {breadth} x depth {depth}: {expected} evaluations, {proposals} optimizer requests",
                      self.last_cpu)

    def evaluate(self, threads: int, requests_wanted: int) -> Result:
        devset = [self.trainset[i % len(self.trainset)] for i in range(requests_wanted)]
        evaluator = dspy.Evaluate(devset=devset, metric=simulated_metric, num_threads=threads,
                                  display_progress=False, max_errors=len(devset) + 1)
        program = dspy.Predict("question -> answer")

        def run() -> Any:
            with dspy.context(lm=self.task_lm):
                return evaluator(program)

        result, wall, requests, lost = self._measure(run)
        missing = sum(1 for _, prediction, _ in result.results if "answer" not in prediction.keys())
        floor = math.ceil(requests_wanted / threads) * self.latency
        return Result("dspy.Evaluate", threads, requests, wall, floor, lost + missing,
                      f"{requests_wanted} evaluations", self.last_cpu)


def warm_up(bench: Bench) -> None:
    """Pay the one-off costs (lazy imports, HTTP clients, first calls of both models) before measuring."""
    bench.evaluate(4, 8)
    optimizer = OPROTeleprompter(metric=simulated_metric, prompt_model=bench.prompt_lm, task_model=bench.task_lm,
                                 num_steps=1, num_candidates=2, num_exemplars=1, num_threads=4)
    optimizer.compile(dspy.Predict("question -> answer"), trainset=bench.trainset[:4])
    bench.copro(4, 2 * len(bench.trainset))


def _served(model: str) -> str:
    """The model name the endpoint sees (LiteLLM strips the provider prefix)."""
    return model.split("/", 1)[-1]


def copro_shape(passes: int, steps: int) -> tuple[int, int]:
    """(breadth, depth) with breadth * depth closest to ``passes``; ties go to the depth nearest OPRO's rounds
    (step -1 and ``steps`` steps), so COPRO gets about as many proposal barriers as OPRO."""
    best = None
    for depth in range(1, 9):
        breadth = max(2, round(passes / depth))
        key = (abs(breadth * depth - passes), abs(depth - (steps + 1)))
        if best is None or key < best[0]:
            best = (key, breadth, depth)
    return best[1], best[2]


# ------------------------------------------------------------------------------------------------ the run record


def synthetic_state(steps: int = 200, candidates: int = 8, n_train: int = 1000, seed: int = 0) -> RunState:
    """A run record the shape of a real one: 0/1 scores around each candidate's accuracy, meta-prompts, replies."""
    rng = random.Random(seed)
    meta_prompt = ("Your task is to generate the instruction <INS>. Below are some previous instructions with their "
                   "scores. The score ranges from 0 to 100.\n\n" + "text:\nLet's think step by step and verify the "
                   "answer.\nscore:\n61\n\n" * 20 + "Q: <INS>\nA: 42\n\n" * 3 +
                   "Generate an instruction that is different from all the instructions <INS> above.")

    def scores(quality: float) -> list[float]:
        return [1.0 if rng.random() < quality else 0.0 for _ in range(n_train)]

    start = {"predict": "Given the fields `question`, produce the fields `answer`."}
    state = RunState(fingerprint=Fingerprint(config="c" * 16, trainset="t" * 16, valset="v" * 16, program="p" * 16),
                     config={"num_steps": steps, "num_candidates": candidates}, predictors=["predict"],
                     train_size=n_train, val_size=0)
    first = scores(0.3)
    state.candidates.append(Candidate(id=0, step=-1, predictor=None, instruction="", instructions=start, md5="0" * 32,
                                      status="scored", scores=first, score=sum(first) / n_train))
    for step in range(steps):
        record = Step(step=step, predictor="predict", exemplar_indices=rng.sample(range(n_train), 3),
                      meta_prompt=meta_prompt, temperature=1.0, complete=True)
        for sample in range(candidates):
            instruction = f"Let's work step by step, verify each result and keep the units ({step}.{sample})."
            values = scores(rng.uniform(0.3, 0.9))
            candidate = Candidate(id=len(state.candidates), step=step, predictor="predict", instruction=instruction,
                                  instructions={"predict": instruction}, md5=f"{len(state.candidates):032x}",
                                  status="scored", scores=values, score=sum(values) / n_train,
                                  failed=[i for i in range(0, n_train, 97)])
            state.candidates.append(candidate)
            record.replies.append(Reply(text=f"<INS>{instruction}</INS>", instruction=instruction, fate="new",
                                        candidate_id=candidate.id))
        record.best_score = max(c.score for c in state.candidates)
        state.steps.append(record)
    state.metric_calls = n_train * len(state.candidates)
    state.status = "finished"
    state.selection = Selection(candidate_id=state.best().id, selected_by="train", reason="best training score")
    return state


def measure_state(steps: int, candidates: int, n_train: int) -> dict[str, float]:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    state = synthetic_state(steps, candidates, n_train)
    gc.collect()
    size = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        path = save_state(state, folder)
        saved = time.perf_counter() - started
        file_size = path.stat().st_size
        started = time.perf_counter()
        loaded = load_state(folder)
        reloaded = time.perf_counter() - started
    assert loaded is not None and len(loaded.candidates) == len(state.candidates)
    return {"memory_mb": size / 2**20, "save_s": saved, "load_s": reloaded, "file_mb": file_size / 2**20,
            "candidates": len(state.candidates), "scores": sum(len(c.scores) for c in state.candidates)}


# ------------------------------------------------------------------------------------------------ report


def machine() -> dict[str, str]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    try:
        import litellm

        litellm_version = getattr(litellm, "__version__", None) or _dist_version("litellm")
    except ImportError:
        litellm_version = "not installed"
    return {
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "python": platform.python_version(),
        "dspy": dspy.__version__,
        "litellm": litellm_version,
        "platform": platform.platform(),
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
    }


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    try:
        return version(name)
    except Exception:
        return "unknown"


def line(result: Result) -> str:
    return (f"{result.optimizer:<14} threads={result.threads:<3} requests={result.requests:<5} "
            f"wall={result.wall:7.2f}s floor={result.floor:7.2f}s ratio={result.ratio:5.3f} lost={result.lost} "
            f"cpu={result.cpu:6.2f}s ({1000 * result.cpu / max(1, result.requests):.1f} ms/request, "
            f"wall/max(floor,cpu)={result.cpu_ratio:5.3f})")


def render(results: list[Result], memory: dict[str, float] | None, args: argparse.Namespace,
           info: dict[str, str], profiled: tuple[Result, list[tuple[str, float]]] | None = None,
           phases: tuple[Result, list[tuple[str, float, int]]] | None = None) -> str:
    rows = ["| optimizer | threads | requests | wall s | floor s | wall / floor | lost | client CPU s "
            "| CPU ms / request | wall / max(floor, CPU) | run |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in results:
        rows.append(f"| {r.optimizer} | {r.threads} | {r.requests} | {r.wall:.2f} | {r.floor:.2f} | {r.ratio:.3f} "
                    f"| {r.lost} | {r.cpu:.2f} | {1000 * r.cpu / max(1, r.requests):.1f} | {r.cpu_ratio:.3f} "
                    f"| {r.detail} |")
    ratios = ["| threads | OPRO | COPRO | dspy.Evaluate |", "| ---: | ---: | ---: | ---: |"]
    for threads in args.threads:
        cells = []
        for name in ("OPRO", "COPRO", "dspy.Evaluate"):
            match = [r for r in results if r.optimizer == name and r.threads == threads]
            cells.append(f"{match[0].ratio:.3f}" if match else "—")
        ratios.append(f"| {threads} | " + " | ".join(cells) + " |")
    text = [
        "# Overhead: wall time against the floor",
        "",
        f"Written by `python benchmarks/overhead.py{' --quick' if args.quick else ''}`. Simulated endpoint, "
        f"{1000 * args.latency:.0f} ms per request, `engine=\"{args.engine}\"`, no cache, no retries; the endpoint "
        f"runs in {'a process of its own' if args.server == 'process' else 'a thread of the client process'}. "
        f"OPRO: {args.steps} steps x {args.candidates} candidates x {args.train} training examples with "
        "`dspy.Predict(\"question -> answer\")` (one request per evaluation); COPRO with about as many task "
        "evaluations; stock `dspy.Evaluate` over as many requests as OPRO's evaluations.",
        "",
        "Floor: the critical path through each run's barriers with every request taking exactly the latency L and "
        "nothing else taking time. OPRO: `ceil(train/T)·L` for step -1, then per step `ceil(r/T)·L` for the "
        "proposals (r: the step's optimizer requests — `num_candidates` one-choice requests, or one request for "
        "`n` completions where the proposer asks for `n`) and `ceil(evaluations_in_step/T)·L` for the scoring. "
        "COPRO: its optimizer requests one after the other, plus `ceil(train/T)·L` per candidate (one "
        "`dspy.Evaluate` each). Evaluate: `ceil(requests/T)·L`. Lost: requests the client sent that the server did "
        "not answer with 200, plus evaluations missing from the record. Client CPU: CPU time of the client process "
        "(all threads) during the run; with one GIL, the run cannot take less wall time than that, hence the "
        "second ratio.",
        "",
        "\n".join(rows),
        "",
        "wall / floor:",
        "",
        "\n".join(ratios),
        "",
    ]
    if memory is not None:
        text += [
            f"## Run record: {args.record_steps} steps x {args.record_candidates} candidates x "
            f"{args.record_train} training examples",
            "",
            f"{memory['candidates']} candidates, {memory['scores']:,} per-example scores (synthetic, 0/1), a "
            "meta-prompt and 8 replies per step. Memory: tracemalloc, the built `RunState` alone.",
            "",
            "| in memory | save_state | load_state | state.json |",
            "| ---: | ---: | ---: | ---: |",
            f"| {memory['memory_mb']:.1f} MB | {memory['save_s']:.3f} s | {memory['load_s']:.3f} s | "
            f"{memory['file_mb']:.1f} MB |",
            "",
            "Aim: under 50 MB in memory and under 1 s to save.",
            "",
        ]
    if phases is not None:
        result, timings = phases
        text += [
            f"## OPRO's phases at {result.threads} threads (wall time, wrapped for one run)",
            "",
            f"The run: wall {result.wall:.2f} s, client CPU {result.cpu:.2f} s, {result.requests} requests, floor "
            f"{result.floor:.2f} s. Indented rows run inside the row above.",
            "",
            "| wall s | calls | phase |",
            "| ---: | ---: | --- |",
        ]
        for label, seconds, calls in timings:
            depth = (len(label) - len(label.lstrip())) // 2
            text.append(f"| {seconds:.3f} | {calls} | {'&nbsp;&nbsp;' * depth}{label.strip()} |")
        text.append("")
    if profiled is not None:
        result, shares = profiled
        text += [
            f"## Profile: OPRO at {result.threads} threads (py-spy, GIL-holding samples of all threads)",
            "",
            f"The profiled run (slower: sampling costs): wall {result.wall:.2f} s, client CPU {result.cpu:.2f} s, "
            f"{result.requests} requests. Indented rows are part of the row above. The split between worker threads "
            "and the main thread varies from run to run under GIL contention; the direct timings of OPRO's phases "
            "above are the firmer measure of the main thread's work.",
            "",
            "| share of GIL samples | where |",
            "| ---: | --- |",
        ]
        for label, share in shares:
            depth = (len(label) - len(label.lstrip())) // 2
            text.append(f"| {100 * share:.1f}% | {'&nbsp;&nbsp;' * depth}{label.strip()} |")
        text.append("")
    text += ["## Machine", ""] + [f"- {key}: {value}" for key, value in info.items()] + [""]
    return "\n".join(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per request")
    parser.add_argument("--threads", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16, 32])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--candidates", type=int, default=8)
    parser.add_argument("--train", type=int, default=32)
    parser.add_argument("--server", choices=["process", "thread"], default="process")
    parser.add_argument("--engine", choices=["litellm", "auto"], default="litellm",
                        help="DSPy's LM engine: LiteLLM (the default) or DSPy's native client")
    parser.add_argument("--only", default="opro,copro,evaluate", help="which runs: opro, copro, evaluate")
    parser.add_argument("--record-steps", type=int, default=200)
    parser.add_argument("--record-candidates", type=int, default=8)
    parser.add_argument("--record-train", type=int, default=1000)
    parser.add_argument("--no-record", action="store_true", help="skip the run-record measurement")
    parser.add_argument("--profile", type=int, default=None, metavar="THREADS",
                        help="profile one more OPRO run at THREADS with py-spy (pip install py-spy)")
    parser.add_argument("--quick", action="store_true", help="a short run: 1 step x 4 candidates x 16 examples")
    parser.add_argument("--no-ratios", dest="ratios", action="store_false",
                        help="skip the per-evaluation ratios against dspy.Evaluate (overhead_per_eval.py)")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.candidates, args.train = 1, 4, 16
        args.threads = [t for t in args.threads if t != 1] or [4]
        args.record_steps = 50
    only = set(args.only.split(","))

    dspy.disable_logging()
    counter = SentCounter()
    server = Server(args.latency, args.server)
    results: list[Result] = []
    profiled = phases = None
    try:
        connection = {"api_base": server.base_url, "api_key": "x", "engine": args.engine, "cache": False,
                      "num_retries": 0}
        bench = Bench(server=server, task_lm=CountingLM(TASK_MODEL, counter=counter, **connection),
                      prompt_lm=CountingLM(OPTIMIZER_MODEL, counter=counter, **connection), counter=counter,
                      trainset=simulated_dataset(args.train), latency=args.latency, steps=args.steps,
                      candidates=args.candidates)
        warm_up(bench)
        for threads in args.threads:
            opro = bench.opro(threads)
            evaluations = int(opro.detail.split()[0])
            batch = [opro]
            if "copro" in only:
                batch.append(bench.copro(threads, evaluations))
            if "evaluate" in only:
                batch.append(bench.evaluate(threads, evaluations))
            for result in batch:
                print(line(result), flush=True)
            results.extend(batch)
        if args.profile is not None:
            phases = phase_times(bench, args.profile)
            print(f"\nOPRO's phases: {line(phases[0])}")
            for label, seconds, calls in phases[1]:
                print(f"  {seconds:7.3f} s  {calls:4d} calls  {label}")
            profiled = profile(bench, args.profile)
    finally:
        server.close()

    print("\nwall / floor: " + ", ".join(f"{r.optimizer}@{r.threads}={r.ratio:.3f}" for r in results))
    memory = None
    if not args.no_record:
        memory = measure_state(args.record_steps, args.record_candidates, args.record_train)
        print(f"run record {args.record_steps}x{args.record_candidates}x{args.record_train}: "
              f"{memory['memory_mb']:.1f} MB in memory, save {memory['save_s']:.3f} s, load {memory['load_s']:.3f} s, "
              f"state.json {memory['file_mb']:.1f} MB")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(Path(__file__).parent))
    import overhead_per_eval as per_eval

    section = per_eval.existing_section(out)
    if args.ratios:
        section = per_eval.keep_diagnosis(
            per_eval.build_section(["--no-probes", "--no-units", "--latency", str(args.latency)]
                                   + (["--quick"] if args.quick else [])), section)
    out.write_text(render(results, memory, args, machine(), profiled, phases), encoding="utf-8")
    if section is not None:
        per_eval.write_section(section, out)
    print(f"wrote {out}")
    return 0


# Where the GIL time of a run goes: (label, regular expression searched in a py-spy stack, one frame
# "function (file:line)" after another, ";"-separated, from the frame that matches onwards).
PROFILE_GROUPS = [
    ("DSPy Predict call in a worker (whole)", r"^Predict\.__call__ \(dspy/predict/predict\.py"),
    ("  LiteLLM completion (whole)", r"^client\.<locals>\.wrapper \(litellm/utils\.py"),
    ("    litellm.main.completion", r"^completion \(litellm/main\.py"),
    ("      OpenAI client request (httpx)", r"^SyncAPIClient\.post \(openai/_base_client\.py"),
    ("    LiteLLM response cost lookup", r"^Logging\.response_cost_calculator"),
    ("  DSPy adapter format + parse", r"^(Chat)?Adapter\.(format|_call_postprocess) \("),
    ("LiteLLM logging worker (success handler)", r"^Logging\.success_handler"),
    ("dspy_opro run_example (whole, the Predict call included)", r"^run_example \(dspy_opro/scoring/evaluation\.py"),
    ("dspy_opro main thread: OPRORun.execute (whole)", r"^OPRORun\.execute \(dspy_opro/core/run\.py"),
    ("  Runner.map dispatch loop (a candidate's dspy.Evaluate call)", r"^Runner\.map \(dspy_opro/scoring/engine\.py"),
    ("    _DaemonPool.submit", r"^Runner\.map .*;_DaemonPool\.submit"),
    ("    concurrent.futures.wait", r"^Runner\.map .*;wait \(concurrent/futures/_base\.py"),
    ("    OPRORun.record_result", r"^OPRORun\.record_result"),
    ("  with_instructions (program deep copies)", r"^with_instructions \(dspy_opro/task/programs\.py"),
    ("  propose (optimizer calls)", r"^propose \(dspy_opro/core/proposals\.py"),
    ("  OPRORun._result (candidate_programs)", r"^OPRORun\._result"),
]


def summarize_profile(raw: str) -> list[tuple[str, float]]:
    """Share of GIL-holding samples under each of :data:`PROFILE_GROUPS` (py-spy's raw format)."""
    import re

    total, counts = 0, dict.fromkeys([label for label, _ in PROFILE_GROUPS], 0)
    for text in raw.splitlines():
        stack, _, count = text.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        total += int(count)
        frames = stack.split(";")
        for label, pattern in PROFILE_GROUPS:
            if any(re.search(pattern, ";".join(frames[i:])) for i in range(len(frames))):
                counts[label] += int(count)
    return [(label, counts[label] / total if total else 0.0) for label, _ in PROFILE_GROUPS]


def phase_times(bench: Bench, threads: int) -> tuple[Result, list[tuple[str, float, int]]]:
    """One more OPRO run with OPRO's own phases timed (wall seconds, calls), by wrapping them for the run."""
    import dspy_opro.core.run as run_module
    import dspy_opro.record.recorder as recorder_module
    import dspy_opro.scoring.scorer as scorer_module

    timings: dict[str, list[float]] = {}
    targets = [
        ("OPRORun._score: the scoring phases (requests included)", run_module.OPRORun, "_score"),
        ("  OPRORun.record_result (per evaluation)", run_module.OPRORun, "record_result"),
        ("  with_instructions (a program copy per candidate)", scorer_module, "with_instructions"),
        ("propose: the proposal phases (requests included)", run_module, "propose"),
        ("gen_meta_prompt", run_module, "gen_meta_prompt"),
        ("step_candidates: the triage", run_module, "step_candidates"),
        ("RunRecorder.save", recorder_module.RunRecorder, "save"),
        ("OPRORun._result (candidate_programs)", run_module.OPRORun, "_result"),
    ]
    originals = []
    for label, owner, name in targets:
        original = getattr(owner, name)
        originals.append((owner, name, original))

        def timed(*args: Any, _original: Any = original, _label: str = label, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                entry = timings.setdefault(_label, [0.0, 0])
                entry[0] += time.perf_counter() - started
                entry[1] += 1

        setattr(owner, name, timed)
    try:
        result = bench.opro(threads)
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
    return result, [(label, *timings.get(label, [0.0, 0])) for label, _, _ in targets]


def profile(bench: Bench, threads: int) -> tuple[Result, list[tuple[str, float]]] | None:
    """One more OPRO run sampled by py-spy (all threads, only while they hold the GIL)."""
    import shutil
    import signal
    import subprocess

    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        print("--profile needs py-spy: pip install py-spy", file=sys.stderr)
        return None
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "profile.txt"
        recorder = subprocess.Popen([spy, "record", "--pid", str(os.getpid()), "--gil", "--rate", "200",
                                     "--format", "raw", "--output", str(out)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.5)  # attach
        result = bench.opro(threads)
        recorder.send_signal(signal.SIGINT)
        recorder.wait(60)
        raw = out.read_text() if out.exists() else ""
    print(f"\nprofiled (py-spy, GIL-holding samples of all threads): {line(result)}")
    if not raw:
        print("py-spy wrote no samples (it may need ptrace permission: run as root or set "
              "kernel.yama.ptrace_scope=0)")
        return None
    shares = summarize_profile(raw)
    for label, share in shares:
        print(f"  {100 * share:5.1f}%  {label}")
    return result, shares


if __name__ == "__main__":
    raise SystemExit(main())
