import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _clean_dspy_settings():
    """Each test starts without a configured LM."""
    with dspy.context(lm=None, adapter=None):
        yield


@pytest.fixture
def unconfigured_logging(monkeypatch):
    """As in a user's process that never configured logging (pytest gives the root logger handlers of its own): a
    compile then writes its lines through DSPy's logging stream (tests/test_teleprompter.py checks the real thing
    in a fresh interpreter)."""
    from dspy_opro import compat

    monkeypatch.setattr(compat, "logging_configured", lambda logger: bool(logger.handlers))
