"""The lines of the library one default compile runs: distinct ``(file, line)`` pairs and modules entered.

Runs one ``OPROTeleprompter(metric, prompt_model=..., task_model=..., log_dir=...)`` compile with every other setting
at its default (10 steps of 8 candidates) of ``dspy.Predict("question -> answer")`` on 20 training examples against the
simulated endpoint, with ``sys.settrace``/``threading.settrace`` on, and counts the lines executed in ``dspy_opro``
outside ``dspy_opro/testing/``. Point ``PYTHONPATH`` at another checkout to measure that one::

    python benchmarks/traced_lines.py                          # this checkout
    PYTHONPATH=/tmp/before python benchmarks/traced_lines.py   # e.g. a worktree of an older commit

Method modules are counted apart: the port, proposing, one candidate's scoring, the step loop and selection
(``METHOD``, matched by path, for the old layout and the new).
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

METHOD = ("core/", "proposing/", "run.py", "selection.py", "scoring/scorer.py", "scoring/evaluation.py",
          "scoring/evaluator.py", "scoring_events.py")


def main() -> None:
    import dspy

    import dspy_opro
    from dspy_opro import OPROTeleprompter
    from dspy_opro.testing import SimulatedEndpoint, simulated_dataset, simulated_metric

    root = str(Path(dspy_opro.__file__).resolve().parent) + os.sep
    seen: set[tuple[str, int]] = set()

    def tracer(frame, event, arg):  # noqa: ANN001, ANN202 (the settrace protocol)
        path = frame.f_code.co_filename
        if not path.startswith(root) or path.startswith(root + "testing" + os.sep):
            return None
        if event == "line":
            seen.add((path[len(root):], frame.f_lineno))
        return tracer

    with SimulatedEndpoint() as endpoint, tempfile.TemporaryDirectory() as log_dir:
        optimizer = OPROTeleprompter(simulated_metric, prompt_model=endpoint.lm("openai/sim-opt"),
                                     task_model=endpoint.lm("openai/sim-task"), log_dir=log_dir)
        trainset = simulated_dataset(20)
        threading.settrace(tracer)
        sys.settrace(tracer)
        try:
            compiled = optimizer.compile(dspy.Predict("question -> answer"), trainset=trainset)
        finally:
            sys.settrace(None)
            threading.settrace(None)  # type: ignore[arg-type]
    modules = Counter(path for path, _ in seen)
    method = sum(n for path, n in modules.items() if path.startswith(METHOD) or path in METHOD)
    print(f"dspy_opro at {root}")
    print(f"steps: {len(compiled.opro_run.steps)}, candidates: {len(compiled.opro_run.candidates)}")
    print(f"distinct lines run: {len(seen)} in {len(modules)} modules; method modules: {method} "
          f"({100 * method / len(seen):.0f}%)")
    for path, n in modules.most_common():
        print(f"  {n:5d}  {path}")


if __name__ == "__main__":
    main()
