"""Watching a run from outside: OPRO's log lines, dspy.track_usage and a DSPy callback,
each checked against the requests the simulated endpoint served."""

import logging
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy
from dspy.utils.callback import BaseCallback

from dspy_opro import OPROTeleprompter
from dspy_opro.testing import SimulatedEndpoint, simulated_dataset, simulated_metric


# --8<-- [start:callback]
class CountLMCalls(BaseCallback):
    """Counts the LM calls DSPy makes, by model."""

    def __init__(self):
        self.calls = {}

    def on_lm_start(self, call_id, instance, inputs):
        self.calls[instance.model] = self.calls.get(instance.model, 0) + 1
# --8<-- [end:callback]


class KeepRecords(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


# --8<-- [start:logging]
# While it compiles, OPRO logs one line per phase of each step at INFO, through DSPy's
# logging stream (dspy.disable_logging() silences it). Catch them like any logger's:
# once you configure the "dspy_opro" logger, its handlers and level are yours.
records = KeepRecords()
logging.getLogger("dspy_opro").addHandler(records)
logging.getLogger("dspy_opro").setLevel(logging.INFO)
# --8<-- [end:logging]

with SimulatedEndpoint() as endpoint:
    optimizer = OPROTeleprompter(
        metric=simulated_metric,
        prompt_model=endpoint.lm("openai/simulated-optimizer"),
        task_model=endpoint.lm("openai/simulated-task"),
        num_steps=2,
        num_candidates=3,
        num_threads=4,
    )
    # --8<-- [start:track]
    counter = CountLMCalls()
    with dspy.context(callbacks=[counter]):
        compiled = optimizer.compile(
            dspy.Predict("question -> answer"), trainset=simulated_dataset(6)
        )
    run_usage = compiled.opro_run.usage  # OPRO's own account: optimizer and task
    # --8<-- [end:track]
    during_compile = [r for r in endpoint.requests if r.status == 200]

    # --8<-- [start:usage]
    # dspy.track_usage() sees the compiled program's calls once you use it.
    with dspy.context(lm=endpoint.lm("openai/simulated-task")):
        with dspy.track_usage() as usage:
            compiled(question="What is 2 + 3?")
    tokens = usage.get_total_tokens()["openai/simulated-task"]
    # --8<-- [end:usage]
    logging.getLogger("dspy_opro").removeHandler(records)

    for kind, role in (("opro", "optimizer"), ("task", "task")):
        requests = [r for r in during_compile if r.kind == kind]
        recorded = getattr(run_usage, role)
        assert counter.calls[f"openai/simulated-{role}"] == recorded.calls
        assert recorded.calls == len(requests)
        assert recorded.prompt_tokens == sum(r.prompt_tokens for r in requests)
        assert recorded.completion_tokens == sum(r.completion_tokens for r in requests)
        print(f"{role}: {recorded.calls} calls, seen by the callback and the endpoint")
    last = endpoint.requests[-1]
    assert (tokens["prompt_tokens"], tokens["completion_tokens"]) == (
        last.prompt_tokens,
        last.completion_tokens,
    )
    print("track_usage: one call of the compiled program, tokens as served")
    assert any(m.startswith("Step 0: optimizing") for m in records.messages)
