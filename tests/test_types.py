"""The package is typed for its users: ``py.typed`` ships with it, mypy and pyright find no error in it, and user
code that calls it is checked against its annotations (``instruction_pos="A_begin"`` is refused by the checker)."""

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent

USER_CODE = """
from dspy_opro import OPRO

def metric(example, prediction, trace=None) -> float:
    return 1.0

optimizer = OPRO(metric, instruction_pos="A_begin")
"""


def test_py_typed_ships_as_package_data():
    assert (ROOT / "dspy_opro" / "py.typed").is_file()
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert '[tool.setuptools.package-data]\ndspy_opro = ["py.typed"]' in pyproject


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=900)


@pytest.mark.slow  # mypy over the package: a minute or more
def test_mypy_finds_no_error_in_the_package():
    pytest.importorskip("mypy", reason="mypy is a dev dependency")
    done = run([sys.executable, "-m", "mypy"], ROOT)  # files and settings: [tool.mypy] in pyproject.toml
    assert done.returncode == 0, done.stdout[-4000:]
    assert done.stdout.startswith("Success: no issues found")


@pytest.mark.slow  # pyright over the package (node): half a minute or more
def test_pyright_finds_no_error_in_the_package():
    pytest.importorskip("pyright", reason="pyright is a dev dependency")
    if shutil.which("node") is None:
        pytest.skip("pyright needs node")
    done = run([sys.executable, "-m", "pyright"], ROOT)  # settings: [tool.pyright] in pyproject.toml
    assert done.returncode == 0, done.stdout[-4000:]
    assert "0 errors" in done.stdout


@pytest.mark.slow  # mypy over a user's file
def test_user_code_is_checked_against_the_annotations(tmp_path):
    pytest.importorskip("mypy", reason="mypy is a dev dependency")
    user = tmp_path / "user.py"
    user.write_text(textwrap.dedent(USER_CODE), encoding="utf-8")
    # From the repository's root, so that this checkout's dspy_opro is the one imported.
    done = run([sys.executable, "-m", "mypy", "--config-file", "", "--ignore-missing-imports",
                "--cache-dir", str(tmp_path / "cache"), str(user)], ROOT)
    # The package is typed (no "missing library stubs or py.typed marker"), so the bad literal is caught.
    assert "py.typed" not in done.stdout
    assert done.returncode == 1
    refused = 'Argument "instruction_pos" to "OPROTeleprompter" has incompatible type "Literal[\'A_begin\']"'
    assert refused in done.stdout
