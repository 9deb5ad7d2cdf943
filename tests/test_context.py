"""Evaluations run in a copy of the caller's ``contextvars`` context: a value or an OpenTelemetry span set around
``compile`` is seen inside every program run, on one thread or many, and each candidate's scoring is a span (named
for its step and candidate id) that the program's own spans nest under. Counts are the endpoint's."""

import contextvars
import threading

import dspy
import pytest

from dspy_opro import OPRO
from dspy_opro.testing import SimulatedEndpoint, simulated_dataset, simulated_metric

pytestmark = pytest.mark.compat  # the compatibility subset: DSPy settings and contexts, on every DSPy 3.x CI installs


REQUEST = contextvars.ContextVar("request", default="unset")
SEEN: list = []  # (context value, instruction) per program run; module-level: the program is deep-copied
LOCK = threading.Lock()
TRACER: list = []  # the tracer the program uses, if any


class Tagged(dspy.Module):
    """A program that notes, on every run, the context value it sees and its own instruction."""

    def __init__(self):
        super().__init__()
        self.predict = dspy.Predict("question -> answer")

    def forward(self, question):
        with LOCK:
            SEEN.append((REQUEST.get(), self.predict.signature.instructions))
        if not TRACER:
            return self.predict(question=question)
        with TRACER[0].start_as_current_span("program run") as span:
            span.set_attribute("instruction", self.predict.signature.instructions)
            return self.predict(question=question)


@pytest.fixture(autouse=True)
def _fresh_notes():
    SEEN.clear()
    TRACER.clear()
    yield
    TRACER.clear()


def compile_tagged(endpoint, program, *, num_threads):
    optimizer = OPRO(simulated_metric, prompt_model=endpoint.lm("openai/sim-optimizer"),
                     task_model=endpoint.lm("openai/sim-task"), num_steps=2, num_candidates=3,
                     num_threads=num_threads, display_progress=False)
    return optimizer.compile(program, trainset=simulated_dataset(5))


@pytest.mark.parametrize("num_threads", [1, 4])
def test_a_context_value_set_around_compile_reaches_every_program_run(num_threads):
    program = Tagged()
    token = REQUEST.set("request-42")
    try:
        with SimulatedEndpoint() as endpoint:
            compiled = compile_tagged(endpoint, program, num_threads=num_threads)
            task_calls = endpoint.count("task")
    finally:
        REQUEST.reset(token)
    record = compiled.opro_run
    assert len(SEEN) == task_calls == record.metric_calls == 5 * len(record.scored())
    assert {value for value, _ in SEEN} == {"request-42"}
    assert REQUEST.get() == "unset"  # nothing leaked back into the caller's context


def test_a_span_per_candidate_nests_the_program_runs_under_the_callers_span():
    trace = pytest.importorskip("opentelemetry.trace")
    sdk = pytest.importorskip("opentelemetry.sdk.trace")
    export = pytest.importorskip("opentelemetry.sdk.trace.export")
    memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")
    provider = trace.get_tracer_provider()
    if not isinstance(provider, sdk.TracerProvider):
        provider = sdk.TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = memory.InMemorySpanExporter()
    provider.add_span_processor(export.SimpleSpanProcessor(exporter))
    tracer = trace.get_tracer("tests.test_context")

    TRACER.append(tracer)
    with SimulatedEndpoint() as endpoint:
        with tracer.start_as_current_span("user compile") as outer:
            compiled = compile_tagged(endpoint, Tagged(), num_threads=3)
        task_calls = endpoint.count("task")
    exporter.shutdown()
    trace_id = outer.get_span_context().trace_id
    spans = [span for span in exporter.get_finished_spans() if span.context.trace_id == trace_id]
    record = compiled.opro_run
    by_id = {span.context.span_id: span for span in spans}
    candidates = [span for span in spans if span.name.startswith("OPRO candidate")]
    runs = [span for span in spans if span.name == "program run"]

    # One span per candidate scored, named for its id and step, a child of the caller's span.
    scored = record.scored()
    assert sorted(span.name for span in candidates) == sorted(
        f"OPRO candidate {c.id} (step {c.step}, train)" for c in scored)
    assert all(span.parent.span_id == outer.get_span_context().span_id for span in candidates)
    for span in candidates:
        candidate = record.candidates[span.attributes["opro.candidate_id"]]
        assert (span.attributes["opro.step"], span.attributes["opro.status"]) == (candidate.step, "scored")
        assert span.attributes["opro.score"] == candidate.score
    # Every program run is a child of its own candidate's span.
    assert len(runs) == task_calls == record.metric_calls
    for run in runs:
        parent = by_id[run.parent.span_id]
        candidate = record.candidates[parent.attributes["opro.candidate_id"]]
        assert run.attributes["instruction"] == candidate.instructions["predict"]
