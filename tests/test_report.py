"""Reports of an OPRO run (dspy_opro.record.report) and the ``python -m dspy_opro report`` command line.

``fixtures/state_small.json`` is ``build_fixture_state()`` below, saved by ``write_fixture()``
(``python -c "import tests.test_report as t; t.write_fixture()"`` from the repository root); a test checks that
the two agree.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dspy_opro.__main__ import main
from dspy_opro.record.files import STATE_FILE, save_state
from dspy_opro.record.report import (
    format_usage,
    plot_trajectory,
    render_run_report,
    render_step_report,
    step_dir,
    trajectory_rows,
    write_run_report,
    write_step_files,
)
from dspy_opro.state import (
    Candidate,
    Fingerprint,
    ModelUsage,
    Reply,
    RunState,
    Selection,
    Step,
    UsageRecord,
    digest,
)

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "fixtures" / "state_small.json"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# ------------------------------------------------------------------------------------------------- the fixture

START = {"rewrite": "Rewrite the question so that it stands alone.", "answer": "Answer the question."}
LONG_REPLY = (
    "Here is a better instruction:\n<INS>Restate the question | keep every number</INS>\n"
    "It keeps the numbers and drops filler words, which should help the answer step. " + "More reasoning. " * 12
)
TOO_LONG = "Rewrite the question. " * 20  # 440 characters, over max_instruction_chars=300


def _scores(*values: float | None) -> list[float | None]:
    return [float(v) if v is not None else None for v in values]


def _candidate(
    cid: int,
    step: int,
    predictor: str | None,
    instruction: str,
    base: dict[str, str],
    scores: list[float | None],
    status: str = "scored",
    reason: str | None = None,
    val_scores: list[float | None] | None = None,
) -> Candidate:
    instructions = dict(base)
    if predictor is not None:
        instructions[predictor] = instruction
    return Candidate(
        id=cid,
        step=step,
        predictor=predictor,
        instruction=instruction,
        instructions=instructions,
        md5=hashlib.md5(json.dumps(instructions, sort_keys=True).encode("utf-8")).hexdigest(),
        status=status,
        reason=reason,
        scores=scores,
        failed=[i for i, s in enumerate(scores) if s is None] if status == "unscored" else [],
        score=sum(scores) / len(scores) if status == "scored" else None,  # type: ignore[arg-type]
        val_scores=val_scores,
        val_score=sum(val_scores) / len(val_scores) if val_scores else None,  # type: ignore[arg-type]
    )


def _meta_prompt(history: list[tuple[str, int]], problems: list[tuple[str, str]]) -> str:
    parts = [
        "Your task is to generate the instruction <INS>. Below are some previous instructions with their scores. "
        "The score ranges from 0 to 100.\n"
    ]
    for text, score in history:
        parts.append(f"text:\n{text}\nscore:\n{score}\n")
    parts.append("Below are some problems.\n")
    for question, answer in problems:
        parts.append(f"Problem:\nQ: <INS>\n{question}\nA: {answer}\n")
    parts.append(
        "Generate an instruction that is different from all the instructions <INS> above, and has a higher score "
        "than all the instructions <INS> above. The instruction should begin with <INS> and end with </INS>."
    )
    return "\n".join(parts)  # no trailing newline, as the authors' meta-prompt


def build_fixture_state() -> RunState:
    """A small finished run: 2 predictors, a start at step -1, 4 steps of 3 candidates each."""
    ones = lambda k: _scores(*([1] * k + [0] * (10 - k)))  # noqa: E731 - k of 10 training examples right
    c0 = _candidate(0, -1, None, "", START, ones(4))
    base0 = START
    c1 = _candidate(1, 0, "rewrite", "Restate the question in one sentence.", base0, ones(5))
    c2 = _candidate(2, 0, "rewrite", "Make the question shorter.", base0, ones(3))
    c3 = _candidate(3, 0, "rewrite", "Rephrase the question, keeping every fact.", base0, ones(4))
    base1 = c1.instructions
    c4 = _candidate(4, 1, "answer", "Think step by step, then answer.", base1, ones(6), val_scores=_scores(1, 0, 1, 0))
    c5 = _candidate(
        5,
        1,
        "answer",
        "Answer with a single number.",
        base1,
        _scores(1, 1, 0, None, 1, None, 0, None, 1, 1),
        status="unscored",
        reason="the task model failed on 3 of 10 examples after a retry (RateLimitError)",
    )
    c6 = _candidate(
        6, 1, "answer", "Check the arithmetic before answering.", base1, _scores(0, 0, 0, 0, 1, 1, 1, 1, 1, 1)
    )
    base2 = c4.instructions
    c7 = _candidate(
        7, 2, "rewrite", "Restate the question | keep every number", base2, ones(7), val_scores=_scores(1, 1, 1, 0)
    )
    c8 = _candidate(8, 2, "rewrite", "Drop every number from the question.", base2, ones(2))
    c9 = _candidate(9, 2, "rewrite", "List the facts, then the question.", base2, ones(5))
    base3 = c7.instructions
    c10 = _candidate(10, 3, "answer", "Solve it in ```code``` first.", base3, _scores(1, 1, 1, 1, 0.5, 0, 0, 0, 0, 0))
    c11 = _candidate(
        11,
        3,
        "answer",
        "Answer in French: « oui » or « non ».",
        base3,
        _scores(1, 0, 1, 1, 0, 1, None, None, None, None),
        status="unscored",
        reason="budget exhausted after 6 of 10 examples",
    )
    c12 = _candidate(
        12, 3, "answer", "Be brief.", base3, [None] * 10, status="skipped", reason="budget exhausted before scoring"
    )
    candidates = [c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12]

    problems = [("Tom has 3 boxes of 4 apples and eats 2. How many are left?", "10"), ("Où est Paris ?", "en France")]
    steps = [
        Step(
            step=0,
            predictor="rewrite",
            exemplar_indices=[1, 4, 7],
            meta_prompt=_meta_prompt([(START["rewrite"], 40)], problems),
            temperature=1.0,
            replies=[
                Reply(text=f"<INS>{c1.instruction}</INS>", instruction=c1.instruction, fate="new", candidate_id=1),
                Reply(text=f"<INS>{c2.instruction}</INS>", instruction=c2.instruction, fate="new", candidate_id=2),
                Reply(text=f"<INS>{c3.instruction}</INS>", instruction=c3.instruction, fate="new", candidate_id=3),
                Reply(
                    text=f"<INS>{c1.instruction}</INS>", instruction=c1.instruction, fate="duplicate", candidate_id=1
                ),
            ],
            complete=True,
            best_score=0.5,
        ),
        Step(
            step=1,
            predictor="answer",
            exemplar_indices=[0, 2, 9],
            meta_prompt=_meta_prompt([(START["answer"], 40)], problems[:1]),
            temperature=1.0,
            replies=[
                Reply(text=f"<INS>{c4.instruction}</INS>", instruction=c4.instruction, fate="new", candidate_id=4),
                Reply(text=f"<INS>{c5.instruction}</INS>", instruction=c5.instruction, fate="new", candidate_id=5),
                Reply(text="<INS></INS>", instruction="", fate="empty"),
                Reply(text=f"<INS>{c6.instruction}</INS>", instruction=c6.instruction, fate="new", candidate_id=6),
            ],
            failed_calls=1,
            errors=["RateLimitError: 429 | retry after 20 s"],
            complete=True,
            best_score=0.6,
        ),
        Step(
            step=2,
            predictor="rewrite",
            exemplar_indices=[3, 5, 8],
            meta_prompt=_meta_prompt([(START["rewrite"], 40), (c3.instruction, 40), (c1.instruction, 50)], problems),
            temperature=1.0,
            replies=[
                Reply(text=LONG_REPLY, instruction=c7.instruction, fate="new", candidate_id=7),
                Reply(text=f"<INS>{TOO_LONG}</INS>", instruction=TOO_LONG, fate="too_long"),
                Reply(text=f"<INS>{c8.instruction}</INS>", instruction=c8.instruction, fate="new", candidate_id=8),
                Reply(text=f"<INS>{c9.instruction}</INS>", instruction=c9.instruction, fate="new", candidate_id=9),
            ],
            complete=True,
            best_score=0.7,
        ),
        Step(
            step=3,
            predictor="answer",
            exemplar_indices=[1, 6, 9],
            meta_prompt=_meta_prompt([(START["answer"], 40), (c6.instruction, 60), (c4.instruction, 60)], problems),
            temperature=1.0,
            replies=[
                Reply(text=f"<INS>{c10.instruction}</INS>", instruction=c10.instruction, fate="new", candidate_id=10),
                Reply(text="I cannot think of a better instruction.", instruction=None, fate="no_instruction"),
                Reply(text=f"<INS>{c11.instruction}</INS>", instruction=c11.instruction, fate="new", candidate_id=11),
                Reply(text=f"<INS>{c12.instruction}</INS>", instruction=c12.instruction, fate="new", candidate_id=12),
            ],
            complete=False,
            best_score=0.7,
        ),
    ]
    optimizer = ModelUsage(calls=16, prompt_tokens=24180, completion_tokens=3120, cost=0.0123)
    task = ModelUsage(calls=310, cache_hits=22, prompt_tokens=151234, completion_tokens=9876, unpriced_calls=310)
    config = {
        "num_steps": 4,
        "num_candidates": 4,
        "num_exemplars": 3,
        "temperature": 1.0,
        "select": "validation",
        "top_k": 2,
        "max_metric_calls": 125,
        "max_instruction_chars": 300,
        "prompt_model": "openai/gpt-4o-mini",
        "target_predictors": ["rewrite", "answer"],
        "stop_words": "a|b",
        "max_cost": None,
    }
    return RunState(
        fingerprint=Fingerprint(
            config=digest(config), trainset=digest("train"), valset=digest("val"), program=digest(START)
        ),
        config=config,
        predictors=["rewrite", "answer"],
        train_size=10,
        val_size=4,
        candidates=candidates,
        steps=steps,
        usage=UsageRecord(
            optimizer=optimizer,
            task=task,
            by_model={"openai/gpt-4o-mini": optimizer.model_copy(), "hosted_vllm/llama-3-8b": task.model_copy()},
        ),
        metric_calls=125,
        status="stopped",
        stop_reason="max_metric_calls (125) reached during step 3",
        start_val_score=0.5,
        selection=Selection(
            candidate_id=7,
            selected_by="validation",
            reason="highest validation mean (75.0) among the 2 best on training; the start scored 50.0",
        ),
    )


def write_fixture() -> Path:
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(build_fixture_state().model_dump_json(indent=2) + "\n", encoding="utf-8")
    return FIXTURE


@pytest.fixture
def state() -> RunState:
    return RunState.model_validate_json(FIXTURE.read_text(encoding="utf-8"))


def _block(text: str, first_line: str, count: int) -> list[str]:
    """``count`` lines of ``text`` starting at the line ``first_line``."""
    lines = text.splitlines()
    start = lines.index(first_line)
    return lines[start : start + count]


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    length, kind = struct.unpack(">I4s", data[8:16])
    assert (length, kind) == (13, b"IHDR")
    return struct.unpack(">II", data[16:24])


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("MPLCONFIGDIR", str(ROOT / ".pytest_cache" / "mpl"))
    return env


# ------------------------------------------------------------------------------------------------------ tests


def test_fixture_is_the_builder_output(state: RunState) -> None:
    assert state == build_fixture_state()
    statuses = {c.status for c in state.candidates}
    assert statuses == {"scored", "unscored", "skipped"}
    assert {r.fate for s in state.steps for r in s.replies} == {
        "new",
        "duplicate",
        "empty",
        "too_long",
        "no_instruction",
    }


def test_trajectory_rows(state: RunState) -> None:
    assert trajectory_rows(state) == [
        {"step": -1, "predictor": None, "scored": 1, "best_this_step": 40.0, "best_so_far": 40.0},
        {"step": 0, "predictor": "rewrite", "scored": 3, "best_this_step": 50.0, "best_so_far": 50.0},
        {"step": 1, "predictor": "answer", "scored": 2, "best_this_step": 60.0, "best_so_far": 60.0},
        {"step": 2, "predictor": "rewrite", "scored": 3, "best_this_step": 70.0, "best_so_far": 70.0},
        {"step": 3, "predictor": "answer", "scored": 1, "best_this_step": 45.0, "best_so_far": 70.0},
    ]


def test_run_report_trajectory_table(state: RunState) -> None:
    report = render_run_report(state)
    assert _block(report, "| Step | Predictor | Candidates scored | Best this step | Best so far |", 7) == [
        "| Step | Predictor | Candidates scored | Best this step | Best so far |",
        "| ---: | --- | ---: | ---: | ---: |",
        "| -1 | (start) | 1 | 40.0 | 40.0 |",
        "| 0 | `rewrite` | 3 | 50.0 | 50.0 |",
        "| 1 | `answer` | 2 | 60.0 | 60.0 |",
        "| 2 | `rewrite` | 3 | 70.0 | 70.0 |",
        "| 3 | `answer` | 1 | 45.0 | 70.0 |",
    ]


def test_format_usage_table(state: RunState) -> None:
    assert format_usage(state.usage).splitlines() == [
        "| Role | Calls | Cache hits | Prompt tokens | Cached prompt tokens | Completion tokens | Cost |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        "| optimizer | 16 | 0 | 24,180 | 0 | 3,120 | $0.0123 |",
        "| task | 310 | 22 | 151,234 | 0 | 9,876 | unknown |",
        "| total | 326 | 22 | 175,414 | 0 | 12,996 | ≥ $0.0123 |",
        "",
        "| Model | Calls | Cache hits | Prompt tokens | Cached prompt tokens | Completion tokens | Cost |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        "| `openai/gpt-4o-mini` | 16 | 0 | 24,180 | 0 | 3,120 | $0.0123 |",
        "| `hosted_vllm/llama-3-8b` | 310 | 22 | 151,234 | 0 | 9,876 | unknown |",
    ]


@pytest.mark.parametrize(
    ("cost", "unpriced", "expected"),
    [
        (0.0, 0, "$0.00"),
        (0.004, 0, "$0.004000"),
        (0.5, 0, "$0.5000"),
        (1234.5, 0, "$1,234.50"),
        (0.0, 3, "unknown"),
        (0.25, 3, "≥ $0.2500"),
    ],
)
def test_format_usage_cost(cost: float, unpriced: int, expected: str) -> None:
    usage = UsageRecord(optimizer=ModelUsage(calls=5, cost=cost, unpriced_calls=unpriced))
    lines = format_usage(usage).splitlines()
    assert lines[2] == f"| optimizer | 5 | 0 | 0 | 0 | 0 | {expected} |"
    assert lines[3] == "| task | 0 | 0 | 0 | 0 | 0 | $0.00 |"
    assert lines[4] == f"| total | 5 | 0 | 0 | 0 | 0 | {expected} |"
    assert len(lines) == 5  # no per-model table when no model is known


def test_run_report_sections(state: RunState) -> None:
    report = render_run_report(state)
    assert report.startswith("# OPRO run report\n\n- Status: stopped\n")
    for line in [
        "- Stop reason: max_metric_calls (125) reached during step 3",
        "- Predictors: `rewrite`, `answer`",
        "- Training examples: 10; validation examples: 4",
        "- Steps: 4 (3 complete)",
        "- Candidates: 13 (scored 10, unscored 2, skipped 1)",
        "- Metric calls: 125",
        "- Best training score: 70.0 (candidate 7, step 2, predictor `rewrite`)",
    ]:
        assert line in report.splitlines()
    # settings: every config entry, JSON for non-strings, pipes escaped
    assert _block(report, "| Setting | Value |", 14)[2:] == [
        "| num_steps | 4 |",
        "| num_candidates | 4 |",
        "| num_exemplars | 3 |",
        "| temperature | 1.0 |",
        "| select | validation |",
        "| top_k | 2 |",
        "| max_metric_calls | 125 |",
        "| max_instruction_chars | 300 |",
        "| prompt_model | openai/gpt-4o-mini |",
        '| target_predictors | ["rewrite", "answer"] |',
        "| stop_words | a\\|b |",
        "| max_cost | null |",
    ]
    # the best five scored candidates by training score, earliest first in a tie
    headings = [line for line in report.splitlines() if line.startswith("### ")]
    assert headings == [
        "### 1. 70.0 (step 2, predictor `rewrite`, candidate 7)",
        "### 2. 60.0 (step 1, predictor `answer`, candidate 4)",
        "### 3. 60.0 (step 1, predictor `answer`, candidate 6)",
        "### 4. 50.0 (step 0, predictor `rewrite`, candidate 1)",
        "### 5. 50.0 (step 2, predictor `rewrite`, candidate 9)",
    ]
    top = "### 1. 70.0 (step 2, predictor `rewrite`, candidate 7)\n\n```text\n"
    assert top + "Restate the question | keep every number\n```\n" in report
    selection = _block(report, "## Selection", 7)
    assert selection == [
        "## Selection",
        "",
        "- Candidate: 7 (step 2, predictor `rewrite`)",
        "- Selected by: validation",
        "- Why: highest validation mean (75.0) among the 2 best on training; the start scored 50.0",
        "- Training score: 70.0",
        "- Validation score: 75.0",
    ]
    assert _block(report, "## Validation scores", 6)[2:] == [
        "| Candidate | Step | Predictor | Training | Validation | Selected |",
        "| ---: | ---: | --- | --- | ---: | --- |",
        "| 0 | -1 | (start) | 40.0 | 50.0 |  |",
        "| 4 | 1 | `answer` | 60.0 | 50.0 |  |",
    ]
    assert "| 7 | 2 | `rewrite` | 70.0 | 75.0 | yes |" in report.splitlines()
    assert "## Usage and cost\n\n" + format_usage(state.usage) in report
    assert report.endswith("## Stop reason\n\nmax_metric_calls (125) reached during step 3\n")


def test_run_report_of_a_fresh_run() -> None:
    """A run with only its start scored: the start's instructions per predictor; nothing selected; no stop."""
    fresh = build_fixture_state().model_copy(
        update={"steps": [], "selection": None, "stop_reason": None, "status": "running", "start_val_score": None}
    )
    fresh.candidates = [fresh.candidates[0]]
    report = render_run_report(fresh)
    assert "### 1. 40.0 (the program as given, candidate 0)\n\n`rewrite`:\n\n```text\n" in report
    assert "\n`answer`:\n\n```text\nAnswer the question.\n```\n" in report
    assert "No program has been selected yet." in report
    assert "## Validation scores" not in report and "## Stop reason" not in report
    assert trajectory_rows(fresh) == [
        {"step": -1, "predictor": None, "scored": 1, "best_this_step": 40.0, "best_so_far": 40.0}
    ]


