"""One test per access to DSPy's internals (dspy_opro/compat.py): a DSPy upgrade that moves one fails here, by name."""

import threading
import warnings

import dspy
import pytest

from dspy_opro import compat
from dspy_opro.errors import classify_exception
from dspy_opro.scoring.usage import UsageCapture


def test_current_context_carries_settings_and_call_id_into_a_worker_thread():
    seen = {}
    lm = dspy.LM("openai/context-probe")
    token = compat.ACTIVE_CALL_ID.set("call-42")
    try:
        with dspy.context(lm=lm, num_threads=3):
            context = compat.current_context()
    finally:
        compat.ACTIVE_CALL_ID.reset(token)

    def worker():
        seen["before"] = dspy.settings.lm
        seen["inside"] = compat.run_in_context(context, lambda: (dspy.settings.lm, dspy.settings.num_threads,
                                                                  compat.ACTIVE_CALL_ID.get()))
        seen["after"] = (dspy.settings.lm, compat.ACTIVE_CALL_ID.get())

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen["before"] is None
    assert seen["inside"] == (lm, 3, "call-42")
    assert seen["after"] == (None, None)  # the worker's own context is restored


def test_input_keys_reads_with_inputs_and_is_empty_without():
    assert compat.input_keys(dspy.Example(question="q", answer="a").with_inputs("question")) == ["question"]
    assert compat.input_keys(dspy.Example(question="q", answer="a")) == []


def test_lm_engine_is_what_the_lm_was_built_with():
    assert compat.lm_engine(dspy.LM("openai/x", engine="litellm")) == "litellm"
    assert compat.lm_engine(dspy.LM("openai/x")) == "auto"
    assert compat.lm_engine(object()) is None


def test_usage_tracker_and_callbacks_are_dspys_own_types():
    from dspy_opro.scoring.usage import LMCallCounter

    capture = UsageCapture()
    with capture.active():
        assert isinstance(dspy.settings.usage_tracker, compat.UsageTracker)
    assert issubclass(LMCallCounter, compat.BaseCallback)


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (compat.LMAuthError("no", model="m"), "fatal"),
        (compat.LMBillingError("no", model="m"), "fatal"),
        (compat.LMUnsupportedModelError("no", model="m"), "fatal"),
        (compat.ContextWindowExceededError(model="m"), "failed"),
        (compat.LMUnexpectedError("no", model="m"), "infra"),
    ],
)
def test_dspys_lm_exception_types_are_importable_and_classified(error, kind):
    assert classify_exception(error) == kind


def test_adapter_parse_error_is_dspys():
    from dspy.utils import exceptions

    assert compat.AdapterParseError is exceptions.AdapterParseError


def test_logging_through_dspy_attaches_dspys_stream_only_where_logging_is_unconfigured(unconfigured_logging):
    import logging

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


@pytest.mark.slow  # a fresh interpreter
def test_price_map_entry_reads_dspys_copy_of_litellms_prices_without_importing_litellm():
    import subprocess
    import sys

    code = ("import sys; from dspy_opro import compat; e = compat.price_map_entry('openai/gpt-4o-mini'); "
            "b = compat.price_map_entry('gpt-4o-mini'); "
            "print(e['input_cost_per_token'], e['output_cost_per_token'], b == e, compat.price_map_entry('x/y'), "
            "'litellm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}).stdout.split()
    assert out == ["1.5e-07", "6e-07", "True", "{}", "False"]


def test_dspy_logging_stream_is_the_stream_of_dspys_handlers():
    from dspy.utils.logging_utils import DSPY_LOGGING_STREAM

    assert compat.dspy_logging_stream() is DSPY_LOGGING_STREAM
