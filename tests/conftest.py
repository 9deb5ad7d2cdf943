import os
import shutil
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402
import pytest  # noqa: E402

from dspy_opro.compat import DSPY_VERSION  # noqa: E402

NEWEST_API = (3, 4)  # the DSPy whose API (custom engines in dspy.lm15, its LM errors) the whole suite is written on


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """On an older DSPy only the compatibility subset (modules marked ``compat``) is collected: the other test modules
    build their fake models on the newest DSPy's API, and CI runs them there."""
    if DSPY_VERSION >= NEWEST_API or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    return "pytest.mark.compat" not in collection_path.read_text(encoding="utf-8") or None


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
