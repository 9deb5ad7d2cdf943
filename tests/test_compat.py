"""One test per access to DSPy's internals (dspy_opro/compat.py): a DSPy upgrade that moves one fails here, by name.

Marked ``compat``: CI runs this file on every DSPy release it installs (the oldest supported, 3.1; 3.2; the newest).
"""

import contextlib
import logging
import warnings

import dspy
import pytest

from dspy_opro import compat
from dspy_opro.errors import classify_exception

pytestmark = pytest.mark.compat


def test_the_dspy_version_is_one_we_support():
    assert compat.DSPY_VERSION >= (3, 1) and compat.DSPY_VERSION < (4, 0)


def test_input_keys_reads_with_inputs_and_is_empty_without():
    assert compat.input_keys(dspy.Example(question="q", answer="a").with_inputs("question")) == ["question"]
    assert compat.input_keys(dspy.Example(question="q", answer="a")) == []


def test_lm_engine_is_litellm_before_dspy_3_4_and_what_the_lm_was_built_with_after():
    expected = "auto" if compat.DSPY_VERSION >= (3, 4) else "litellm"
    assert compat.lm_engine(dspy.LM("openai/x")) == expected
    assert compat.lm_engine(object()) is None


def test_callbacks_and_the_evaluation_result_are_dspys_own():
    from dspy.evaluate.evaluate import EvaluationResult
    from dspy.utils.callback import BaseCallback, with_callbacks

    assert (compat.BaseCallback, compat.with_callbacks, compat.EvaluationResult) == (
        BaseCallback, with_callbacks, EvaluationResult)
    result = compat.EvaluationResult(score=50.0, results=[])
    assert isinstance(result, dspy.Prediction) and float(result) == 50.0


def test_an_lms_instance_callbacks_see_its_calls():
    """The usage meter rides on an LM's own ``callbacks`` (``dspy.LM(..., callbacks=[...])``)."""
    seen = []

    class Probe(compat.BaseCallback):
        def on_lm_start(self, call_id, instance, inputs):
            seen.append(("start", instance.model))

        def on_lm_end(self, call_id, outputs, exception=None):
            seen.append(("end", outputs))

    from dspy.utils import DummyLM

    lm = DummyLM([{"answer": "four"}])
    lm.callbacks = [Probe()]
    with dspy.context(lm=lm):
        dspy.Predict("question -> answer")(question="2+2?")
    assert [kind for kind, _ in seen] == ["start", "end"]


@pytest.mark.skipif(compat.DSPY_VERSION < (3, 3), reason="DSPy's LMError family exists from 3.3")
@pytest.mark.parametrize(("name", "kind"), [("LMAuthError", "fatal"), ("LMBillingError", "fatal"),
                                            ("LMUnsupportedModelError", "fatal"), ("LMUnexpectedError", "infra"),
                                            ("LMServerError", "infra"), ("LMRateLimitError", "infra")])
def test_dspys_lm_errors_are_read_by_type(name, kind):
    from dspy.utils import exceptions

    assert compat.lm_error_kind(getattr(exceptions, name)("no", model="m")) == kind
    assert classify_exception(getattr(exceptions, name)("no", model="m")) == ("fatal" if kind == "fatal" else "infra")


@pytest.mark.parametrize(("name", "status", "kind"), [
    ("AuthenticationError", 401, "fatal"), ("NotFoundError", 404, "fatal"), ("RateLimitError", 429, "infra"),
    ("InternalServerError", 500, "infra"), ("BadGatewayError", 502, "infra"),
    ("ContextWindowExceededError", 400, "context_window")])
def test_litellms_errors_are_read_by_class_as_dspy_3_1_and_3_2_let_them_through(name, status, kind):
    import litellm

    error = getattr(litellm.exceptions, name)(message="no", llm_provider="openai", model="m")
    assert compat.lm_error_kind(error) == kind
    assert classify_exception(error) == {"fatal": "fatal", "infra": "infra", "context_window": "failed"}[kind]


def test_a_context_window_error_of_dspy_is_a_program_failure():
    from dspy.utils import exceptions

    if not hasattr(exceptions, "ContextWindowExceededError"):
        pytest.skip("DSPy 3.1 raises LiteLLM's (tested above)")
    assert classify_exception(exceptions.ContextWindowExceededError(model="m")) == "failed"


def test_adapter_parse_error_is_dspys():
    from dspy.utils import exceptions

    error = exceptions.AdapterParseError(adapter_name="ChatAdapter", signature=dspy.Signature("q -> a"),
                                         lm_response="x")
    assert compat.is_adapter_parse_error(error) and not compat.is_adapter_parse_error(ValueError("x"))


