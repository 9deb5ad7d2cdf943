"""A program that fans out on its own threads and fails while some of them still call the LM.

DSPy's parallel executor raises as soon as a job fails (here ``max_errors=1``; under OPRO's threads DSPy's own race,
one executor clearing tqdm's global instance set while another runs, raises ``KeyError`` the same way) and leaves
its other workers running. Their LM calls are paid for: the evaluation is a program error, and its usage must still
hold every call the engine served.
"""

from __future__ import annotations

import logging
import threading

import dspy

from dspy_opro import OPROTeleprompter
from tests.fakes import make_lm, scripted_optimizer, toy_dataset, toy_metric, toy_task_reply, user_text

FAILING = "item 0"
# Module-level, not attributes: OPRO deep-copies the program for each candidate, and a copied Event is another one.
STARTED = threading.Event()  # the slow LM call is under way


class Boom(dspy.Module):
    """Raises once the other worker's LM call is under way."""

    def forward(self, question):
        assert STARTED.wait(30), "the other worker never called the LM"
        raise KeyError("simulated race")


class FansOut(dspy.Module):
    """``question -> answer``; on FAILING, runs the predictor and a failing job on DSPy's parallel executor."""

    def __init__(self):
        super().__init__()
        self.predict = dspy.Predict("question -> answer")
        self.boom = Boom()

    def forward(self, question):
        if question != FAILING:
            return self.predict(question=question)
        parallel = dspy.Parallel(num_threads=2, max_errors=1, disable_progress_bar=True)
        first, _ = parallel([(self.predict, {"question": question}), (self.boom, {"question": question})])
        return first


class _Released(logging.Handler):
    """Releases the slow LM call once DSPy's executor gave up (it logs this just before it raises)."""

    def __init__(self, gate: threading.Semaphore):
        super().__init__(logging.WARNING)
        self.gate = gate

    def emit(self, record: logging.LogRecord) -> None:
        if "Execution cancelled" in record.getMessage():
            self.gate.release()


def test_usage_of_calls_still_in_flight_when_the_program_failed_is_counted(settle_started):
    gate = threading.Semaphore(0)
    STARTED.clear()

    def task_reply(request):
        if FAILING in user_text(request):
            STARTED.set()
            assert gate.acquire(timeout=30), "the program never failed"
            STARTED.clear()
            # This call ends only once the failed evaluation waits for the calls in flight, before counting usage.
            assert settle_started.wait(30), "the failed evaluation did not wait for the LM call in flight"
            settle_started.clear()
        return toy_task_reply(request)

    task_lm, task_engine = make_lm(task_reply, input_tokens=11, output_tokens=7)
    opt_lm, opt_engine = make_lm(scripted_optimizer(["<INS>Better better.</INS>"]), model="openai/opt")
    handler = _Released(gate)
    parallel_logger = logging.getLogger("dspy.utils.parallelizer")
    parallel_logger.addHandler(handler)
    try:
        optimizer = OPROTeleprompter(toy_metric, prompt_model=opt_lm, task_model=task_lm, num_steps=1,
                                     num_candidates=1, num_threads=1)
        run = optimizer.compile(FansOut(), trainset=toy_dataset(3)).opro_run
    finally:
        parallel_logger.removeHandler(handler)
    start, proposed = run.candidates
    for candidate in (start, proposed):
        assert candidate.failed == [0] and candidate.error_count == 1
        assert candidate.errors[0].error == "Exception: Execution cancelled due to errors or interruption."
    assert (start.scores, proposed.scores) == ([0.0, 0.0, 0.0], [0.0, 1.0, 0.0])
    assert len(task_engine.requests) == run.metric_calls == 6 and len(opt_engine.requests) == 1
    usage = run.usage.task
    assert (usage.calls, usage.prompt_tokens, usage.completion_tokens) == (6, 6 * 11, 6 * 7)
