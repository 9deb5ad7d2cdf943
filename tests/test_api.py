"""The API page documents every public name, lists no member that does not exist (mkdocstrings drops those
silently), and renders no docstring with a raw Sphinx role (``:class:`X``` shows as typed under mkdocstrings)."""

import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import dspy_opro
import dspy_opro.testing

API = Path(__file__).parent.parent / "docs" / "api.md"
DIRECTIVE = re.compile(r"^::: (\S+)\n((?:    .*\n)*)", re.M)
SPHINX_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj|py:\w+):`")


def resolve(path: str) -> Any:
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            target = getattr(target, name)
        return target
    raise ImportError(path)


def directives() -> list[tuple[str, Any, list[str], str]]:
    text = API.read_text(encoding="utf-8")
    return [(path, resolve(path), re.findall(r"^        - (\w+)", options, re.M), options)
            for path, options in DIRECTIVE.findall(text)]


def test_every_public_name_is_on_the_api_page():
    text = API.read_text(encoding="utf-8")
    documented = {path.rpartition(".")[2] for path, *_ in directives()}
    for module in (dspy_opro, dspy_opro.testing):
        missing = [name for name in module.__all__ if name not in documented and f"`{name}`" not in text
                   and f"`{module.__name__}.{name}`" not in text and name != "__version__"]
        assert not missing, f"{module.__name__}: {missing} are public but not on docs/api.md"


def test_every_member_the_page_lists_exists():
    stale = [f"{path}.{member}" for path, target, members, _ in directives() for member in members
             if not hasattr(target, member)]
    assert not stale


def rendered_docstrings(target: Any, members: list[str], options: str) -> list[tuple[str, str]]:
    """The docstrings mkdocstrings shows for one directive: the object's, its listed (else public) members', and
    its attributes' (pydantic fields and module constants: a string right after the assignment, in the source)."""
    shown = [("", inspect.getdoc(target) or "")]
    if inspect.isclass(target) and "members: false" not in options:
        names = members or [name for name in vars(target) if not name.startswith("_")]
        for name in names:
            member = vars(target).get(name)
            if member is not None and not isinstance(member, (str, int, float, tuple)):
                shown.append((name, inspect.getdoc(member) or ""))
        try:
            shown.append(("source", inspect.getsource(target)))
        except (OSError, TypeError):
            pass
    return shown


def test_no_rendered_docstring_has_a_sphinx_role():
    raw = []
    for path, target, members, options in directives():
        for where, text in rendered_docstrings(target, members, options):
            raw += [f"{path} {where}: {text[max(0, m.start() - 20):m.end() + 30]!r}"
                    for m in SPHINX_ROLE.finditer(text)]
    assert not raw
