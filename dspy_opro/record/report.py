"""Reports of an OPRO run: one Markdown page per step, one for the run, and the score-trajectory plot.

Everything here is a pure function of a :class:`~dspy_opro.state.RunState`, so a report can be rebuilt at any
time from ``state.json`` alone (``python -m dspy_opro report LOG_DIR``). Training scores are shown on the
0-100 scale of the OPRO paper with one decimal. The module imports neither DSPy nor matplotlib; the plot
imports matplotlib when it is drawn and uses its object-oriented API with the Agg canvas, so it never touches
pyplot's global state or a backend the user has chosen.

Layout under ``log_dir``::

    report.md              the run: settings, trajectory, best instructions, selection, usage
    trajectory.png         training scores by step (with matplotlib installed; drawn by dspy_opro.record.plot)
    steps/NNN/meta_prompt.txt   the exact meta-prompt of step NNN
    steps/NNN/replies.json      the optimizer's replies and what became of each
    steps/NNN/report.md         the step in Markdown
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspy_opro.record.plot import (  # noqa: F401 (PLOT_INSTALL_HINT and plot_trajectory re-exported)
    DASH,
    PLOT_INSTALL_HINT,
    fmt_pct,
    is_scored,
    is_start,
    plot_trajectory,
)
from dspy_opro.state import CandidateStatus, ModelUsage, best_candidate, ranked_candidates

if TYPE_CHECKING:
    from dspy_opro.state import Candidate, Reply, RunState, Step, UsageRecord

REPORT_FILE = "report.md"
TRAJECTORY_FILE = "trajectory.png"
STEPS_DIR = "steps"
META_PROMPT_FILE = "meta_prompt.txt"
REPLIES_FILE = "replies.json"

TOP_INSTRUCTIONS = 5
MAX_ERROR_ROWS = 50  # rows of the "Program errors" table in report.md; the rest are in state.json
CELL_CHARS = 200  # longer text is cut in table cells (the full text is in replies.json / the fenced blocks)

logger = logging.getLogger(__name__)


def pct(score: float | None) -> float | None:
    """A [0, 1] score on the 0-100 scale, rounded to one decimal."""
    return None if score is None else round(score * 100, 1)


def cell(text: Any, limit: int | None = CELL_CHARS) -> str:
    """Text made safe for one Markdown table cell: cut to ``limit`` characters, ``|``, ``\\`` and ``<`` escaped,
    line breaks as ``<br>``."""
    text = str(text).replace("\r\n", "\n").replace("\r", "\n")
    if limit is not None and len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("<", "\\<").replace("\n", "<br>")


def inline(text: Any) -> str:
    """Text for a list item or a paragraph: on one line, with HTML-looking tags kept visible."""
    return " ".join(str(text).replace("\\", "\\\\").replace("<", "\\<").split())


def code(name: Any) -> str:
    """An identifier (a predictor's name) as a code span."""
    name = str(name)
    fence, pad = "``" if "`" in name else "`", " " if name.startswith("`") or name.endswith("`") else ""
    return f"{fence}{pad}{name}{pad}{fence}"


def fenced(text: str, info: str = "text") -> str:
    """``text`` in a fenced code block whose fence is longer than any run of backticks inside it."""
    fence = "`" * max(3, max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    body = text if text.endswith("\n") else text + "\n"
    return f"{fence}{info}\n{body}{fence}"


def table(header: list[str], rows: list[list[str]], align: str = "") -> str:
    """A Markdown table; ``align`` has an ``r`` for each right-aligned column, an ``l`` (or nothing) for the rest."""
    rule = ["---:" if a == "r" else "---" for a in align.ljust(len(header), "l")]
    return "\n".join("| " + " | ".join(line) + " |" for line in [header, rule, *rows])


def fmt_cost(cost: float, unpriced_calls: int, estimated_calls: int = 0) -> str:
    """The cost, ``unknown`` when no call was priced, ``≥ $x`` when only some were (the cost is a lower bound),
    ``~ $x`` when some calls' tokens were estimated (their replies carried no usable usage)."""
    if unpriced_calls and cost == 0:
        return "unknown"
    money = "$0.00" if cost == 0 else f"${cost:.6f}" if cost < 0.01 else f"${cost:.4f}" if cost < 1 else f"${cost:,.2f}"
    return f"≥ {money}" if unpriced_calls else f"~ {money}" if estimated_calls else money


def _holding(*lines: tuple[object, str]) -> list[str]:
    """The lines whose condition holds."""
    return [text for condition, text in lines if condition]


def _predictor_label(predictor: str | None) -> str:
    return "(start)" if predictor is None else code(predictor)


def _require_step(state: RunState, step: int) -> Step:
    record = next((s for s in state.steps if s.step == step), None)
    if record is None:
        known = ", ".join(str(s.step) for s in state.steps) or "none"
        raise ValueError(f"the run record has no step {step} (steps recorded: {known})")
    return record


def _status_text(candidate: Candidate) -> str:
    if is_scored(candidate):
        return fmt_pct(candidate.score)
    if candidate.status == "raced_out" and candidate.score is not None:  # its partial mean, then how far it ran
        return f"{fmt_pct(candidate.score)} ({candidate.reason})"
    return f"{candidate.status}: {candidate.reason}" if candidate.reason else candidate.status


def _where(candidate: Candidate) -> str:
    if is_start(candidate):
        return "the program as given"
    where = "initial instruction" if candidate.step < 0 else f"step {candidate.step}"
    return f"{where}, predictor {_predictor_label(candidate.predictor)}"


def _replies(state: RunState, record: Step) -> list[tuple[Reply, Candidate | None]]:
    """Each reply of the step with the candidate it became."""
    by_id: dict[int | None, Candidate] = {c.id: c for c in state.candidates}
    return [(reply, by_id.get(reply.candidate_id)) for reply in record.replies]


def _best_text(best: Candidate | None) -> str:
    return DASH if best is None else f"{fmt_pct(best.score)} (candidate {best.id}, {_where(best)})"


def trajectory_rows(state: RunState) -> list[dict[str, Any]]:
    """One row per step (the start as step -1): the step, its predictor (None for the start), how many of its
    candidates were scored, its best training score and the best so far, both on the 0-100 scale with one
    decimal (None when nothing was scored)."""
    rows = []
    for step in sorted({s.step for s in state.steps} | {c.step for c in state.candidates}):
        candidates = [c for c in state.candidates if c.step == step]
        record = next((s for s in state.steps if s.step == step), None)
        predictor = record.predictor if record is not None else None if step < 0 else next(  # step -1: the start
            (c.predictor for c in candidates if c.predictor is not None), None)
        best, so_far = best_candidate(candidates), best_candidate(c for c in state.candidates if c.step <= step)
        rows.append({"step": step, "predictor": predictor, "scored": sum(c.status == "scored" for c in candidates),
                     "best_this_step": pct(best.score) if best else None,
                     "best_so_far": pct(so_far.score) if so_far else None})
    return rows


def format_usage(usage: UsageRecord) -> str:
    """A Markdown table of calls, cache hits, tokens (with the prompt tokens served from the provider's prompt
    cache) and cost for the optimizer, the task and in total, then one row per model when known. A cost is
    ``unknown`` when no call had a price, ``≥ $x`` when some had none, and ``~ $x`` when some were estimated."""
    total = usage.optimizer.model_copy()
    total.add(usage.task)
    header = ["Role", "Calls", "Cache hits", "Prompt tokens", "Cached prompt tokens", "Completion tokens", "Cost"]
    align = "lrrrrrr"

    def row(label: str, u: ModelUsage) -> list[str]:
        counts = (u.calls, u.cache_hits, u.prompt_tokens, u.cached_tokens, u.completion_tokens)
        return [label, *(f"{n:,}" for n in counts), fmt_cost(u.cost, u.unpriced_calls, u.estimated_calls)]

    text = table(header, [row("optimizer", usage.optimizer), row("task", usage.task), row("total", total)], align)
    if usage.by_model:
        rows = [row(cell(code(model), None), u) for model, u in usage.by_model.items()]
        text += "\n\n" + table(["Model", *header[1:]], rows, align)
    return text


def render_step_report(state: RunState, step: int) -> str:
    """Markdown for ``steps/NNN/report.md``: the predictor, the exemplars, every reply with its fate and its
    candidate's training score (or status and reason), the step's candidates, its best and the best so far."""
    record = _require_step(state, step)
    candidates = [c for c in state.candidates if c.step == step]
    best, so_far = best_candidate(candidates), best_candidate(c for c in state.candidates if c.step <= step)
    fate_text = ", ".join(f"{fate} {count}" for fate, count in Counter(reply.fate for reply in record.replies).items())
    unclosed = sum(reply.unclosed for reply in record.replies)
    lines = [f"# OPRO step {step}", "", f"- Predictor: {code(record.predictor)}",
             f"- Exemplars (training indices): {', '.join(str(i) for i in record.exemplar_indices) or 'none'}",
             f"- Temperature: {record.temperature:g}",
             f"- Optimizer replies: {len(record.replies)}" + (f" ({fate_text})" if fate_text else ""),
             *_holding((record.failed_calls, f"- Failed optimizer calls: {record.failed_calls}"),
                       (record.skipped_calls,
                        f"- Proposals not asked for: {record.skipped_calls} ({inline(record.skip_reason or '')})"),
                       (unclosed, f"- Replies without their closing tag: {unclosed} (the authors' extraction kept; "
                                  "see the fates)"),
                       (not record.complete, "- Complete: no (the run stopped or was interrupted during this step)")),
             f"- Best this step: {fmt_pct(best.score) + f' (candidate {best.id})' if best else DASH}",
             f"- Best so far: {_best_text(so_far)}", "", "## Replies", ""]
    rows = [[str(number), cell(reply.text), reply.fate, DASH if reply.candidate_id is None else str(reply.candidate_id),
             DASH if candidate is None else cell(_status_text(candidate))]
            for number, (reply, candidate) in enumerate(_replies(state, record), 1)]
    lines.append(table(["#", "Reply", "Fate", "Candidate", "Training score"], rows, "rllrl") if rows else "No replies.")
    if candidates:
        rows = [[str(c.id), cell(_status_text(c)), cell(c.instruction)] for c in candidates]
        lines += ["", "## Candidates", "", table(["Candidate", "Training score", "Instruction"], rows, "r")]
    if record.errors:
        lines += ["", "## Errors", "", *(f"- {inline(error)}" for error in record.errors)]
    lines += _program_errors_section(candidates)
    lines += ["", f"The meta-prompt is in `{META_PROMPT_FILE}`, the replies in full in `{REPLIES_FILE}`.", ""]
    return "\n".join(lines)


def _program_errors_section(candidates: list[Candidate]) -> list[str]:
    """A "Program errors" table: per candidate, how many evaluations raised, and each distinct error's first example."""
    rows = [[str(c.id), str(c.error_count), str(record.count),
             f"{'training' if record.split == 'train' else 'validation'} {record.example}", cell(record.error)]
            for c in candidates if c.error_count for record in c.errors]
    if not any(c.error_count for c in candidates):
        return []
    header = ["Candidate", "Evaluations that raised", "This error", "First example", "Error"]
    lines = ["", "## Program errors", "",
             "Evaluations whose program raised (scored `failure_score`); the first example of each distinct error.", "",
             table(header, rows[:MAX_ERROR_ROWS], "rrr")]
    if len(rows) > MAX_ERROR_ROWS:
        lines += ["", f"{len(rows) - MAX_ERROR_ROWS} more rows are in `state.json` (each candidate's `errors`)."]
    return lines


def render_run_report(state: RunState) -> str:
    """Markdown for ``report.md``: settings, the score trajectory, the best instructions, the selection,
    validation scores, usage and cost, and why the run stopped."""
    counts = Counter(c.status for c in state.candidates)
    best = state.best()
    finished_with = state.status == "finished" and state.stop_reason  # "finished with N candidates unscored ..."
    status_text = ", ".join(f"{s} {counts[s]}" for s in CandidateStatus if counts[s])
    # What went wrong with the optimizer's requests over the run, when anything did.
    failed, skipped = (sum(record.failed_calls for record in state.steps),
                       sum(record.skipped_calls for record in state.steps))
    unclosed = sum(reply.unclosed for record in state.steps for reply in record.replies)
    replies = sum(len(record.replies) for record in state.steps)
    lines = ["# OPRO run report", "", f"- Status: {inline(state.stop_reason) if finished_with else state.status}",
             *_holding((state.stop_reason and not finished_with, f"- Stop reason: {inline(state.stop_reason or '')}"),
                       (state.status in ("failed", "interrupted"),
                        "- Resume: compile again with the same `log_dir`; nothing already scored runs again.")),
             f"- Predictors: {', '.join(code(p) for p in state.predictors) or 'none'}",
             f"- Training examples: {state.train_size}; validation examples: {state.val_size}",
             f"- Steps: {len(state.steps)} ({sum(1 for s in state.steps if s.complete)} complete)",
             f"- Candidates: {len(state.candidates)}" + (f" ({status_text})" if status_text else ""),
             f"- Metric calls: {state.metric_calls:,}",
             *_holding((failed, f"- Failed optimizer requests: {failed} (after a retry; their proposals are lost)"),
                       (skipped, f"- Optimizer proposals not asked for (max_cost): {skipped}"),
                       (unclosed, f"- Optimizer replies without their closing tag: {unclosed} of {replies}"))]
    lines += [f"- Optimizer {code(model)} asked one choice per request: {inline(why)}"
              for model, why in state.optimizer_single_choice.items()]
    lines += [f"- Optimizer {code(model)} under-reports its usage: {inline(why)}"
              for model, why in state.optimizer_usage_undercount.items()]
    lines.append(f"- Best training score: {_best_text(best)}")

    lines += ["", "## Settings", ""]
    settings = [[cell(key, None), cell(v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str))]
                for key, v in state.config.items()]
    lines.append(table(["Setting", "Value"], settings) if settings else "No settings recorded.")

    start_step = "the program as given"
    if any(c.step < 0 and not is_start(c) for c in state.candidates):
        start_step += " and its initial instructions"
    lines += ["", "## Score trajectory", "", f"Training accuracy (0-100) by step; step -1 is {start_step}.", ""]
    rows = [[str(row["step"]), _predictor_label(row["predictor"]), str(row["scored"]),
             *(DASH if value is None else f"{value:.1f}" for value in (row["best_this_step"], row["best_so_far"]))]
            for row in trajectory_rows(state)]
    header = ["Step", "Predictor", "Candidates scored", "Best this step", "Best so far"]
    lines.append(table(header, rows, "rlrrr") if rows else "Nothing scored yet.")

    best_blocks: list[str] = []
    for rank, candidate in enumerate(ranked_candidates(state.candidates)[:TOP_INSTRUCTIONS], 1):
        best_blocks += [f"### {rank}. {fmt_pct(candidate.score)} ({_where(candidate)}, candidate {candidate.id})", ""]
        if candidate.predictor is not None:
            best_blocks.append(fenced(candidate.instruction))
        else:  # the program as given: each predictor's instruction
            blocks = [line for predictor, instruction in candidate.instructions.items()
                      for line in (f"{code(predictor)}:", "", fenced(instruction) if instruction else "(empty)", "")]
            best_blocks += blocks[:-1] or ["(no instructions)"]
        best_blocks.append("")
    lines += ["", "## Best instructions", "", *(best_blocks[:-1] or ["No candidate has been scored yet."])]

    lines += ["", "## Selection", ""]
    selection = state.selection
    chosen = next((c for c in state.candidates if c.id == selection.candidate_id), None) if selection else None
    if selection is None:
        lines.append("No program has been selected yet.")
    else:
        lines += [f"- Candidate: {selection.candidate_id}" + (f" ({_where(chosen)})" if chosen else ""),
                  f"- Selected by: {selection.selected_by}", f"- Why: {inline(selection.reason)}"]
        if chosen is not None:
            lines += [f"- Training score: {_status_text(chosen)}",
                      *_holding((chosen.val_score is not None, f"- Validation score: {fmt_pct(chosen.val_score)}"))]

    validated = [c for c in state.candidates if c.val_score is not None]
    start = next((c for c in state.candidates if is_start(c)), None)
    if validated or state.start_val_score is not None:
        rows = []
        if state.start_val_score is not None and not (start is not None and start.val_score is not None):
            rows.append([DASH if start is None else str(start.id), "-1", "(start)",
                         DASH if start is None else cell(_status_text(start)), fmt_pct(state.start_val_score), ""])
        rows += [[str(c.id), str(c.step), _predictor_label(c.predictor), cell(_status_text(c)), fmt_pct(c.val_score),
                  "yes" if selection is not None and selection.candidate_id == c.id else ""] for c in validated]
        header = ["Candidate", "Step", "Predictor", "Training", "Validation", "Selected"]
        lines += ["", "## Validation scores", "", table(header, rows, "rrllr")]

    lines += _program_errors_section(state.candidates)
    lines += ["", "## Usage and cost", "", format_usage(state.usage)]
    if state.tolerated_errors:
        lines += ["", f"Errors tolerated (`max_errors`): {state.tolerated_errors}, each scored `failure_score`; "
                      "they are in the program errors above."]
    lines += timeline_section(state)
    if state.stop_reason:
        lines += ["", "## Stop reason", "", inline(state.stop_reason)]
    lines.append("")
    return "\n".join(lines)


def _timed(started: float | None, ended: float | None) -> list[str]:
    """The Started, Ended and Wall time cells."""
    return [*(DASH if t is None else datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
              for t in (started, ended)), DASH if started is None or ended is None else f"{ended - started:.1f} s"]


def timeline_section(state: RunState) -> list[str]:
    """The "Timeline" of ``report.md``: each compile (the first, each resumption, each interruption), each step's
    start, end and wall time, and each timed phase."""
    if not state.sessions and not state.phases:
        return []
    lines, rows, timed_header = ["", "## Timeline", ""], [], ["Started", "Ended", "Wall time"]
    for number, session in enumerate(state.sessions, 1):
        if session.ended_at is not None:
            end = session.end or DASH
        elif number < len(state.sessions) or state.status != "running":
            end = "the process died without an end (killed or crashed); resumed by the next compile"
        else:
            end = "running, or the process died (the report command says which)"
        rows.append([str(number), "start" if number == 1 else "resume", *_timed(session.started_at, session.ended_at),
                     cell(end)])
    if rows:
        lines.append(table(["Compile", "Kind", *timed_header, "How it ended"], rows, "rlllr"))
    timed = [s for s in state.steps if s.started_at is not None]
    if timed:
        rows = [[str(s.step), *_timed(s.started_at, s.ended_at)] for s in timed]
        lines += ["", "Steps:", "", table(["Step", *timed_header], rows, "rllr")]
    if state.phases:
        rows = [[cell(p.name), *_timed(p.started_at, p.ended_at)] for p in state.phases]
        lines += ["", "Phases:", "", table(["Phase", *timed_header], rows, "lllr")]
    return lines


def step_dir(log_dir: str | os.PathLike[str], step: int) -> Path:
    """``log_dir/steps/NNN`` (the step number zero-padded to three digits)."""
    return Path(log_dir) / STEPS_DIR / f"{step:03d}"


def write_step_files(state: RunState, step: int, log_dir: str | os.PathLike[str]) -> Path:
    """Write ``steps/NNN/meta_prompt.txt`` (the exact meta-prompt), ``replies.json`` and ``report.md``;
    return the folder."""
    record = _require_step(state, step)
    folder = step_dir(log_dir, step)
    folder.mkdir(parents=True, exist_ok=True)
    replies = [{"text": reply.text, "instruction": reply.instruction, "fate": reply.fate,
                "candidate_id": reply.candidate_id,  # and its training mean in [0, 1]; None unless scored
                "score": candidate.score if candidate is not None and candidate.status == "scored" else None}
               for reply, candidate in _replies(state, record)]
    (folder / META_PROMPT_FILE).write_text(record.meta_prompt, encoding="utf-8", newline="")
    replies_text = json.dumps(replies, indent=2, ensure_ascii=False) + "\n"
    (folder / REPLIES_FILE).write_text(replies_text, encoding="utf-8", newline="")
    (folder / REPORT_FILE).write_text(render_step_report(state, step), encoding="utf-8", newline="")
    return folder


def write_run_report(state: RunState, log_dir: str | os.PathLike[str], *, plot: bool = True) -> list[Path]:
    """Write ``report.md`` and, when ``plot`` and matplotlib is installed, ``trajectory.png``; return the paths
    written."""
    folder = Path(log_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (report := folder / REPORT_FILE).write_text(render_run_report(state), encoding="utf-8", newline="")
    written = [report]
    if plot:
        try:
            written.append(plot_trajectory(state, folder / TRAJECTORY_FILE))
        except ImportError as exc:  # matplotlib is optional: the report stands without the plot, said once
            if not _PLOT_SKIP_SAID:
                _PLOT_SKIP_SAID.append(True)
                logger.warning("No %s in %s: %s", TRAJECTORY_FILE, folder, exc)
    return written


_PLOT_SKIP_SAID: list[bool] = []  # the missing plot is said once per process, not at every step
