import os
import shutil
import threading
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _clean_dspy_settings():
    """Each test starts without a configured LM."""
    with dspy.context(lm=None, adapter=None):
        yield


@pytest.fixture(scope="session")
def finished_job_template(tmp_path_factory):
    """The log_dir of one finished run of ``tests/resume_job.py``'s job at its defaults, and the compiled program,
    made once per session (tests that resume or refuse it use a copy: ``finished_job``)."""
    from tests.resume_job import build

    log_dir = tmp_path_factory.mktemp("finished_job") / "run"
    teleprompter, program, trainset, _, _ = build(str(log_dir))
    return log_dir, teleprompter.compile(program, trainset=trainset)


@pytest.fixture
def finished_job(finished_job_template, tmp_path) -> Path:
    """A copy of ``finished_job_template``'s log_dir under this test's tmp_path."""
    return Path(shutil.copytree(finished_job_template[0], tmp_path / "run"))


@pytest.fixture
def unconfigured_logging(monkeypatch):
    """As in a user's process that never configured logging (pytest gives the root logger handlers of its own): a
    compile then writes its lines through DSPy's logging stream (tests/test_teleprompter.py checks the real thing
    in a fresh interpreter)."""
    from dspy_opro import compat

    monkeypatch.setattr(compat, "logging_configured", lambda logger: bool(logger.handlers))


@pytest.fixture
def settle_started(monkeypatch):
    """An event set whenever a failed evaluation starts waiting for the LM calls its program left running on other
    threads: a test's LM call that holds back until then is certainly still in flight when the program has failed."""
    from dspy_opro.scoring.usage import LMCallCounter

    event = threading.Event()
    wait_idle = LMCallCounter.wait_idle

    def announced_wait_idle(self, timeout):
        event.set()
        return wait_idle(self, timeout)

    monkeypatch.setattr(LMCallCounter, "wait_idle", announced_wait_idle)
    return event