def test_fence_outgrows_backticks_in_an_instruction(state: RunState) -> None:
    state.candidates[10].score = 0.99  # "Solve it in ```code``` first." becomes the best
    report = render_run_report(state)
    assert "````text\nSolve it in ```code``` first.\n````" in report


def test_step_report_replies_and_escaping(state: RunState) -> None:
    report = render_step_report(state, 2)
    lines = report.splitlines()
    assert lines[:10] == [
        "# OPRO step 2",
        "",
        "- Predictor: `rewrite`",
        "- Exemplars (training indices): 3, 5, 8",
        "- Temperature: 1",
        "- Optimizer replies: 4 (new 3, too_long 1)",
        "- Best this step: 70.0 (candidate 7)",
        "- Best so far: 70.0 (candidate 7, step 2, predictor `rewrite`)",
        "",
        "## Replies",
    ]
    cut = LONG_REPLY[:199].rstrip() + "…"  # ~200 characters, then escaped
    escaped = cut.replace("|", "\\|").replace("<", "\\<").replace("\n", "<br>")
    assert escaped.startswith("Here is a better instruction:<br>\\<INS>Restate the question \\| keep every number")
    assert _block(report, "| # | Reply | Fate | Candidate | Training score |", 6)[1:] == [
        "| ---: | --- | --- | ---: | --- |",
        f"| 1 | {escaped} | new | 7 | 70.0 |",
        f"| 2 | {('<INS>' + TOO_LONG)[:199].rstrip().replace('<', chr(92) + '<')}… | too_long | — | — |",
        "| 3 | \\<INS>Drop every number from the question.\\</INS> | new | 8 | 20.0 |",
        "| 4 | \\<INS>List the facts, then the question.\\</INS> | new | 9 | 50.0 |",
    ]
    assert "| 7 | 70.0 | Restate the question \\| keep every number |" in lines
    assert report.endswith("The meta-prompt is in `meta_prompt.txt`, the replies in full in `replies.json`.\n")


