"""Compare OPRO with DSPy's own optimizers on one program, one data split, one pair of models and one budget.

Every contender optimizes the same program (``dspy.ChainOfThought("question -> answer")`` by default) on the same
training examples, with the same task model running the program and the same optimizer model writing instructions,
under a comparable budget counted in metric calls (one program run plus its metric on one example):

* ``baseline``: the program as given, no optimization;
* ``opro``: :class:`dspy_opro.OPROTeleprompter`, ``max_metric_calls=N``;
* ``copro``: ``dspy.COPRO`` with ``breadth * depth * len(trainset) ~= N``;
* ``miprov2``: ``dspy.MIPROv2``, instructions only (no demos), ``num_trials``/``num_candidates`` (and minibatches
  on large training sets) so that its evaluations on the training set come to about N;
* ``gepa``: ``dspy.GEPA``, ``max_metric_calls=N``;
* ``opro-racing`` (``--contenders`` only): ``racing=True``, twice the planned steps, the same ``max_metric_calls=N``;
* with ``--opro-variants``: ``opro-hard-diverse`` (``exemplar_selection="hard_diverse"``), ``opro-val-gate``
  (``val_gate=True``: it sees the validation split, so its validation score is not held out) and
  ``opro-label-free`` (``metric=PairwisePreference(...)``, the task model judging itself);
* with ``--extra NAME`` (repeatable): any other DSPy teleprompter, by class name (``SIMBA``) or dotted path
  (``dspy.teleprompt.SIMBA``), built with ``metric=`` and best-effort budget arguments.

No contender sees the validation split while searching, except ``opro-val-gate`` and ``opro-label-free`` (whose
gates use it by design). After each compile the program is evaluated on both splits; those evaluations are not
counted in the contender's calls, which are taken from the simulated endpoint's request log (offline) or the
models' history (``--lm``) during the compile only.

Offline (the default) everything runs against the simulated OpenAI-compatible model on 127.0.0.1
(:func:`offline_endpoint`: :class:`dspy_opro.testing.SimulatedEndpoint` with the simulated COPRO, MIPROv2 and
GEPA proposers of :mod:`benchmarks.simulated_peers` plugged in), with the task and optimizer models under different
names so that the request log tells them apart. With ``--lm MODEL`` (a LiteLLM model string, its key taken from
the environment) it runs against that model; ``--prompt-lm`` sets the optimizer.

    python benchmarks/compare_optimizers.py
    python benchmarks/compare_optimizers.py --budget 200 --opro-variants --extra SIMBA
    python benchmarks/compare_optimizers.py --lm openai/gpt-4o-mini --prompt-lm openai/gpt-4o --budget 300

Outputs in ``--out-dir`` (default ``compare_results/``): ``comparison.csv``, ``comparison.md``, one compiled
program per contender as ``<name>.json`` and, with matplotlib installed, ``comparison.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib
import inspect
import json
import math
import os
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: the repository root, for benchmarks.simulated_peers
    sys.path.insert(0, str(ROOT))

import dspy  # noqa: E402

from dspy_opro import OPROTeleprompter, PairwisePreference  # noqa: E402
from dspy_opro.testing import SimulatedEndpoint  # noqa: E402

DATA = ROOT / "examples" / "data" / "word_problems.jsonl"
STANDARD = ["baseline", "opro", "copro", "miprov2", "gepa"]
OPRO_VARIANTS = ["opro-hard-diverse", "opro-val-gate", "opro-label-free"]
# Selectable with --contenders only (not added by --opro-variants).
OPRO_EXTRA = ["opro-racing"]
FIELDS = [
    "name",
    "train",
    "val",
    "optimizer_calls",
    "task_calls",
    "optimizer_tokens",
    "task_tokens",
    "tokens",
    "wall_s",
    "budget",
    "best_instruction",
    "program",
    "error",
]
INSTRUCTION_CHARS = 80
OFFLINE_TASK_MODEL = "openai/sim-task"
OFFLINE_OPTIMIZER_MODEL = "openai/sim-optimizer"


# -------------------------------------------------------------------------------- data


def load_problems() -> list[dspy.Example]:
    """The bundled arithmetic word problems (question -> integer answer)."""
    rows = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [dspy.Example(question=row["question"], answer=row["answer"]).with_inputs("question") for row in rows]


def exact_integer(example: dspy.Example, prediction: dspy.Prediction, trace: Any = None) -> float:
    """1.0 when the first integer in the program's answer equals the reference answer."""
    match = re.search(r"-?\d+", str(getattr(prediction, "answer", "")).replace(",", ""))
    return float(match is not None and match.group(0) == str(example.answer))


