"""The documentation site: every page in the nav exists, every code block runs, `mkdocs build --strict` passes, the
architecture page is the map of the package as it is, and the settings' tables are the configuration's fields.

Code blocks in ``docs/*.md`` are held to one rule: each is executed by a test, or copied (``--8<--``) from a file
that is. Python blocks include ``docs/snippets/*.py`` (run here, offline) or an example (run by
``tests/test_examples.py``, ``tests/test_quickstart.py`` or ``tests/test_compare.py``); a Python block written
inline is executed here too. ``text`` blocks include a snippet's recorded output, checked here against the
snippet. Shell blocks hold only commands that CI or a test runs.
"""

from __future__ import annotations

import ast
import html.parser
import importlib.util
import inspect
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SNIPPETS = DOCS / "snippets"
PAGES = sorted(DOCS.glob("*.md"))
SNIPPET_FILES = sorted(SNIPPETS.glob("*.py"))

# Shell commands the pages may show, and what runs each of them.
ALLOWED_COMMANDS = {
    'pip install -e ".[dev]"': ".ci/run",
    "python -m pytest": ".ci/run",
    "python examples/quickstart.py": "tests/test_quickstart.py",
    "pip install -e .": ".ci/run",
    "python examples/custom_engine.py": "tests/test_custom_engine.py",
    "python -m dspy_opro report LOG_DIR": "tests/test_report.py",
    "dspy-opro --version": "tests/test_version.py",
    "python -m dspy_opro.testing.local_model install": ".ci/run",
    "python -m dspy_opro.testing.local_model fetch": ".ci/run",
}
# Files other than docs/snippets/*.py that Python blocks may include, and the test that runs each.
EXECUTED_ELSEWHERE = {
    "examples/quickstart.py": "tests/test_quickstart.py",
    "examples/react_agent.py": "tests/test_examples.py",
    "examples/judge_metric.py": "tests/test_examples.py",
    "examples/load_compiled.py": "tests/test_examples.py",
    "examples/custom_engine.py": "tests/test_custom_engine.py",
}

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,})(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$",
                   re.M | re.S)
INCLUDE = re.compile(r'^--8<-- "(?P<path>[^":]+)(?::(?P<section>[A-Za-z_][\w-]*)|(?::\d*){1,2})?"$')


def code_blocks(page: Path) -> list[tuple[str, str]]:
    """The fenced code blocks of a page as ``(language, body)``, bodies dedented to the fence's indentation."""
    blocks = []
    for match in FENCE.finditer(page.read_text(encoding="utf-8")):
        indent = match["indent"]
        lines = [line[len(indent):] if line.startswith(indent) else line for line in match["body"].splitlines()]
        blocks.append((match["info"].strip().split(" ")[0], "\n".join(lines)))
    return blocks


def includes(body: str) -> list[re.Match[str]] | None:
    """The ``--8<--`` includes of a block that holds nothing else, or None when it holds anything else."""
    lines = [line.strip() for line in body.splitlines() if line.strip()]
    found = [INCLUDE.match(line) for line in lines]
    return found if lines and all(found) else None


def all_blocks() -> list[tuple[str, str, str]]:
    return [(page.name, language, body) for page in PAGES for language, body in code_blocks(page)]


def _ignore_python_tags(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> str:
    return f"!!python/{suffix}"


class _MkDocsLoader(yaml.SafeLoader):
    """Reads mkdocs.yml without importing what its ``!!python/name:`` tags point to."""


_MkDocsLoader.add_multi_constructor("tag:yaml.org,2002:python/", _ignore_python_tags)


def nav_files(nav: list) -> list[str]:
    files = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        files += nav_files(value) if isinstance(value, list) else [value]
    return files


# ------------------------------------------------------------------------------------------------------------- the site


def test_every_nav_page_exists_and_every_page_is_in_the_nav():
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_MkDocsLoader)
    files = nav_files(config["nav"])
    assert files[0] == "index.md"
    missing = [name for name in files if not (DOCS / name).is_file()]
    assert not missing, f"pages in the nav but not in docs/: {missing}"
    assert sorted(files) == sorted(page.name for page in PAGES), "every docs/*.md page must be in the nav"
    assert len(files) == len(set(files))