def test_step_report_fates_statuses_and_errors(state: RunState) -> None:
    step1 = render_step_report(state, 1)
    assert "- Optimizer replies: 4 (new 3, empty 1)" in step1
    assert "- Failed optimizer calls: 1" in step1
    assert "| 1 | \\<INS>Think step by step, then answer.\\</INS> | new | 4 | 60.0 |" in step1
    assert (
        "| 2 | \\<INS>Answer with a single number.\\</INS> | new | 5 | unscored: the task model failed on 3 of 10 "
        "examples after a retry (RateLimitError) |" in step1
    )
    assert "| 3 | \\<INS>\\</INS> | empty | — | — |" in step1
    assert "## Errors\n\n- RateLimitError: 429 | retry after 20 s\n" in step1

    step0 = render_step_report(state, 0)
    assert "| 4 | \\<INS>Restate the question in one sentence.\\</INS> | duplicate | 1 | 50.0 |" in step0

    step3 = render_step_report(state, 3)
    assert "- Complete: no (the run stopped or was interrupted during this step)" in step3
    assert "- Best this step: 45.0 (candidate 10)" in step3
    assert "- Best so far: 70.0 (candidate 7, step 2, predictor `rewrite`)" in step3
    assert "| 2 | I cannot think of a better instruction. | no_instruction | — | — |" in step3
    french = "\\<INS>Answer in French: « oui » or « non ».\\</INS>"
    assert f"| 3 | {french} | new | 11 | unscored: budget exhausted after 6 of 10 examples |" in step3
    assert "| 4 | \\<INS>Be brief.\\</INS> | new | 12 | skipped: budget exhausted before scoring |" in step3
    assert "| 12 | skipped: budget exhausted before scoring | Be brief. |" in step3


