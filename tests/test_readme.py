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
    assert install == "pip install -e ."  # what a user needs; the development extras come with the tests
    assert "python examples/quickstart.py" in install_and_run
    ci_lines = [line.strip() for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert install in ci_lines
    extras, run_tests = test.strip().splitlines()
    assert (extras, run_tests) == ('pip install -e ".[dev]"', "python -m pytest")
    assert ci_lines.index(install) < ci_lines.index(extras)  # the user's install works before the extras come
    assert ci_lines[-1] == run_tests  # the last thing CI does, so its exit code is CI's


def documented_settings() -> list[str]:
    """The names the ``Args:`` section of OPROTeleprompter's docstring documents, in order."""
    import inspect

    from dspy_opro import OPROTeleprompter

    doc = inspect.getdoc(OPROTeleprompter)
    return re.findall(r"^    (\w+): ", doc[doc.index("\nArgs:\n"):], re.M)


def test_readme_options_are_real_settings_with_their_defaults():
    """The README's "Options you will reach for" names only settings of OPROTeleprompter (its
    ``setting_names()``, each documented once in the class docstring's ``Args:``), each with its default: the
    "default" cell holds one backticked Python literal per option named (or ``required``)."""
    import ast
    import inspect

    from dspy_opro import OPROTeleprompter

    parameters = inspect.signature(OPROTeleprompter.__init__).parameters
    settings = OPROTeleprompter.setting_names()
    documented = documented_settings()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("### Options you will reach for"):].split("\n\n")[1]
    rows = [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in table.splitlines()[2:]]
    assert len(rows) >= 5
    for names_cell, default_cell, _ in rows:
        names = re.findall(r"`([^`]+)`", names_cell)
        assert names and all(name in settings for name in names), f"not settings: {names_cell}"
        assert all(documented.count(name) == 1 for name in names), f"not documented once: {names_cell}"
        if default_cell == "required":
            assert all(parameters[name].default is inspect.Parameter.empty for name in names), names_cell
            continue
        defaults = [ast.literal_eval(value) for value in re.findall(r"`([^`]+)`", default_cell)]
        assert len(defaults) == len(names), f"{names_cell}: one default per option, got {default_cell}"
        for name, value in zip(names, defaults, strict=True):
            default = parameters[name].default
            assert type(value) is type(default) and value == default, f"{name}: {value!r} is not {default!r}"