@pytest.fixture(scope="module")
def built_site(tmp_path_factory) -> Path:
    """The site built once by ``mkdocs build --strict`` into a temporary folder."""
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install -e '.[dev]')")
    site = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    return site


def test_mkdocs_build_strict(built_site):
    assert (built_site / "index.html").is_file()
    api = (built_site / "api" / "index.html").read_text(encoding="utf-8")
    anchors = ("dspy_opro.OPROTeleprompter", "dspy_opro.OPROTeleprompter.compile", "dspy_opro.state.RunState")
    for anchor in anchors:
        assert f'id="{anchor}"' in api
    assert "num_candidates" in api  # the constructor's documented parameters are rendered
    # compile's return is documented once, with every candidate_programs key.
    compile_doc = api[api.index('id="dspy_opro.OPROTeleprompter.compile"'):api.index('id="what-compile-returns"')]
    assert "RETURNS" not in compile_doc
    returns = api[api.index('id="what-compile-returns"'):api.index('id="the-run-record"')]
    for key in ("score", "program", "instructions", "step", "val_score"):
        assert f"<td><code>{key}</code></td>" in returns, key


RECORD_MODELS = ("RunState", "Candidate", "ErrorRecord", "Step", "Reply", "Selection", "Fingerprint", "UsageRecord",
                 "ModelUsage")


@pytest.mark.parametrize("model", RECORD_MODELS)
def test_every_record_field_is_described_on_the_api_page(built_site, model):
    """Each field of the persisted record has its own entry on the API page, with a description under it."""
    from dspy_opro import state

    api = (built_site / "api" / "index.html").read_text(encoding="utf-8")
    fields = list(getattr(state, model).model_fields)
    assert fields
    for field in fields:
        anchor = f'id="dspy_opro.state.{model}.{field}"'
        assert anchor in api, f"{model}.{field} is not on the API page"
        entry = api[api.index(anchor):]
        entry = entry[:entry.index("</div>\n\n</div>")]
        description = re.search(r'<div class="doc doc-contents ">\s*<p>(.+?)</p>', entry, re.S)
        assert description and len(description[1]) > 10, f"{model}.{field} has no description"


class _LoadedResources(html.parser.HTMLParser):
    """Collects what a page loads (script src, link href, img src) and whether it holds a mermaid block."""

    def __init__(self) -> None:
        super().__init__()
        self.loaded: list[tuple[str, str]] = []
        self.mermaid = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        for name in {"script": ("src",), "link": ("href",), "img": ("src",), "iframe": ("src",)}.get(tag, ()):
            if values.get(name):
                self.loaded.append((tag, values[name]))
        # Material fetches mermaid from a CDN for any element of class "mermaid".
        self.mermaid |= "mermaid" in (values.get("class") or "").split()


REMOTE = re.compile(r"^(?:https?:)?//", re.I)


def test_built_site_loads_nothing_from_the_network(built_site):
    """Offline, every page renders: no script, stylesheet, font or image from the network, no CDN-fed mermaid."""
    pages = sorted(built_site.rglob("*.html"))
    assert len(pages) >= len(PAGES)
    for page in pages:
        parser = _LoadedResources()
        parser.feed(page.read_text(encoding="utf-8"))
        remote = [(tag, url) for tag, url in parser.loaded if REMOTE.match(url)]
        assert not remote, f"{page.relative_to(built_site)} loads {remote} from the network"
        assert not parser.mermaid, f"{page.relative_to(built_site)} has a mermaid block (rendered from a CDN)"
    method = (built_site / "method" / "index.html").read_text(encoding="utf-8")
    assert 'src="../images/opro-step.svg"' in method
    svg = (built_site / "images" / "opro-step.svg").read_text(encoding="utf-8")
    assert svg.startswith("<svg") and "Pick the predictor" in svg and "http://" not in svg.replace(
        "http://www.w3.org/", "")
    for stylesheet in (built_site / "stylesheets").rglob("*.css"):
        assert not re.search(r"url\(\s*['\"]?(?:https?:)?//", stylesheet.read_text(encoding="utf-8"))


