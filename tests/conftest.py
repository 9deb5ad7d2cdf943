import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _clean_dspy_settings():
    """Each test starts without a configured LM."""
    with dspy.context(lm=None, adapter=None):
        yield