def test_step_report_unknown_step(state: RunState) -> None:
    with pytest.raises(ValueError, match="no step 9"):
        render_step_report(state, 9)
    with pytest.raises(ValueError, match="no step -1"):
        render_step_report(state, -1)


def test_write_step_files(state: RunState, tmp_path: Path) -> None:
    for record in state.steps:
        folder = write_step_files(state, record.step, tmp_path)
        assert folder == tmp_path / "steps" / f"00{record.step}"
        assert sorted(p.name for p in folder.iterdir()) == ["meta_prompt.txt", "replies.json", "report.md"]
        assert (folder / "meta_prompt.txt").read_bytes() == record.meta_prompt.encode("utf-8")
        assert (folder / "report.md").read_text(encoding="utf-8") == render_step_report(state, record.step)
    meta = (tmp_path / "steps" / "002" / "meta_prompt.txt").read_bytes()
    assert meta.endswith(b"begin with <INS> and end with </INS>.")  # no newline added
    assert "Où est Paris ?".encode() in meta
    replies = json.loads((tmp_path / "steps" / "002" / "replies.json").read_text(encoding="utf-8"))
    assert replies == [
        {
            "text": LONG_REPLY,
            "instruction": "Restate the question | keep every number",
            "fate": "new",
            "candidate_id": 7,
            "score": 0.7,
        },
        {
            "text": f"<INS>{TOO_LONG}</INS>",
            "instruction": TOO_LONG,
            "fate": "too_long",
            "candidate_id": None,
            "score": None,
        },
        {
            "text": "<INS>Drop every number from the question.</INS>",
            "instruction": "Drop every number from the question.",
            "fate": "new",
            "candidate_id": 8,
            "score": 0.2,
        },
        {
            "text": "<INS>List the facts, then the question.</INS>",
            "instruction": "List the facts, then the question.",
            "fate": "new",
            "candidate_id": 9,
            "score": 0.5,
        },
    ]
    step3 = json.loads((tmp_path / "steps" / "003" / "replies.json").read_text(encoding="utf-8"))
    assert [(r["fate"], r["candidate_id"], r["score"]) for r in step3] == [
        ("new", 10, 0.45),
        ("no_instruction", None, None),
        ("new", 11, None),
        ("new", 12, None),
    ]
    assert step3[1]["instruction"] is None
    assert step_dir(tmp_path, 12) == tmp_path / "steps" / "012"
    with pytest.raises(ValueError):
        write_step_files(state, 7, tmp_path)