# Every line of the code the pages show fits 88 columns (the page's code width): the snippets and every file a page
# includes (the examples).
CODE_WIDTH = 88


def shown_files() -> list[Path]:
    """The snippets, and every other file a page includes with ``--8<--``."""
    shown = set(SNIPPET_FILES)
    for page in PAGES:
        for line in page.read_text(encoding="utf-8").splitlines():
            found = INCLUDE.match(line.strip())
            if found and (ROOT / found["path"]).suffix == ".py":
                shown.add(ROOT / found["path"])
    return sorted(shown)


CODE_FILES = shown_files()


@pytest.mark.parametrize("path", CODE_FILES, ids=[f"{p.parent.name}/{p.name}" for p in CODE_FILES])
def test_code_lines_fit_88_columns(path):
    long = [(number, len(line)) for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if len(line) > CODE_WIDTH]
    assert not long, f"{path.relative_to(ROOT)}: lines (number, length) over {CODE_WIDTH} columns: {long}"


def test_inline_code_blocks_fit_88_columns():
    for page, language, body in all_blocks():
        if language in ("python", "bash"):
            long = [line for line in body.splitlines() if len(line) > CODE_WIDTH]
            assert not long, f"{page}: {long}"


# ----------------------------------------------------------------------------------------------------------- the blocks


def test_code_blocks_follow_the_rule():
    """Every block is a snippet include, an inline Python block (executed below), a listed command or mermaid."""
    included = set()
    for page, language, body in all_blocks():
        where = f"{page}: ```{language}\n{body}\n```"
        if language == "mermaid":
            continue
        if language == "bash":
            for line in filter(None, (line.strip() for line in body.splitlines())):
                assert line in ALLOWED_COMMANDS, f"{where}\n{line!r} is not a command that CI or a test runs"
            continue
        found = includes(body)
        if language == "text":
            assert found and len(found) == 1, f"{where}\na text block must include a snippet's recorded output"
            path = ROOT / found[0]["path"]
            assert path.parent == SNIPPETS and path.suffix == ".txt", where
            assert path.with_suffix(".py").is_file(), f"{where}\nno snippet prints {path.name}"
            included.add(path.with_suffix(".py"))
            continue
        assert language == "python", f"{where}\ncode blocks must be python, bash, text or mermaid"
        if found is None:
            continue  # inline Python: executed by test_inline_python_blocks
        for include in found:
            relative = include["path"]
            path = ROOT / relative
            assert path.is_file(), f"{where}\n{relative} does not exist"
            if path.parent == SNIPPETS:
                included.add(path)
            else:
                assert relative in EXECUTED_ELSEWHERE, f"{where}\n{relative} is not run by any test"
                runner = ROOT / EXECUTED_ELSEWHERE[relative]
                assert runner.is_file() and Path(relative).name in runner.read_text(encoding="utf-8"), relative
            if include["section"]:
                text = path.read_text(encoding="utf-8")
                for marker in ("start", "end"):
                    assert f"# --8<-- [{marker}:{include['section']}]" in text, f"{where}\nno section marker"
    unused = sorted(path.name for path in SNIPPET_FILES if path not in included)
    assert not unused, f"snippets included by no page: {unused}"


INLINE_PYTHON = [(page, body) for page, language, body in all_blocks() if language == "python" and not includes(body)]


def test_inline_python_blocks_run(tmp_path, monkeypatch):
    """Python written inline in a page (today: none, every block includes a tested file) is executed too."""
    monkeypatch.chdir(tmp_path)
    for page, body in INLINE_PYTHON:
        exec(compile(body, f"<{page}>", "exec"), {"__name__": "__main__"})
    assert all(includes(body) for _, language, body in all_blocks() if language == "python")


TEST_REFERENCE = re.compile(r"(tests/[\w/]+\.py)::(\w+)")