@pytest.mark.parametrize(("module", "head"), [
    ("ReAct", "Answer briefly."), ("ReActV2", "Answer briefly.")])
def test_the_agent_protocol_markers_find_where_the_users_instructions_end(module, head):
    if not hasattr(dspy, module):
        pytest.skip(f"dspy.{module} is not in DSPy {dspy.__version__}")

    def search(query: str) -> str:
        """Search the web."""
        return query

    agent = getattr(dspy, module)(dspy.Signature("question -> answer", head), tools=[search])
    text = agent.react.signature.instructions
    found = [text.find(marker) for marker in compat.AGENT_PROTOCOL_MARKERS if marker in text]
    assert len(found) == 1 and text[:found[0]].rstrip() == head


def test_logging_through_dspy_attaches_dspys_stream_only_where_logging_is_unconfigured(unconfigured_logging):
    from dspy.utils.logging_utils import DSPY_LOGGING_STREAM

    logger = logging.getLogger("dspy_opro")
    before = (list(logger.handlers), logger.level, logger.propagate)
    with compat.logging_through_dspy("dspy_opro"):
        assert [h.stream for h in logger.handlers] == [DSPY_LOGGING_STREAM]
        assert logger.propagate is False and logger.level == logging.INFO
    assert (list(logger.handlers), logger.level, logger.propagate) == before
    own = logging.NullHandler()
    logger.addHandler(own)  # the user configured this logger: left alone
    try:
        with compat.logging_through_dspy("dspy_opro"):
            assert logger.handlers == [own] and logger.propagate is True
    finally:
        logger.removeHandler(own)


def test_user_stacklevel_points_at_the_callers_line():
    def library_warning():
        warnings.warn("probe", stacklevel=compat.user_stacklevel())

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        library_warning()
    assert caught[0].filename == __file__


def test_price_map_entry_reads_litellms_prices_by_provider_and_name():
    entry = compat.price_map_entry("openai/gpt-4o-mini")
    assert (entry["input_cost_per_token"], entry["output_cost_per_token"]) == (1.5e-07, 6e-07)
    assert compat.price_map_entry("gpt-4o-mini") == entry
    assert compat.price_map_entry("x/y") == {}


@pytest.mark.slow  # a fresh interpreter
@pytest.mark.skipif(compat.DSPY_VERSION < (3, 4), reason="DSPy before 3.4 imports LiteLLM with itself")
def test_price_map_entry_does_not_import_litellm_on_dspy_3_4():
    import os
    import subprocess
    import sys

    code = ("import sys; from dspy_opro import compat; e = compat.price_map_entry('openai/gpt-4o-mini'); "
            "print(e['input_cost_per_token'], 'litellm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}).stdout.split()
    assert out == ["1.5e-07", "False"]


def test_dspy_logging_stream_is_the_stream_of_dspys_handlers():
    from dspy.utils.logging_utils import DSPY_LOGGING_STREAM

    assert compat.dspy_logging_stream() is DSPY_LOGGING_STREAM


def test_sharing_mlflow_runs_gives_another_thread_the_callers_active_run_and_takes_it_back(tmp_path):
    """MLflow's active runs are per thread: a run started on another thread inside the shared context nests under
    the caller's, and the thread's own stack is as before once it ends."""
    mlflow = pytest.importorskip("mlflow", reason="the mlflow extra (mlflow-skinny) is not installed")
    import threading

    from dspy_opro.compat import sharing_mlflow_runs

    assert sharing_mlflow_runs() is contextlib.nullcontext or mlflow.active_run() is None
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    seen = {}
    with mlflow.start_run(run_name="compile") as parent:
        shared = sharing_mlflow_runs()

        def child():
            seen["before"] = mlflow.active_run()
            with shared():
                seen["inside"] = mlflow.active_run().info.run_id
                with mlflow.start_run(run_name="eval_0", nested=True) as run:
                    seen["parent_tag"] = mlflow.get_run(run.info.run_id).data.tags.get("mlflow.parentRunId")
            seen["after"] = mlflow.active_run()

        thread = threading.Thread(target=child)
        thread.start()
        thread.join()
        assert mlflow.active_run().info.run_id == parent.info.run_id  # the caller's run is still active
    assert seen == {"before": None, "inside": parent.info.run_id, "parent_tag": parent.info.run_id, "after": None}