def test_plot_trajectory_png(state: RunState, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = plot_trajectory(state, tmp_path / "plots" / "trajectory.png")
    assert path == tmp_path / "plots" / "trajectory.png"
    assert _png_size(path) == (960, 540)


def test_plot_trajectory_with_nothing_scored(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    empty = build_fixture_state().model_copy(update={"candidates": [], "steps": [], "selection": None})
    assert _png_size(plot_trajectory(empty, tmp_path / "t.png")) == (960, 540)
    assert "Nothing scored yet." in render_run_report(empty)


def test_without_matplotlib(state: RunState, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                            caplog: pytest.LogCaptureFixture) -> None:
    import dspy_opro.record.report as report_module

    for name in [n for n in sys.modules if n == "matplotlib" or n.startswith("matplotlib.")] or ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setattr(report_module, "_PLOT_SKIP_SAID", [])
    with pytest.raises(ImportError, match=r"pip install dspy-opro\[plot\]"):
        plot_trajectory(state, tmp_path / "t.png")
    with caplog.at_level("WARNING", logger="dspy_opro"):
        assert write_run_report(state, tmp_path) == [tmp_path / "report.md"]
        assert write_run_report(state, tmp_path) == [tmp_path / "report.md"]
    assert not (tmp_path / "t.png").exists() and not (tmp_path / "trajectory.png").exists()
    assert caplog.messages == [f"No trajectory.png in {tmp_path}: the trajectory plot needs matplotlib: pip install "
                               "dspy-opro[plot]"]  # once, not at every report


def test_write_run_report(state: RunState, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    assert write_run_report(state, tmp_path) == [tmp_path / "report.md", tmp_path / "trajectory.png"]
    assert (tmp_path / "report.md").read_text(encoding="utf-8") == render_run_report(state)
    other = tmp_path / "other"
    assert write_run_report(state, str(other), plot=False) == [other / "report.md"]


@pytest.mark.slow  # a fresh interpreter
def test_report_module_is_light(tmp_path: Path) -> None:
    """report imports neither dspy nor matplotlib; the plot leaves pyplot and the chosen backend alone."""
    pytest.importorskip("matplotlib")
    code = textwrap.dedent(
        f"""
        import sys, types
        package = types.ModuleType("dspy_opro")  # skip the package __init__: check report's own imports
        package.__path__ = [{str(ROOT / "dspy_opro")!r}]
        sys.modules["dspy_opro"] = package
        import dspy_opro.record.report as report
        heavy = sorted(n for n in sys.modules if n.split(".")[0] in ("dspy", "litellm", "matplotlib"))
        assert not heavy, heavy
        import matplotlib
        backend = matplotlib.rcParams._get_backend_or_none()
        from dspy_opro.state import RunState
        state = RunState.model_validate_json(open({str(FIXTURE)!r}, encoding="utf-8").read())
        report.plot_trajectory(state, {str(tmp_path / "t.png")!r})
        assert "matplotlib.pyplot" not in sys.modules
        assert matplotlib.rcParams._get_backend_or_none() == backend
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


# ------------------------------------------------------------------------------------------------ command line


def test_cli_report(state: RunState, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    save_state(state, tmp_path)
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [str(tmp_path / "report.md"), str(tmp_path / "trajectory.png")]
    assert (tmp_path / "report.md").read_text(encoding="utf-8") == render_run_report(state)
    assert _png_size(tmp_path / "trajectory.png") == (960, 540)


def test_cli_report_no_plot(state: RunState, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save_state(state, tmp_path)
    assert main(["report", str(tmp_path), "--no-plot"]) == 0
    assert capsys.readouterr().out.splitlines() == [str(tmp_path / "report.md")]
    assert not (tmp_path / "trajectory.png").exists()


def test_cli_corrupt_state(state: RunState, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = state.model_dump_json()
    (tmp_path / STATE_FILE).write_text(text[: len(text) // 2], encoding="utf-8")
    assert main(["report", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert "corrupt" in captured.err and captured.out == ""
    assert not (tmp_path / "report.md").exists()


def test_cli_missing_state(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    assert "state.json does not exist" in capsys.readouterr().err


def test_cli_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["bogus"]) == 2
    assert main(["--help"]) == 0
    assert "report" in capsys.readouterr().out


@pytest.mark.slow  # a fresh interpreter
def test_python_m_dspy_opro_report(state: RunState, tmp_path: Path) -> None:
    save_state(state, tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "dspy_opro", "report", str(tmp_path)],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == str(tmp_path / "report.md")
    assert (tmp_path / "report.md").read_text(encoding="utf-8") == render_run_report(state)
