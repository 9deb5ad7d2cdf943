"""An OPRO run against a simulated endpoint that SIGKILLs itself at a chosen LM call, for the crash tests.

``python -m tests.kill_job BASE_URL LOG_DIR SCENARIO MODEL SPLIT KILL_AT [OPTIONS_JSON]`` runs :func:`build`'s
compile (with the settings of OPTIONS_JSON over the scenario's) and kills the process right after the KILL_AT-th
answered request of MODEL whose prompt holds a question of SPLIT (``train``, ``val`` or ``any``): the answer was
paid for, the evaluation it belongs to is never recorded. SPLIT ``all`` counts every answered request of MODEL (the
optimizer's meta-prompts: the reply is killed before the run journals it).
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import threading
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402
from dspy.utils.callback import BaseCallback  # noqa: E402

from dspy_opro import OPROTeleprompter, PairwisePreference  # noqa: E402
from dspy_opro.testing import simulated_dataset, simulated_metric  # noqa: E402

TASK, OPTIMIZER, JUDGE = "openai/gpt-4o-mini", "openai/gpt-4o", "openai/gpt-4.1-mini"
SCENARIOS: dict[str, dict[str, Any]] = {
    "train": {"select": "train"},  # the paper's selection, named: with a valset the default selects on it
    "validation": {"select": "validation", "top_k": 2},
    "val_gate": {"val_gate": True},
    "label_free": {"label_free": True},
    # The optimizer's worst case (n x max_tokens at its price) is bounded before each request: a cheap optimizer and
    # a small max_tokens leave the budget to be met by the evaluations, whose overshoot across kills is the subject.
    "budget": {"max_cost": 0.0004, "max_tokens": 10, "prompt_model": TASK},
    # Eight proposals a step, asked one choice at a time (the test's endpoint refuses n > 1, as llama-server with one
    # slot does), one request in flight at a time: a kill among them is the subject.
    "single_choice": {"num_candidates": 8},
}


def datasets() -> tuple[list[dspy.Example], list[dspy.Example]]:
    return simulated_dataset(6, seed=1), simulated_dataset(4, seed=2)


def build(base_url: str, log_dir: str, scenario: str, **overrides: Any) -> tuple[OPROTeleprompter, dspy.Module]:
    connection = {"api_base": base_url, "api_key": "offline", "engine": "litellm", "cache": False, "num_retries": 0}
    options = {"num_steps": 2, "num_threads": 1, **SCENARIOS[scenario], **overrides}
    optimizer = options.pop("prompt_model", OPTIMIZER)
    metric: Any = simulated_metric
    if options.pop("label_free", False):
        metric = PairwisePreference(judge_model=dspy.LM(JUDGE, **connection))
    candidates = options.pop("num_candidates", 2)
    teleprompter = OPROTeleprompter(metric, prompt_model=dspy.LM(optimizer, **connection),
                                    task_model=dspy.LM(TASK, **connection), num_candidates=candidates, log_dir=log_dir,
                                    **options)
    return teleprompter, dspy.Predict("question -> answer")


class KillAt(BaseCallback):
    """SIGKILLs the process after the n-th answered request of a model that asks about one of ``questions``."""

    def __init__(self, model: str, questions: list[str], n: int):
        self.model, self.questions, self.n = model, questions, n
        self.lock = threading.Lock()
        self.pending: dict[str, bool] = {}
        self.seen = 0

    def on_lm_start(self, call_id, instance, inputs):
        text = str(inputs)
        self.pending[call_id] = instance.model == self.model and any(q in text for q in self.questions)

    def on_lm_end(self, call_id, outputs, exception=None):
        if self.pending.pop(call_id, False) and exception is None:
            with self.lock:
                self.seen += 1
                if self.seen >= self.n:
                    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    # A test that finds the process stuck sends SIGUSR1 to see every thread's stack before it kills it.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    base_url, log_dir, scenario, model, split, kill_at = sys.argv[1:7]
    overrides = json.loads(sys.argv[7]) if len(sys.argv) > 7 else {}
    trainset, valset = datasets()
    questions = [e.question for e in {"train": trainset, "val": valset, "any": trainset + valset}.get(split, [])]
    if split == "all":  # every answered request of the model (the optimizer's meta-prompts)
        questions = [""]
    teleprompter, program = build(base_url, log_dir, scenario, **overrides)
    with dspy.context(callbacks=[KillAt(model, questions, int(kill_at))]):
        teleprompter.compile(program, trainset=trainset, valset=valset)
    sys.exit(3)  # the kill point was never reached