def test_every_test_a_page_names_exists():
    """The pages and the README cite tests by ``tests/file.py::test_name`` (the failure and fidelity tables): each
    names a test function that exists."""
    missing = []
    for page in [*PAGES, ROOT / "README.md"]:
        for path, name in TEST_REFERENCE.findall(page.read_text(encoding="utf-8")):
            source = ROOT / path
            if not source.is_file() or not re.search(rf"^\s*(?:async )?def {name}\(", source.read_text(
                    encoding="utf-8"), re.M):
                missing.append(f"{page.name}: {path}::{name}")
    assert not missing, missing

# --------------------------------------------------------------------------------------------------------- the snippets


@pytest.mark.slow  # one simulated endpoint per snippet
@pytest.mark.parametrize("snippet", SNIPPET_FILES, ids=[path.stem for path in SNIPPET_FILES])
def test_snippet_runs_offline(snippet, capsys, monkeypatch, tmp_path):
    """Each snippet runs as a script (offline: simulated endpoint), and matches its recorded output if it has one."""
    assert os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP") == "True"  # set by tests/conftest.py
    monkeypatch.chdir(tmp_path)
    if "import mlflow" in snippet.read_text(encoding="utf-8"):
        # MLflow's autolog patches classes and warnings for the whole process: a fresh interpreter keeps the
        # other tests free of it (as tests/test_mlflow.py does).
        done = subprocess.run([sys.executable, str(snippet)], capture_output=True, text=True, cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
        assert done.returncode == 0, done.stderr[-4000:]
        output = done.stdout
    else:
        runpy.run_path(str(snippet), run_name="__main__")
        output = capsys.readouterr().out
    recorded = snippet.with_suffix(".txt")
    if recorded.exists():
        assert output == recorded.read_text(encoding="utf-8")
    else:
        assert output.strip(), "a snippet should print what it shows"


# ----------------------------------------------------------------------------------------------------- the architecture

PACKAGE = ROOT / "dspy_opro"
ARCHITECTURE = DOCS / "architecture.md"
CODE_SPAN = re.compile(r"`([^`\n]+)`")
MODULE_PATH = re.compile(r"^[\w./]+(?:\.py|/)$")


def _defines_something(path: Path) -> bool:
    """Whether a package's ``__init__.py`` holds code of its own (a class or a function), not only re-exports."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) for node in tree.body)


def page_name(path: Path) -> str:
    """How the architecture page names a file of the package: its path under ``dspy_opro/`` (``scoring/scorer.py``);
    a subpackage's ``__init__.py`` that only re-exports is named as its folder (``proposing/meta_prompt/``)."""
    relative = path.relative_to(PACKAGE)
    if path.name == "__init__.py" and len(relative.parts) > 1 and not _defines_something(path):
        return f"{relative.parent.as_posix()}/"
    return relative.as_posix()


def subpackages() -> list[str]:
    return sorted(f"{p.parent.name}/" for p in PACKAGE.glob("*/__init__.py"))


def library_modules() -> list[str]:
    """Every module the architecture page must name. ``testing/`` (the simulated endpoint, which has no part in a
    compile) is named as one unit."""
    names = {page_name(path) for path in PACKAGE.rglob("*.py") if path.relative_to(PACKAGE).parts[0] != "testing"}
    return sorted(names | set(subpackages()))


def resolve(module: str) -> Path:
    """The file of a ``dspy_opro`` module name."""
    parts = module.split(".")[1:]
    as_file = PACKAGE.joinpath(*parts).with_suffix(".py") if parts else None
    if as_file is not None and as_file.is_file():
        return as_file
    package = PACKAGE.joinpath(*parts, "__init__.py")
    assert package.is_file(), f"no module {module}"
    return package


def imports_of(path: Path) -> list[tuple[Path, str]]:
    """The package's files a file imports, each with how: ``"top"`` (at import time), ``"nested"`` (inside a
    function, so when it is called) or ``"typing"`` (under ``if TYPE_CHECKING:``, never at run time)."""
    found: list[tuple[Path, str]] = []

    def add(module: str, names: list[str], how: str) -> None:
        for name in names or [None]:
            target = resolve(module)
            if name is not None and target.name == "__init__.py":  # from a package import one of its modules
                sub = f"{module}.{name}"
                if (PACKAGE.joinpath(*sub.split(".")[1:]).with_suffix(".py")).is_file():
                    target = resolve(sub)
            found.append((target, how))

    def visit(node: ast.AST, how: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = how
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                inner = "nested"
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                inner = "typing"
            if isinstance(child, ast.ImportFrom):
                assert child.level == 0, f"{path}: relative import"
                if child.module and child.module.split(".")[0] == "dspy_opro":
                    add(child.module, [alias.name for alias in child.names], how)
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.split(".")[0] == "dspy_opro":
                        add(alias.name, [], how)
            elif (isinstance(child, ast.Call) and ast.unparse(child.func).endswith("import_module") and child.args
                  and isinstance(child.args[0], ast.Constant) and str(child.args[0].value).startswith("dspy_opro")):
                add(child.args[0].value, [], how)
            visit(child, inner)

    visit(ast.parse(path.read_text(encoding="utf-8")), "top")
    return found


def import_graph() -> dict[str, list[tuple[str, str]]]:
    """Page name of every file of the package -> the page names of what it imports, with how."""
    return {page_name(path): [(page_name(target), how) for target, how in imports_of(path)]
            for path in sorted(PACKAGE.rglob("*.py"))}


def test_architecture_page_names_every_module_and_no_ghost():
    """Every module of the package is named on the page by its path under ``dspy_opro/``, every subpackage by its
    folder, and every module path the page names exists."""
    page = ARCHITECTURE.read_text(encoding="utf-8")
    named = set(CODE_SPAN.findall(page))
    missing = [name for name in library_modules() if name not in named]
    assert not missing, f"docs/architecture.md does not name {missing}"
    every = [page_name(path) for path in PACKAGE.rglob("*.py")] + subpackages()
    ghosts = [name for name in sorted(named) if MODULE_PATH.match(name)
              and not (ROOT / name).exists()  # a file of the repository: tests/test_compat.py, dspy_opro/__init__.py
              and not any(module == name or module.endswith(f"/{name}") for module in every)]
    assert not ghosts, f"docs/architecture.md names modules that do not exist: {ghosts}"


def _sections(page: str) -> dict[str, str]:
    """The page's level-3 sections by heading."""
    parts = re.split(r"^### (.+)$", page, flags=re.M)
    pairs = zip(parts[1::2], parts[2::2], strict=True)
    return {heading.strip(): re.split(r"^## ", body, flags=re.M)[0] for heading, body in pairs}


@pytest.mark.parametrize("package", subpackages())
def test_each_subpackage_section_lists_what_it_imports(package):
    """A subpackage's section says what it imports from the rest of the package, exactly: a new import fails here
    until the map says so."""
    sections = [body for heading, body in _sections(ARCHITECTURE.read_text(encoding="utf-8")).items()
                if heading == f"`{package}`" or heading.startswith(f"`{package}`:")]
    assert len(sections) == 1, f"docs/architecture.md needs one section '### `{package}`: ...'"
    found = re.search(r"^\*\*Imports from outside it:\*\*(.+?)(?:\n\n|\Z)", sections[0], re.M | re.S)
    assert found, f"the section of {package} has no line '**Imports from outside it:** ...'"
    listed = CODE_SPAN.findall(found[1])
    assert listed or found[1].strip() == "none.", found[1]
    actual = {target for name, targets in import_graph().items() if name.startswith(package)
              for target, _ in targets if not target.startswith(package)}
    assert sorted(listed) == sorted(set(listed)), f"{package}: a module is listed twice"
    assert set(listed) == actual, (f"{package} imports {sorted(actual - set(listed))} that its section does not list, "
                                   f"and its section lists {sorted(set(listed) - actual)} that it does not import")


def test_the_import_rules_of_the_architecture_page_hold():
    graph = import_graph()
    importers: dict[str, list[tuple[str, str]]] = {}
    for name, targets in graph.items():
        for target, how in targets:
            importers.setdefault(target, []).append((name, how))
    # Nothing imports the teleprompter but __init__; nothing imports the step loop but the teleprompter, in compile.
    assert {name for name, _ in importers["core/teleprompter.py"]} == {"__init__.py"}
    assert importers["core/run.py"] == [("core/teleprompter.py", "nested")]
    # The rooms below the method import nothing of core/ but the selection policies' types.
    for room in ("scoring/", "task/", "record/", "extensions/"):
        used = {target for name, targets in graph.items() if name.startswith(room)
                for target, how in targets if target.startswith("core/") and how != "typing"}
        assert used <= {"core/selection.py"}, (room, used)
    # The method never imports an extension's code: only the settings (building a policy) and __init__ (on first
    # use) do, inside a function; the options are imported by the settings, the teleprompter and __init__.
    for target, users in importers.items():
        if not target.startswith("extensions/"):
            continue
        outside = [(name, how) for name, how in users if not name.startswith("extensions/") and how != "typing"]
        if target == "extensions/__init__.py":
            assert {name for name, _ in outside} <= {"core/settings.py", "core/teleprompter.py", "__init__.py"}, outside
        else:
            assert all(name in ("core/settings.py", "__init__.py") and how == "nested" for name, how in outside), (
                target, outside)
    # testing/ imports nothing of the package outside itself.
    assert not [(name, target) for name, targets in graph.items() if name.startswith("testing/")
                for target, _ in targets if not target.startswith("testing/")]



# --------------------------------------------------------------------------------------------- the settings: one source

def table_rows(text: str, heading: str) -> list[list[str]]:
    """The body rows of the first Markdown table after ``heading``, as lists of stripped cells."""
    start = text.index(heading)
    lines = text[start:].splitlines()[1:]
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[first + 2:]:  # after the header and its separator
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def settings() -> list[inspect.Parameter]:
    """The settings: the keyword arguments of ``OPROTeleprompter.__init__``, in order (the one source of them)."""
    from dspy_opro import OPROTeleprompter

    return list(inspect.signature(OPROTeleprompter.__init__).parameters.values())[1:]


def states_default(cell: str, parameter: inspect.Parameter) -> bool:
    """The rule for how a default is written: ``required`` for a setting without one, else the default as a Python
    literal in backticks at the start of the cell (``None``, ``10``, ``"random"``, ``0.0``), of the default's type;
    words may follow (`` `None`: dspy.settings.lm``)."""
    if parameter.default is inspect.Parameter.empty:
        return cell == "required"
    found = re.match(r"`([^`]+)`", cell)
    if not found:
        return False
    try:
        value = ast.literal_eval(found[1])
    except (ValueError, SyntaxError):
        return False
    return type(value) is type(parameter.default) and value == parameter.default


def test_method_parameter_table_is_the_constructors_settings():
    """docs/method.md's parameter table has one row per setting, in the constructor's order, each stating the
    setting's default by the rule of :func:`states_default`."""
    rows = table_rows((DOCS / "method.md").read_text(encoding="utf-8"), "## Parameters")
    assert all(len(row) == 4 for row in rows), [row[0] for row in rows if len(row) != 4]
    assert [row[0] for row in rows] == [f"`{parameter.name}`" for parameter in settings()]
    wrong = [(row[0], row[1]) for row, parameter in zip(rows, settings(), strict=True)
             if not states_default(row[1], parameter)]
    assert not wrong, f"'Default here' cells that do not state the setting's default: {wrong}"


def test_each_setting_is_documented_once_in_the_constructors_docstring():
    """The API page renders ``OPROTeleprompter``'s ``Args:``: one entry per setting, in the constructor's order."""
    from dspy_opro import OPROTeleprompter

    doc = inspect.getdoc(OPROTeleprompter)
    entries = re.findall(r"^    (\w+): ", doc[doc.index("Args:"):], re.M)
    assert entries == [parameter.name for parameter in settings()]
