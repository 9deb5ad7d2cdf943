"""The README's two commands are the ones CI runs."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, re.S)


def test_ci_runs_the_readme_install_and_test_commands():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    install_and_run, test = bash_blocks(readme)[:2]
    install = next(part.strip() for part in install_and_run.split("&&") if "pip install" in part)
    assert install == 'pip install -e ".[dev]"'
    assert "python examples/quickstart.py" in install_and_run
    ci_lines = [line.strip() for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert install in ci_lines
    assert test.strip() == "python -m pytest"
    assert ci_lines[-1] == test.strip()  # the last thing CI does, so its exit code is CI's
