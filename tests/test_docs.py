"""The documentation site: every page in the nav exists, every code block runs, and `mkdocs build --strict` passes.

Code blocks in ``docs/*.md`` are held to one rule: each is executed by a test, or copied (``--8<--``) from a file
that is. Python blocks include ``docs/snippets/*.py`` (run here, offline) or an example (run by
``tests/test_examples.py``, ``tests/test_quickstart.py`` or ``tests/test_compare.py``); a Python block written
inline is executed here too. ``text`` blocks include a snippet's recorded output, checked here against the
snippet. Shell blocks hold only commands that CI or a test runs.
"""

from __future__ import annotations

import html.parser
import importlib.util
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
    "python -m dspy_opro report LOG_DIR": "tests/test_report.py",
    "dspy-opro --version": "tests/test_version.py",
}
# Files other than docs/snippets/*.py that Python blocks may include, and the test that runs each.
EXECUTED_ELSEWHERE = {
    "examples/quickstart.py": "tests/test_quickstart.py",
    "examples/react_agent.py": "tests/test_examples.py",
    "examples/judge_metric.py": "tests/test_examples.py",
    "examples/load_compiled.py": "tests/test_examples.py",
    "benchmarks/compare_optimizers.py": "tests/test_compare.py",
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


# ----------------------------------------------------------------------------------------------------- the site


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
    for anchor in ("dspy_opro.OPROTeleprompter", "dspy_opro.OPROTeleprompter.compile", "dspy_opro.record.state.RunState"):
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
    from dspy_opro.record import state

    api = (built_site / "api" / "index.html").read_text(encoding="utf-8")
    fields = list(getattr(state, model).model_fields)
    assert fields
    for field in fields:
        anchor = f'id="dspy_opro.record.state.{model}.{field}"'
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


# Every line of the code the docs show, the examples and the snippets, fits 88 columns (the page's code width).
CODE_WIDTH = 88
CODE_FILES = sorted([*SNIPPET_FILES, *(ROOT / "examples").glob("*.py")])


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


# ---------------------------------------------------------------------------------------------------- the blocks


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


# -------------------------------------------------------------------------------------------------- the snippets


@pytest.mark.slow  # one simulated endpoint per snippet
@pytest.mark.parametrize("snippet", SNIPPET_FILES, ids=[path.stem for path in SNIPPET_FILES])
def test_snippet_runs_offline(snippet, capsys, monkeypatch, tmp_path):
    """Each snippet runs as a script (offline: simulated endpoint), and matches its recorded output if it has one."""
    assert os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP") == "True"  # set by tests/conftest.py
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(snippet), run_name="__main__")
    output = capsys.readouterr().out
    recorded = snippet.with_suffix(".txt")
    if recorded.exists():
        assert output == recorded.read_text(encoding="utf-8")
    else:
        assert output.strip(), "a snippet should print what it shows"
