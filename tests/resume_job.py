"""A deterministic OPRO run for the crash-and-resume tests; ``python -m tests.resume_job LOG_DIR CALL_LOG KILL_AT``
runs it and SIGKILLs itself at the KILL_AT-th task call."""

from __future__ import annotations

import os
import signal
import sys
import threading

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402

from dspy_opro import OPROTeleprompter  # noqa: E402
from tests.fakes import field_value, instruction_of, make_lm, toy_dataset, toy_metric, toy_task_reply, user_text  # noqa: E402


def optimizer_reply_for(prompt: str, occurrence: int) -> str:
    """A reply that depends only on the meta-prompt and how often it was asked before."""
    shown = prompt.count("\ntext:\n")
    return f"<INS>{'Better ' * ((shown + occurrence) % 5)}step {shown} sample {occurrence}.</INS>"


def build(log_dir: str, call_log: str | None = None, kill_at: int | None = None, *, num_threads: int = 1,
          **options):
    lock = threading.Lock()
    task_calls = [0]
    asked: dict[str, int] = {}

    def task(request):
        with lock:
            task_calls[0] += 1
            number = task_calls[0]
            if call_log:
                question = field_value(user_text(request), "question")
                with open(call_log, "a", encoding="utf-8") as handle:
                    handle.write(f"{instruction_of(request)}\t{question}\n")
        if kill_at is not None and number >= kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return toy_task_reply(request)

    def optimizer(request):
        prompt = user_text(request)
        with lock:
            occurrence = asked.get(prompt, 0)
            asked[prompt] = occurrence + 1
        return optimizer_reply_for(prompt, occurrence)

    task_lm, task_engine = make_lm(task)
    opt_lm, opt_engine = make_lm(optimizer)
    options = {"num_steps": 4, "num_candidates": 3, "metric": toy_metric, **options}
    teleprompter = OPROTeleprompter(options.pop("metric"), prompt_model=opt_lm, task_model=task_lm,
                                    num_threads=num_threads, log_dir=log_dir, **options)
    return teleprompter, dspy.Predict("question -> answer"), toy_dataset(5), task_engine, opt_engine


if __name__ == "__main__":
    teleprompter, program, trainset, _, _ = build(sys.argv[1], sys.argv[2], int(sys.argv[3]))
    teleprompter.compile(program, trainset=trainset)