def with_feedback(metric: Callable[..., Any]) -> Callable[..., dspy.Prediction]:
    """``metric`` in the five-argument shape GEPA takes, returning ``dspy.Prediction(score=..., feedback=...)``."""

    def feedback_metric(
        gold: dspy.Example, pred: Any, trace: Any = None, pred_name: str | None = None, pred_trace: Any = None
    ) -> dspy.Prediction:
        value = metric(gold, pred, trace)
        score = float(getattr(value, "score", value))
        labels = {key: gold[key] for key in gold.labels().keys()}
        if score >= 1.0:
            feedback = f"Correct: {labels}."
        else:
            got = {key: pred.get(key) for key in labels} if hasattr(pred, "get") else pred
            feedback = f"Wrong: expected {labels}, got {got}."
        return dspy.Prediction(score=score, feedback=feedback)

    return feedback_metric


# ------------------------------------------------------------------------- call meters


class MeteredLM(dspy.LM):
    """A ``dspy.LM`` that reports every history entry (one per completed request) to a shared meter.

    Optimizers copy LMs (``lm.copy(rollout_id=...)``); a copy shares the ``meter`` attribute, so its calls are
    counted too, under the same role.
    """

    def __init__(self, *args: Any, role: str, meter: HistoryMeter, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.role = role
        self.meter = meter

    def update_history(self, entry: dict[str, Any]) -> None:
        super().update_history(entry)
        self.meter.add(self.role, entry)


@dataclass
class Usage:
    """What one contender's compile sent: calls and tokens per role, and requests that failed."""

    optimizer_calls: int = 0
    task_calls: int = 0
    optimizer_tokens: int = 0
    task_tokens: int = 0
    failed_requests: int = 0


@dataclass
class HistoryMeter:
    """Counts LM history entries per role (online runs)."""

    entries: list[tuple[str, int, bool]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, role: str, entry: dict[str, Any]) -> None:
        usage = entry.get("usage") or {}
        tokens = int(usage.get("total_tokens") or 0)
        cache_hit = bool(getattr(entry.get("response"), "cache_hit", False))
        with self.lock:
            self.entries.append((role, tokens, cache_hit))

    def mark(self) -> int:
        with self.lock:
            return len(self.entries)

    def since(self, mark: int) -> Usage:
        with self.lock:
            entries = self.entries[mark:]
        usage = Usage()
        for role, tokens, cache_hit in entries:
            if cache_hit:
                continue
            if role == "optimizer":
                usage.optimizer_calls += 1
                usage.optimizer_tokens += tokens
            else:
                usage.task_calls += 1
                usage.task_tokens += tokens
        return usage


class EndpointMeter:
    """Counts the simulated endpoint's requests per model name (offline runs)."""

    def __init__(self, endpoint: Any, task_model: str, optimizer_model: str):
        self.endpoint = endpoint
        self.task_model = task_model.split("/", 1)[-1]
        self.optimizer_model = optimizer_model.split("/", 1)[-1]

    def mark(self) -> int:
        # every contender starts from the same simulated model state
        self.endpoint.reset_log()
        return 0

    def since(self, mark: int) -> Usage:
        usage = Usage()
        for record in self.endpoint.requests[mark:]:
            if record.status != 200:
                usage.failed_requests += 1
            if record.model == self.optimizer_model:
                usage.optimizer_calls += 1
                usage.optimizer_tokens += record.total_tokens
            else:
                usage.task_calls += 1
                usage.task_tokens += record.total_tokens
        return usage


def offline_endpoint(seed: int = 0, **options: Any) -> SimulatedEndpoint:
    """The simulated endpoint of offline runs, answering every contender's proposals (not yet started).

    OPRO's meta-prompts are answered by the endpoint itself; COPRO's, MIPROv2's and GEPA's by the simulated peers
    of :mod:`benchmarks.simulated_peers`, plugged in as its responders. ``options`` go to the endpoint.
    """
    from benchmarks.simulated_peers import PEERS

    return SimulatedEndpoint(seed=seed, responders=PEERS, **options)


# -------------------------------------------------------------------------- contenders


@dataclass
class Setup:
    """What every contender shares."""

    program: Callable[[], dspy.Module]
    trainset: list[dspy.Example]
    valset: list[dspy.Example]
    metric: Callable[..., Any]
    task_lm: dspy.BaseLM
    prompt_lm: dspy.BaseLM
    budget: int
    num_threads: int
    seed: int = 0


def opro_plan(budget: int, n_train: int, reserve: int = 0) -> tuple[int, int]:
    """(num_steps, num_candidates) that fill ``budget - reserve`` evaluations with whole steps.

    The starting program costs one pass over the training set; each candidate another. About as many steps as
    candidates per step (at most the authors' 8 candidates).
    """
    passes = max(1, (budget - reserve) // n_train - 1)
    candidates = min(8, max(1, round(math.sqrt(passes))))
    return max(1, passes // candidates), candidates


def copro_plan(budget: int, n_train: int) -> tuple[int, int]:
    """(breadth, depth) with breadth * depth * n_train ~= budget (COPRO needs breadth >= 2)."""
    passes = budget / n_train
    depth = 1 if passes < 4 else 2 if passes < 9 else 3
    return max(2, int(passes // depth)), depth


def mipro_plan(budget: int, n_eval: int) -> dict[str, Any]:
    """MIPROv2 settings whose evaluations on the ``n_eval`` search examples come to about ``budget``.

    Small sets: every trial is a full evaluation, plus the starting program's (``(1 + trials) * n_eval``). Sets of
    40 or more: minibatches of ``min(35, n_eval // 2)``, a full evaluation every 5 trials and at the end, plus the
    starting program's.
    """
    if n_eval < 40:
        trials = max(1, budget // n_eval - 1)
        plan = {
            "minibatch": False,
            "num_trials": trials,
            "evaluations": (1 + trials) * n_eval,
        }
    else:
        size, every = min(35, n_eval // 2), 5

        def cost(trials: int) -> int:
            full = trials // every + (1 if trials % every else 0)
            return n_eval + trials * size + full * n_eval

        trials = 1
        while cost(trials + 1) <= budget:
            trials += 1
        plan = {
            "minibatch": True,
            "minibatch_size": size,
            "minibatch_full_eval_steps": every,
            "num_trials": trials,
            "evaluations": cost(trials),
        }
    plan["num_candidates"] = max(2, math.ceil(plan["num_trials"] * 2 / 3))
    return plan


def _run_opro(setup: Setup, student: dspy.Module, variant: str) -> tuple[dspy.Module, str]:
    n_train, n_val = len(setup.trainset), len(setup.valset)
    options: dict[str, Any] = {"metric": setup.metric}
    reserve, valset, note = 0, None, ""
    if variant == "opro-hard-diverse":
        options["exemplar_selection"] = "hard_diverse"
    elif variant == "opro-val-gate":
        options.update(val_gate=True, top_k=1)
        reserve, valset, note = 2 * n_val, setup.valset, "; gate on the valset"
    elif variant == "opro-label-free":
        options.update(metric=PairwisePreference(judge_model=setup.task_lm))
        reserve, valset, note = (
            2 * n_val,
            setup.valset,
            "; task model judges, gate on the valset",
        )
    steps, candidates = opro_plan(setup.budget, n_train, reserve)
    if variant == "opro-racing":
        # Racing spends fewer calls per step: plan twice the steps, the budget caps it.
        options["racing"], steps = True, 2 * steps
        note = "; racing"
    optimizer = OPROTeleprompter(
        **options,
        prompt_model=setup.prompt_lm,
        task_model=setup.task_lm,
        num_steps=steps,
        num_candidates=candidates,
        num_exemplars=min(3, n_train),
        max_metric_calls=setup.budget,
        num_threads=setup.num_threads,
        seed=setup.seed,
    )
    compiled = optimizer.compile(student, trainset=setup.trainset, valset=valset)
    spent = compiled.opro_run.metric_calls
    return (
        compiled,
        f"max_metric_calls={setup.budget}: {steps} steps x {candidates} candidates, {spent} used{note}",
    )


def _run_copro(setup: Setup, student: dspy.Module) -> tuple[dspy.Module, str]:
    n_train = len(setup.trainset)
    breadth, depth = copro_plan(setup.budget, n_train)
    optimizer = dspy.COPRO(metric=setup.metric, prompt_model=setup.prompt_lm, breadth=breadth, depth=depth)
    compiled = optimizer.compile(
        student,
        trainset=setup.trainset,
        eval_kwargs={"num_threads": setup.num_threads, "display_progress": False},
    )
    return (
        compiled,
        f"breadth={breadth}, depth={depth}: {breadth}*{depth}*{n_train}={breadth * depth * n_train}",
    )


def _run_mipro(setup: Setup, student: dspy.Module) -> tuple[dspy.Module, str]:
    plan = mipro_plan(setup.budget, len(setup.trainset))
    optimizer = dspy.MIPROv2(
        metric=setup.metric,
        prompt_model=setup.prompt_lm,
        task_model=setup.task_lm,
        auto=None,
        num_candidates=plan["num_candidates"],
        max_bootstrapped_demos=0,
        max_labeled_demos=0,
        num_threads=setup.num_threads,
        seed=setup.seed or 9,
        verbose=False,
    )
    compile_args = {
        key: plan[key] for key in ("minibatch", "minibatch_size", "minibatch_full_eval_steps") if key in plan
    }
    # The training set is also its search set: the validation split stays held out.
    compiled = optimizer.compile(
        student,
        trainset=setup.trainset,
        valset=setup.trainset,
        num_trials=plan["num_trials"],
        **compile_args,
    )
    batches = f", minibatch {plan['minibatch_size']}" if plan["minibatch"] else ", full evaluations"
    return compiled, (
        f"num_trials={plan['num_trials']}, "
        f"num_candidates={plan['num_candidates']}{batches}: "
        f"~{plan['evaluations']} + bootstrap runs for the proposer"
    )


def _run_gepa(setup: Setup, student: dspy.Module) -> tuple[dspy.Module, str]:
    optimizer = dspy.GEPA(
        metric=with_feedback(setup.metric),
        max_metric_calls=setup.budget,
        reflection_lm=setup.prompt_lm,
        num_threads=setup.num_threads,
        seed=setup.seed,
    )
    # no valset: GEPA tracks Pareto on training
    compiled = optimizer.compile(student, trainset=setup.trainset)
    return compiled, f"max_metric_calls={setup.budget}"


def resolve_teleprompter(name: str) -> type:
    """A DSPy teleprompter class from a class name (``SIMBA``) or a dotted path (``dspy.teleprompt.SIMBA``)."""
    if "." in name:
        module_name, _, attr = name.rpartition(".")
        return getattr(importlib.import_module(module_name), attr)
    for namespace in (dspy, dspy.teleprompt):
        if hasattr(namespace, name):
            return getattr(namespace, name)
    raise ValueError(f"unknown teleprompter {name!r}; give a DSPy class name or a dotted path")


def _budget_kwargs(cls: type, setup: Setup) -> tuple[dict[str, Any], str]:
    """Best-effort budget arguments for a teleprompter class, from the names its constructor accepts."""
    n_train, budget = len(setup.trainset), setup.budget
    params = inspect.signature(cls.__init__).parameters
    kwargs: dict[str, Any] = {}
    if "max_metric_calls" in params:
        kwargs["max_metric_calls"] = budget
    # SIMBA: per step, bsize x num_candidates trajectories, then the candidates on the batch
    if "bsize" in params:
        kwargs["bsize"] = min(32, n_train)
        candidates = 4 if "num_candidates" in params else 1
        kwargs["num_candidates"] = candidates
        if "max_steps" in params:
            kwargs["max_steps"] = max(1, budget // (2 * kwargs["bsize"] * candidates))
    elif "breadth" in params and "depth" in params:
        kwargs["breadth"], kwargs["depth"] = copro_plan(budget, n_train)
    elif "num_candidate_programs" in params:
        # random search: 3 seeded programs plus the candidates, each scored
        kwargs["num_candidate_programs"] = max(1, budget // n_train - 3)
    elif "num_candidates" in params and "auto" in params:
        kwargs.update(auto=None, num_candidates=mipro_plan(budget, n_train)["num_candidates"])
    if "num_threads" in params:
        kwargs["num_threads"] = setup.num_threads
    for name, lm in (
        ("prompt_model", setup.prompt_lm),
        ("reflection_lm", setup.prompt_lm),
        ("task_model", setup.task_lm),
    ):
        if name in params:
            kwargs[name] = lm
    shown = {k: v for k, v in kwargs.items() if not isinstance(v, dspy.BaseLM)}
    return kwargs, ", ".join(f"{k}={v}" for k, v in shown.items()) or "no budget argument known"


def _run_extra(setup: Setup, student: dspy.Module, name: str) -> tuple[dspy.Module, str]:
    cls = resolve_teleprompter(name)
    kwargs, note = _budget_kwargs(cls, setup)
    metric = setup.metric
    if "GEPA" in cls.__name__:
        metric = with_feedback(metric)
    optimizer = cls(metric=metric, **kwargs)
    compile_params = inspect.signature(optimizer.compile).parameters
    compile_args: dict[str, Any] = {"trainset": setup.trainset}
    if "num_trials" in compile_params and kwargs.get("auto", "x") is None:
        compile_args["num_trials"] = mipro_plan(setup.budget, len(setup.trainset))["num_trials"]
    compiled = optimizer.compile(student, **compile_args)
    return compiled, note


def contender_name(spec: str) -> str:
    """The row name of a contender: standard names as given, extras by lower-case class name."""
    if spec in STANDARD or spec in OPRO_VARIANTS or spec in OPRO_EXTRA:
        return spec
    return spec.rpartition(".")[2].lower()


def _compile(setup: Setup, spec: str, student: dspy.Module) -> tuple[dspy.Module, str]:
    if spec == "baseline":
        return student, "none"
    if spec == "opro" or spec in OPRO_VARIANTS or spec in OPRO_EXTRA:
        return _run_opro(setup, student, spec)
    if spec == "copro":
        return _run_copro(setup, student)
    if spec == "miprov2":
        return _run_mipro(setup, student)
    if spec == "gepa":
        return _run_gepa(setup, student)
    return _run_extra(setup, student, spec)


# ---------------------------------------------------------------------- the comparison


def evaluate(program: dspy.Module, examples: Sequence[dspy.Example], setup: Setup) -> float:
    """The program's mean metric on ``examples``, 0-100."""
    if not examples:
        return float("nan")
    evaluator = dspy.Evaluate(
        devset=list(examples),
        metric=setup.metric,
        num_threads=setup.num_threads,
        display_progress=False,
        max_errors=len(examples) + 1,
    )
    with dspy.context(lm=setup.task_lm):
        return float(evaluator(program).score)


def first_instruction(program: dspy.Module) -> str:
    """The first predictor's instruction on one line, cut to ``INSTRUCTION_CHARS``."""
    predictors = program.named_predictors()
    if not predictors:
        return ""
    text = " ".join(str(predictors[0][1].signature.instructions).split())
    return text if len(text) <= INSTRUCTION_CHARS else text[: INSTRUCTION_CHARS - 3] + "..."


def run_contender(setup: Setup, spec: str, meter: Any, out_dir: Path) -> dict[str, Any]:
    """Compile one contender, score it on both splits and save it to ``out_dir``: its row (``FIELDS``).

    A failing compile or evaluation is reported in the row's ``error``, not raised.
    """
    name = contender_name(spec)
    row: dict[str, Any] = {key: None for key in FIELDS}
    row["name"] = name
    student = setup.program()
    mark = meter.mark()
    started = time.perf_counter()
    try:
        with dspy.context(lm=setup.task_lm):
            compiled, budget_note = _compile(setup, spec, student)
    except Exception as exc:
        usage = meter.since(mark)
        row.update(
            wall_s=round(time.perf_counter() - started, 2),
            optimizer_calls=usage.optimizer_calls,
            task_calls=usage.task_calls,
            error=f"{type(exc).__name__}: {exc}"[:300],
        )
        print(f"[{name}] failed: {row['error']}")
        traceback.print_exc()
        return row
    wall = time.perf_counter() - started
    # read before the evaluations below, which are not the contender's
    usage = meter.since(mark)
    row.update(
        optimizer_calls=usage.optimizer_calls,
        task_calls=usage.task_calls,
        optimizer_tokens=usage.optimizer_tokens,
        task_tokens=usage.task_tokens,
        tokens=usage.optimizer_tokens + usage.task_tokens,
        wall_s=round(wall, 2),
        budget=budget_note,
        best_instruction=first_instruction(compiled),
    )
    try:
        row["train"] = round(evaluate(compiled, setup.trainset, setup), 1)
        row["val"] = round(evaluate(compiled, setup.valset, setup), 1)
        path = out_dir / f"{name}.json"
        compiled.save(str(path))
        row["program"] = path.name
    except Exception as exc:
        row["error"] = f"evaluation failed: {type(exc).__name__}: {exc}"[:300]
    print(
        f"[{name}] train {row['train']}, val {row['val']}, "
        f"{row['optimizer_calls']} optimizer + "
        f"{row['task_calls']} task calls, {row['wall_s']} s"
    )
    return row


def _fmt(value: Any) -> str:
    """A table cell: one decimal for floats, a dash for missing values, pipes escaped."""
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.1f}" if not math.isnan(value) else "—"
    return str(value).replace("|", "\\|")


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table, one line per contender (``ERROR: ...`` where it failed)."""
    header = [
        "contender",
        "train",
        "val",
        "optimizer calls",
        "task calls",
        "tokens",
        "wall s",
        "budget mapping",
        "best instruction",
    ]
    lines = [
        "| " + " | ".join(header) + " |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for row in rows:
        last = row["best_instruction"] if not row["error"] else f"ERROR: {row['error']}"
        cells = [
            row["name"],
            row["train"],
            row["val"],
            row["optimizer_calls"],
            row["task_calls"],
            row["tokens"],
            row["wall_s"],
            row["budget"],
            last,
        ]
        lines.append("| " + " | ".join(_fmt(cell) for cell in cells) + " |")
    return "\n".join(lines)


NOTE = (
    "Scores are the metric's mean on 0-100, from evaluating each compiled program "
    "on both splits after its compile; those evaluations are not in the call counts. "
    "Calls and tokens are what the compile sent to the optimizer model and to the "
    "task model (a request with n choices counts once). The budget N is in metric "
    "calls (one program run and its metric on one example)."
)


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    """The rows as CSV with the ``FIELDS`` header (None written as an empty cell)."""
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        for row in rows:
            writer.writerow({key: "" if row.get(key) is None else row[key] for key in FIELDS})


def plot(rows: list[dict[str, Any]], path: Path) -> Path | None:
    """Train and validation bars per contender (None without matplotlib)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    names = [row["name"] for row in rows]
    train = [row["train"] or 0.0 for row in rows]
    val = [row["val"] or 0.0 for row in rows]
    figure = Figure(figsize=(max(6.0, 1.1 * len(rows) + 2), 4.2))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    positions = range(len(rows))
    width = 0.38
    axes.bar([p - width / 2 for p in positions], train, width, label="train")
    axes.bar([p + width / 2 for p in positions], val, width, label="validation")
    axes.set_xticks(list(positions))
    axes.set_xticklabels(names, rotation=30, ha="right")
    axes.set_ylabel("score (0-100)")
    axes.set_ylim(0, 100)
    axes.set_title("Optimizers on the same program, data, models and budget")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return path


def run_comparison(
    *,
    trainset: Sequence[dspy.Example],
    valset: Sequence[dspy.Example],
    task_lm: dspy.BaseLM,
    prompt_lm: dspy.BaseLM,
    meter: Any,
    budget: int = 200,
    contenders: Sequence[str] | None = None,
    opro_variants: bool = False,
    extras: Sequence[str] = (),
    metric: Callable[..., Any] = exact_integer,
    program: Callable[[], dspy.Module] | None = None,
    num_threads: int = 8,
    out_dir: str | os.PathLike[str] = "compare_results",
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Run every contender and write the table, the CSV, the compiled programs and the chart to ``out_dir``.

    Args:
        trainset: The examples every contender optimizes on.
        valset: Held-out examples each compiled program is scored on (seen while searching only by
            ``opro-val-gate`` and ``opro-label-free``).
        task_lm: The model that runs the program.
        prompt_lm: The optimizer model that writes instructions.
        meter: Counts calls per role between ``mark()`` and ``since(mark)``: an :class:`EndpointMeter` offline or
            the :class:`HistoryMeter` shared by two :class:`MeteredLM` models.
        budget: Metric calls per contender (N).
        contenders: Names from ``baseline, opro, copro, miprov2, gepa`` and the OPRO variants; None: the standard
            five.
        opro_variants: Add ``opro-hard-diverse``, ``opro-val-gate`` and ``opro-label-free``.
        extras: Other DSPy teleprompters, by class name or dotted path.
        metric: The metric every contender optimizes and is scored with.
        program: Builds a fresh copy of the program; None: ``dspy.ChainOfThought("question -> answer")``.
        num_threads: Threads for every optimizer and evaluation.
        out_dir: Where the table, the CSV, the compiled programs and the chart go.
        seed: The optimizers' seed.

    Returns:
        One dict per contender (keys as in ``FIELDS``), in the order run.
    """
    specs = list(contenders if contenders is not None else STANDARD)
    if opro_variants:
        specs += [v for v in OPRO_VARIANTS if v not in specs]
    specs += list(extras)
    setup = Setup(
        program=program or (lambda: dspy.ChainOfThought("question -> answer")),
        trainset=list(trainset),
        valset=list(valset),
        metric=metric,
        task_lm=task_lm,
        prompt_lm=prompt_lm,
        budget=budget,
        num_threads=num_threads,
        seed=seed,
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = [run_contender(setup, spec, meter, out) for spec in specs]
    table = markdown_table(rows)
    (out / "comparison.md").write_text(
        f"{table}\n\n{len(setup.trainset)} training and {len(setup.valset)} "
        f"validation examples, budget N={budget} metric calls, {num_threads} threads; "
        f"task model {task_lm.model}, optimizer model "
        f"{prompt_lm.model}.\n\n{NOTE}\n",
        encoding="utf-8",
    )
    write_csv(rows, out / "comparison.csv")
    plot(rows, out / "comparison.png")
    return rows


def read_csv(path: str | os.PathLike[str]) -> list[dict[str, str]]:
    """The rows :func:`write_csv` wrote, as strings."""
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module's docstring); returns the exit status."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--lm",
        help="LiteLLM model string of the task model; default: a simulated model",
    )
    parser.add_argument("--prompt-lm", help="optimizer model (default: the same as --lm)")
    parser.add_argument(
        "--dataset",
        choices=["word_problems", "simulated"],
        default="word_problems",
        help="the bundled examples/data/word_problems.jsonl, or dspy_opro.testing.simulated_dataset",
    )
    parser.add_argument("--train", type=int, default=20, help="training examples")
    parser.add_argument(
        "--val",
        type=int,
        default=20,
        help="validation examples (after the training ones)",
    )
    parser.add_argument("--budget", type=int, default=200, help="metric calls per contender (N)")
    parser.add_argument(
        "--contenders",
        default=",".join(STANDARD),
        help="comma-separated, from " + ", ".join(STANDARD + OPRO_VARIANTS + OPRO_EXTRA),
    )
    parser.add_argument("--opro-variants", action="store_true", help="add " + ", ".join(OPRO_VARIANTS))
    parser.add_argument(
        "--extra",
        action="append",
        default=[],
        help="another DSPy teleprompter: class name (SIMBA) or dotted path; repeatable",
    )
    parser.add_argument(
        "--program",
        choices=["cot", "predict"],
        default="cot",
        help="dspy.ChainOfThought or dspy.Predict over 'question -> answer'",
    )
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cache",
        action="store_true",
        help="--lm only: let DSPy's cache answer repeated requests",
    )
    parser.add_argument("--out-dir", default="compare_results")
    args = parser.parse_args(argv)

    if args.dataset == "simulated":
        from dspy_opro.testing import simulated_dataset

        data = simulated_dataset(args.train + args.val, seed=args.seed)
    else:
        data = load_problems()
    trainset, valset = data[: args.train], data[args.train : args.train + args.val]
    if not trainset:
        parser.error("no training examples")
    contenders = [name.strip() for name in args.contenders.split(",") if name.strip()]
    known = STANDARD + OPRO_VARIANTS + OPRO_EXTRA
    unknown = [name for name in contenders if name not in known]
    if unknown:
        parser.error(f"unknown contenders {unknown}; use --extra for other teleprompters")
    module = dspy.ChainOfThought if args.program == "cot" else dspy.Predict

    with contextlib.ExitStack() as stack:
        if args.lm:
            history = HistoryMeter()
            task_lm = MeteredLM(args.lm, temperature=0.0, cache=args.cache, role="task", meter=history)
            prompt_lm = MeteredLM(
                args.prompt_lm or args.lm,
                engine="litellm",
                cache=args.cache,
                role="optimizer",
                meter=history,
            )
            meter: Any = history
            print(f"Running against {args.lm} (optimizer: {prompt_lm.model}).")
        else:
            endpoint = stack.enter_context(offline_endpoint(seed=args.seed))
            task_lm = endpoint.lm(OFFLINE_TASK_MODEL)
            prompt_lm = endpoint.lm(OFFLINE_OPTIMIZER_MODEL)
            meter = EndpointMeter(endpoint, OFFLINE_TASK_MODEL, OFFLINE_OPTIMIZER_MODEL)
            print(f"Running offline against a simulated model at {endpoint.base_url} (pass --lm MODEL for a real one).")
        print(f"{len(trainset)} training, {len(valset)} validation examples; budget {args.budget} metric calls.")
        rows = run_comparison(
            trainset=trainset,
            valset=valset,
            task_lm=task_lm,
            prompt_lm=prompt_lm,
            meter=meter,
            budget=args.budget,
            contenders=contenders,
            opro_variants=args.opro_variants,
            extras=args.extra,
            program=lambda: module("question -> answer"),
            num_threads=args.threads,
            out_dir=args.out_dir,
            seed=args.seed,
        )
    print()
    print(markdown_table(rows))
    print(f"\n{NOTE}")
    out_dir = Path(args.out_dir)
    print(
        f"\nWrote {out_dir / 'comparison.csv'}, comparison.md, "
        "the compiled programs (<name>.json)"
        f"{' and comparison.png' if (out_dir / 'comparison.png').exists() else ''}."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
