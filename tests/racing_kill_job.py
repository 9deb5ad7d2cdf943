"""A racing OPRO run against a simulated endpoint that SIGKILLs itself at a chosen task-model call (mid-race).

``python -m tests.racing_kill_job BASE_URL LOG_DIR KILL_AT`` runs :func:`build`'s compile and kills the process right
after the KILL_AT-th answered training request of the task model (:class:`tests.kill_job.KillAt`).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402

from dspy_opro import OPROTeleprompter  # noqa: E402
from dspy_opro.testing import simulated_dataset, simulated_metric  # noqa: E402
from tests.kill_job import KillAt  # noqa: E402

TASK, OPTIMIZER = "openai/sim-task", "openai/sim-opt"
TRAIN_SIZE = 60


def trainset() -> list[dspy.Example]:
    return simulated_dataset(TRAIN_SIZE, seed=1)


def build(base_url: str, log_dir: str | None, *, num_threads: int = 1, **options) -> OPROTeleprompter:
    connection = {"api_base": base_url, "api_key": "offline", "engine": "litellm", "cache": False, "num_retries": 0}
    return OPROTeleprompter(simulated_metric, prompt_model=dspy.LM(OPTIMIZER, **connection),
                            task_model=dspy.LM(TASK, **connection), num_steps=2, num_candidates=8, num_exemplars=3,
                            num_threads=num_threads, racing=True, log_dir=log_dir, **options)


if __name__ == "__main__":
    base_url, log_dir, kill_at = sys.argv[1:4]
    train = trainset()
    with dspy.context(callbacks=[KillAt(TASK, [e.question for e in train], int(kill_at))]):
        build(base_url, log_dir).compile(dspy.Predict("question -> answer"), trainset=train)
    sys.exit(3)  # the kill point was never reached
