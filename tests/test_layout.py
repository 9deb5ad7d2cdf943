"""The package's shape, as its docstrings and the architecture page state it, checked on the code itself.

Imports are read with ``ast`` (inside functions too), so a lazy import counts like any other.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dspy_opro import OPROTeleprompter
from dspy_opro.config import OPROConfig, settings_docstring

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dspy_opro"
SUBPACKAGES = ("proposing", "scoring", "task", "record", "extensions", "testing")

# What each subpackage may import of the rest of dspy_opro (its __init__ docstring says the same in words).
MAY_IMPORT = {
    "proposing": {"errors", "compat", "checks", "record.state", "task.data", "scoring.usage"},
    "scoring": {"errors", "compat", "checks", "record.state", "task.data", "task.programs", "selection",
                "proposing.exemplars"},
    "task": {"compat", "record.state", "proposing.exemplars"},
    "record": {"errors", "compat"},
    "extensions": {"errors", "compat", "checks", "record.state", "task.data", "scoring.scorer", "scoring.usage",
                   "selection"},
    "testing": set(),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every dspy_opro module ``path`` imports, anywhere in the file."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dspy_opro"):
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names
                      if (PACKAGE.parent / f"{node.module}.{alias.name}".replace(".", "/")).with_suffix(".py").exists()}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("dspy_opro")}
    return found


def library_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("subpackage", SUBPACKAGES)
def test_each_subpackage_imports_only_what_its_docstring_allows(subpackage):
    allowed = {f"dspy_opro.{name}" for name in MAY_IMPORT[subpackage]}
    own = f"dspy_opro.{subpackage}"
    bad = {}
    for path in (PACKAGE / subpackage).rglob("*.py"):
        outside = {name for name in imports_of(path) if name != own and not name.startswith(own + ".")}
        if outside - allowed:
            bad[module_name(path)] = sorted(outside - allowed)
    assert bad == {}


@pytest.mark.parametrize("subpackage", SUBPACKAGES)
def test_each_subpackage_says_what_it_owns_and_what_it_may_import(subpackage):
    docstring = ast.get_docstring(ast.parse((PACKAGE / subpackage / "__init__.py").read_text(encoding="utf-8")))
    assert docstring and len(docstring.split()) > 40
    assert "import" in docstring.lower()


def test_nothing_imports_the_teleprompter_but_the_package_and_only_config_reaches_into_an_extension():
    """The core meets an extension at one place: the configuration builds the policies (lazily); the package's
    ``__init__`` names the label-free metric lazily too."""
    teleprompter, extension = {}, {}
    for path in library_files():
        name = module_name(path)
        names = imports_of(path)
        if "dspy_opro.teleprompter" in names and name != "dspy_opro":
            teleprompter[name] = True
        if not name.startswith("dspy_opro.extensions"):
            reached = sorted(n for n in names if n.startswith("dspy_opro.extensions."))
            if reached:
                extension[name] = reached
    assert teleprompter == {}
    assert extension == {
        "dspy_opro": ["dspy_opro.extensions.label_free"],
        "dspy_opro.config": ["dspy_opro.extensions.hard_diverse", "dspy_opro.extensions.racing",
                             "dspy_opro.extensions.val_gate"],
    }


def test_the_top_level_is_small():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "checks.py", "compat.py", "config.py", "errors.py", "run.py",
                   "selection.py", "teleprompter.py"]


_DEFAULT_COMPILE = """
import json, sys
import dspy
from dspy_opro import OPROTeleprompter
from tests.fakes import make_lm, toy_dataset, toy_metric, toy_task_reply

task_lm, _ = make_lm(toy_task_reply)
opt_lm, _ = make_lm(lambda request, n: "<INS>Better.</INS>", model="openai/opt")
OPROTeleprompter(toy_metric, prompt_model=opt_lm, task_model=task_lm, num_steps=1, num_candidates=2,
                 display_progress=False).compile(dspy.Predict("question -> answer"), trainset=toy_dataset(4))
print(json.dumps(sorted(m for m in sys.modules if m.startswith("dspy_opro"))))
"""


@pytest.mark.slow
def test_a_default_compile_loads_no_extension():
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")
    out = subprocess.run([sys.executable, "-c", _DEFAULT_COMPILE], env=env, cwd=ROOT, check=True,
                         capture_output=True, text=True)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert [m for m in loaded if m.startswith("dspy_opro.extensions.")] == []
    assert "dspy_opro.extensions" in loaded  # the options' dataclasses, which the configuration checks against


# ---------------------------------------------------------------------------------------------------------------
# One source for the settings: the configuration's fields


def test_the_constructor_takes_exactly_the_configuration_fields_in_order_with_their_defaults():
    parameters = list(inspect.signature(OPROTeleprompter.__init__).parameters.values())[1:]
    fields = dataclasses.fields(OPROConfig)
    assert [p.name for p in parameters] == [f.name for f in fields]
    assert [p.default for p in parameters] == [
        inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default for f in fields]
    assert [p.kind for p in parameters][1:] == [inspect.Parameter.KEYWORD_ONLY] * (len(fields) - 1)


def test_the_constructor_docstring_is_the_fields_documentation():
    docstring = inspect.getdoc(OPROTeleprompter) or ""
    documented = docstring[docstring.index("Args:"):]
    normalised = "\n".join(" ".join(paragraph.split()) for paragraph in documented.split("\n\n"))
    expected = "\n".join(" ".join(paragraph.split()) for paragraph in settings_docstring().split("\n\n"))
    assert normalised == expected


def test_every_field_has_a_group_a_kind_and_a_sentence():
    for spec in dataclasses.fields(OPROConfig):
        assert spec.metadata["kind"] in ("search", "continuable", "execution"), spec.name
        assert spec.metadata["doc"].endswith((".", ")")) and len(spec.metadata["doc"]) > 20, spec.name


def test_recorded_and_fingerprinted_settings_follow_the_kinds():
    from tests.test_config import models

    config = OPROConfig(metric=lambda example, prediction: 1.0)
    recorded = config.recorded_settings(models(), ["predict"])
    kinds = {spec.name: spec.metadata["kind"] for spec in dataclasses.fields(OPROConfig)}
    assert {name for name, kind in kinds.items() if kind != "execution"} <= set(recorded)
    assert not {name for name, kind in kinds.items() if kind == "execution"} & set(recorded)
    import dspy

    printed = config.fingerprint(models(), ["predict"], trainset=[], valset=[], program=dspy.Predict("q -> a"))
    assert not {name for name, kind in kinds.items() if kind != "search"} & set(printed.settings)


def test_architecture_page_names_every_module_and_subpackage():
    """docs/architecture.md is the map: every module of the package has its line, and no line names a ghost."""
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    names = {p.name for p in library_files() if p.name != "__init__.py"}
    names |= {f"{p.name}/" for p in PACKAGE.rglob("*") if p.is_dir() and (p / "__init__.py").exists()}
    assert sorted(name for name in names if f"`{name}`" not in page) == []
