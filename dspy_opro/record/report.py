"""Reports of an OPRO run: one Markdown page per step, one for the run, and the score-trajectory plot.

Everything here is a pure function of a :class:`~dspy_opro.record.state.RunState`, so a report can be rebuilt at any
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
import os
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dspy_opro.record.markdown import DASH, cell, code, fenced, fmt_cost, fmt_pct, fmt_row_pct, inline, pct, table
from dspy_opro.record.plot import PLOT_INSTALL_HINT, plot_trajectory  # noqa: F401 (re-exported; the plot lives there)
from dspy_opro.record.state import (
    Candidate,
    CandidateStatus,
    ModelUsage,
    RunState,
    Step,
    UsageRecord,
    best_candidate,
    ranked_candidates,
)

__all__ = [
    "REPORT_FILE",
    "TRAJECTORY_FILE",
    "STEPS_DIR",
    "format_usage",
    "plot_trajectory",
    "render_run_report",
    "render_step_report",
    "step_dir",
    "timeline_section",
    "trajectory_rows",
    "write_run_report",
    "write_step_files",
]

REPORT_FILE = "report.md"
TRAJECTORY_FILE = "trajectory.png"
STEPS_DIR = "steps"
META_PROMPT_FILE = "meta_prompt.txt"
REPLIES_FILE = "replies.json"

TOP_INSTRUCTIONS = 5
MAX_ERROR_ROWS = 50  # rows of the "Program errors" table in report.md; the rest are in state.json

# --------------------------------------------------------------------------------------------------- formatting


def _predictor_label(predictor: str | None) -> str:
    return "(start)" if predictor is None else code(predictor)


# ------------------------------------------------------------------------------------------------ run queries


def _by_id(state: RunState) -> dict[int, Candidate]:
    return {c.id: c for c in state.candidates}


def _step_record(state: RunState, step: int) -> Step | None:
    for record in state.steps:
        if record.step == step:
            return record
    return None


def _require_step(state: RunState, step: int) -> Step:
    record = _step_record(state, step)
    if record is None:
        known = ", ".join(str(s.step) for s in state.steps) or "none"
        raise ValueError(f"the run record has no step {step} (steps recorded: {known})")
    return record


def _step_numbers(state: RunState) -> list[int]:
    """Every step with a record or a candidate, the start (-1) first when it has candidates."""
    return sorted({s.step for s in state.steps} | {c.step for c in state.candidates})


def _candidates_of(state: RunState, step: int) -> list[Candidate]:
    return [c for c in state.candidates if c.step == step]


def _best_so_far(state: RunState, step: int) -> Candidate | None:
    return best_candidate(c for c in state.candidates if c.step <= step)


def _status_text(candidate: Candidate) -> str:
    if candidate.status == "scored" and candidate.score is not None:
        return fmt_pct(candidate.score)
    if candidate.status == "raced_out" and candidate.score is not None:  # its partial mean, then how far it ran
        return f"{fmt_pct(candidate.score)} ({candidate.reason})"
    return f"{candidate.status}: {candidate.reason}" if candidate.reason else candidate.status


def _is_start(candidate: Candidate) -> bool:
    """The program as given (step -1 and no predictor); initial instructions are step -1 with their predictor."""
    return candidate.step < 0 and candidate.predictor is None


def _where(candidate: Candidate) -> str:
    if _is_start(candidate):
        return "the program as given"
    if candidate.step < 0:
        return f"initial instruction, predictor {_predictor_label(candidate.predictor)}"
    return f"step {candidate.step}, predictor {_predictor_label(candidate.predictor)}"


def _candidate_label(candidate: Candidate) -> str:
    return f"candidate {candidate.id}, {_where(candidate)}"


def trajectory_rows(state: RunState) -> list[dict[str, Any]]:
    """One row per step (the start as step -1): the step, its predictor (None for the start), how many of its
    candidates were scored, its best training score and the best so far, both on the 0-100 scale with one
    decimal (None when nothing was scored)."""
    rows = []
    for step in _step_numbers(state):
        candidates = _candidates_of(state, step)
        record = _step_record(state, step)
        if record is not None:
            predictor = record.predictor
        elif step < 0:  # the start's row, with any initial instructions
            predictor = None
        else:
            predictor = next((c.predictor for c in candidates if c.predictor is not None), None)
        best = best_candidate(candidates)
        so_far = _best_so_far(state, step)
        rows.append(
            {
                "step": step,
                "predictor": predictor,
                "scored": sum(c.status == "scored" for c in candidates),
                "best_this_step": pct(best.score) if best else None,
                "best_so_far": pct(so_far.score) if so_far else None,
            }
        )
    return rows


# --------------------------------------------------------------------------------------------------- markdown


def format_usage(usage: UsageRecord) -> str:
    """A Markdown table of calls, cache hits, tokens (with the prompt tokens served from the provider's prompt
    cache) and cost for the optimizer, the task and in total, then one row per model when known. A cost is
    ``unknown`` when no call had a price and ``≥ $x`` when some had none."""
    total = ModelUsage()
    total.add(usage.optimizer)
    total.add(usage.task)
    header = ["Role", "Calls", "Cache hits", "Prompt tokens", "Cached prompt tokens", "Completion tokens", "Cost"]
    align = ["---", "---:", "---:", "---:", "---:", "---:", "---:"]

    def row(label: str, u: ModelUsage) -> list[str]:
        return [
            label,
            f"{u.calls:,}",
            f"{u.cache_hits:,}",
            f"{u.prompt_tokens:,}",
            f"{u.cached_tokens:,}",
            f"{u.completion_tokens:,}",
            fmt_cost(u.cost, u.unpriced_calls),
        ]

    text = table(header, [row("optimizer", usage.optimizer), row("task", usage.task), row("total", total)], align)
    if usage.by_model:
        rows = [row(cell(code(model), None), u) for model, u in usage.by_model.items()]
        text += "\n\n" + table(["Model", *header[1:]], rows, align)
    return text


def render_step_report(state: RunState, step: int) -> str:
    """Markdown for ``steps/NNN/report.md``: the predictor, the exemplars, every reply with its fate and its
    candidate's training score (or status and reason), the step's candidates, its best and the best so far."""
    record = _require_step(state, step)
    by_id = _by_id(state)
    candidates = _candidates_of(state, step)
    best = best_candidate(candidates)
    so_far = _best_so_far(state, step)
    fates = Counter(reply.fate for reply in record.replies)

    lines = [f"# OPRO step {step}", ""]
    lines.append(f"- Predictor: {code(record.predictor)}")
    exemplars = ", ".join(str(i) for i in record.exemplar_indices) or "none"
    lines.append(f"- Exemplars (training indices): {exemplars}")
    lines.append(f"- Temperature: {record.temperature:g}")
    fate_text = ", ".join(f"{fate} {count}" for fate, count in fates.items())
    lines.append(f"- Optimizer replies: {len(record.replies)}" + (f" ({fate_text})" if fate_text else ""))
    if record.failed_calls:
        lines.append(f"- Failed optimizer calls: {record.failed_calls}")
    if record.skipped_calls:
        lines.append(f"- Proposals not asked for: {record.skipped_calls} ({inline(record.skip_reason or '')})")
    unclosed = sum(reply.unclosed for reply in record.replies)
    if unclosed:
        lines.append(f"- Replies without their closing tag: {unclosed} (the authors' extraction kept; see the fates)")
    if not record.complete:
        lines.append("- Complete: no (the run stopped or was interrupted during this step)")
    lines.append(f"- Best this step: {fmt_pct(best.score) + f' (candidate {best.id})' if best else DASH}")
    lines.append(f"- Best so far: {fmt_pct(so_far.score) + f' ({_candidate_label(so_far)})' if so_far else DASH}")

    lines += ["", "## Replies", ""]
    if record.replies:
        rows = []
        for number, reply in enumerate(record.replies, 1):
            candidate = by_id.get(reply.candidate_id) if reply.candidate_id is not None else None
            rows.append(
                [
                    str(number),
                    cell(reply.text),
                    reply.fate,
                    DASH if reply.candidate_id is None else str(reply.candidate_id),
                    DASH if candidate is None else cell(_status_text(candidate)),
                ]
            )
        header = ["#", "Reply", "Fate", "Candidate", "Training score"]
        lines.append(table(header, rows, ["---:", "---", "---", "---:", "---"]))
    else:
        lines.append("No replies.")

    if candidates:
        lines += ["", "## Candidates", ""]
        rows = [[str(c.id), cell(_status_text(c)), cell(c.instruction)] for c in candidates]
        lines.append(table(["Candidate", "Training score", "Instruction"], rows, ["---:", "---", "---"]))

    if record.errors:
        lines += ["", "## Errors", ""]
        lines += [f"- {inline(error)}" for error in record.errors]

    lines += _program_errors_section(candidates)

    lines += ["", f"The meta-prompt is in `{META_PROMPT_FILE}`, the replies in full in `{REPLIES_FILE}`.", ""]
    return "\n".join(lines)


def _program_errors_section(candidates: list[Candidate], limit: int = MAX_ERROR_ROWS) -> list[str]:
    """A "Program errors" table: per candidate, how many evaluations raised, and each distinct error's first example."""
    failing = [c for c in candidates if c.error_count]
    if not failing:
        return []
    rows = []
    for candidate in failing:
        for record in candidate.errors:
            where = f"{'training' if record.split == 'train' else 'validation'} {record.example}"
            rows.append([str(candidate.id), str(candidate.error_count), str(record.count), where,
                         cell(record.error)])
    shown = rows[:limit]
    lines = ["", "## Program errors", "",
             "Evaluations whose program raised (scored `failure_score`); the first example of each distinct error.", ""]
    header = ["Candidate", "Evaluations that raised", "This error", "First example", "Error"]
    lines.append(table(header, shown, ["---:", "---:", "---:", "---", "---"]))
    if len(rows) > limit:
        lines += ["", f"{len(rows) - limit} more rows are in `state.json` (each candidate's `errors`)."]
    return lines


def _instruction_blocks(candidate: Candidate) -> list[str]:
    if candidate.predictor is not None:
        return [fenced(candidate.instruction)]
    blocks = []
    for predictor, instruction in candidate.instructions.items():
        blocks += [f"{code(predictor)}:", "", fenced(instruction) if instruction else "(empty)", ""]
    return blocks[:-1] if blocks else ["(no instructions)"]


def _top_candidates(state: RunState, k: int = TOP_INSTRUCTIONS) -> list[Candidate]:
    return ranked_candidates(state.candidates)[:k]


def _optimizer_lines(state: RunState) -> list[str]:
    """What went wrong with the optimizer's requests over the run, when anything did."""
    lines = []
    failed = sum(record.failed_calls for record in state.steps)
    if failed:
        lines.append(f"- Failed optimizer requests: {failed} (after a retry; their proposals are lost)")
    skipped = sum(record.skipped_calls for record in state.steps)
    if skipped:
        lines.append(f"- Optimizer proposals not asked for (max_cost): {skipped}")
    unclosed = sum(reply.unclosed for record in state.steps for reply in record.replies)
    if unclosed:
        replies = sum(len(record.replies) for record in state.steps)
        lines.append(f"- Optimizer replies without their closing tag: {unclosed} of {replies}")
    for model, why in state.optimizer_single_choice.items():
        lines.append(f"- Optimizer {code(model)} asked one choice per request: {inline(why)}")
    for model, why in state.optimizer_usage_undercount.items():
        lines.append(f"- Optimizer {code(model)} under-reports its usage: {inline(why)}")
    return lines


def render_run_report(state: RunState) -> str:
    """Markdown for ``report.md``: settings, the score trajectory, the best instructions, the selection,
    validation scores, usage and cost, and why the run stopped."""
    by_id = _by_id(state)
    counts = Counter(c.status for c in state.candidates)
    best = state.best()

    lines = ["# OPRO run report", ""]
    finished_with = state.status == "finished" and state.stop_reason  # "finished with N candidates unscored ..."
    lines.append(f"- Status: {inline(state.stop_reason) if finished_with else state.status}")
    if state.stop_reason and not finished_with:
        lines.append(f"- Stop reason: {inline(state.stop_reason)}")
    if state.status in ("failed", "interrupted"):
        lines.append("- Resume: compile again with the same `log_dir`; nothing already scored runs again.")
    lines.append(f"- Predictors: {', '.join(code(p) for p in state.predictors) or 'none'}")
    lines.append(f"- Training examples: {state.train_size}; validation examples: {state.val_size}")
    steps_done = sum(1 for s in state.steps if s.complete)
    lines.append(f"- Steps: {len(state.steps)} ({steps_done} complete)")
    status_text = ", ".join(f"{s} {counts[s]}" for s in CandidateStatus if counts[s])
    lines.append(f"- Candidates: {len(state.candidates)}" + (f" ({status_text})" if status_text else ""))
    lines.append(f"- Metric calls: {state.metric_calls:,}")
    lines += _optimizer_lines(state)
    lines.append(f"- Best training score: {fmt_pct(best.score) + f' ({_candidate_label(best)})' if best else DASH}")

    lines += ["", "## Settings", ""]
    if state.config:
        rows = [[cell(key, None), cell(_setting(value))] for key, value in state.config.items()]
        lines.append(table(["Setting", "Value"], rows))
    else:
        lines.append("No settings recorded.")

    start_step = "the program as given"
    if any(c.step < 0 and not _is_start(c) for c in state.candidates):
        start_step += " and its initial instructions"
    lines += ["", "## Score trajectory", "", f"Training accuracy (0-100) by step; step -1 is {start_step}.", ""]
    rows = [
        [
            str(row["step"]),
            _predictor_label(row["predictor"]),
            str(row["scored"]),
            fmt_row_pct(row["best_this_step"]),
            fmt_row_pct(row["best_so_far"]),
        ]
        for row in trajectory_rows(state)
    ]
    header = ["Step", "Predictor", "Candidates scored", "Best this step", "Best so far"]
    lines.append(table(header, rows, ["---:", "---", "---:", "---:", "---:"]) if rows else "Nothing scored yet.")

    lines += ["", "## Best instructions", ""]
    top = _top_candidates(state)
    if not top:
        lines.append("No candidate has been scored yet.")
    for rank, candidate in enumerate(top, 1):
        lines += [f"### {rank}. {fmt_pct(candidate.score)} ({_where(candidate)}, candidate {candidate.id})", ""]
        lines += [*_instruction_blocks(candidate), ""]
    if top:
        lines.pop()

    lines += ["", "## Selection", ""]
    selection = state.selection
    chosen = by_id.get(selection.candidate_id) if selection else None
    if selection is None:
        lines.append("No program has been selected yet.")
    else:
        lines.append(f"- Candidate: {selection.candidate_id}" + (f" ({_where(chosen)})" if chosen else ""))
        lines.append(f"- Selected by: {selection.selected_by}")
        lines.append(f"- Why: {inline(selection.reason)}")
        if chosen is not None:
            lines.append(f"- Training score: {_status_text(chosen)}")
            if chosen.val_score is not None:
                lines.append(f"- Validation score: {fmt_pct(chosen.val_score)}")

    validated = [c for c in state.candidates if c.val_score is not None]
    start = next((c for c in state.candidates if _is_start(c)), None)
    if validated or state.start_val_score is not None:
        lines += ["", "## Validation scores", ""]
        rows = []
        if state.start_val_score is not None and not (start is not None and start.val_score is not None):
            start_id = DASH if start is None else str(start.id)
            train = DASH if start is None else cell(_status_text(start))
            rows.append([start_id, "-1", "(start)", train, fmt_pct(state.start_val_score), ""])
        for c in validated:
            selected = "yes" if selection is not None and selection.candidate_id == c.id else ""
            rows.append(
                [
                    str(c.id),
                    str(c.step),
                    _predictor_label(c.predictor),
                    cell(_status_text(c)),
                    fmt_pct(c.val_score),
                    selected,
                ]
            )
        header = ["Candidate", "Step", "Predictor", "Training", "Validation", "Selected"]
        lines.append(table(header, rows, ["---:", "---:", "---", "---", "---:", "---"]))

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


def _when(timestamp: float | None) -> str:
    if timestamp is None:
        return DASH
    return datetime.fromtimestamp(timestamp, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _wall(started: float | None, ended: float | None) -> str:
    return DASH if started is None or ended is None else f"{ended - started:.1f} s"


def timeline_section(state: RunState) -> list[str]:
    """The "Timeline" of ``report.md``: each compile (the first, each resumption, each interruption), each step's
    start, end and wall time, and each timed phase."""
    if not state.sessions and not state.phases:
        return []
    lines = ["", "## Timeline", ""]
    rows = []
    for number, session in enumerate(state.sessions, 1):
        if session.ended_at is not None:
            end = session.end or DASH
        elif number < len(state.sessions) or state.status != "running":
            end = "the process died without an end (killed or crashed); resumed by the next compile"
        else:
            end = "running, or the process died (the report command says which)"
        kind = "start" if number == 1 else "resume"
        rows.append([str(number), kind, _when(session.started_at), _when(session.ended_at),
                     _wall(session.started_at, session.ended_at), cell(end)])
    if rows:
        lines.append(table(["Compile", "Kind", "Started", "Ended", "Wall time", "How it ended"], rows,
                           ["---:", "---", "---", "---", "---:", "---"]))
    timed = [s for s in state.steps if s.started_at is not None]
    if timed:
        lines += ["", "Steps:", ""]
        rows = [[str(s.step), _when(s.started_at), _when(s.ended_at), _wall(s.started_at, s.ended_at)]
                for s in timed]
        lines.append(table(["Step", "Started", "Ended", "Wall time"], rows, ["---:", "---", "---", "---:"]))
    if state.phases:
        lines += ["", "Phases:", ""]
        rows = [[cell(p.name), _when(p.started_at), _when(p.ended_at), _wall(p.started_at, p.ended_at)]
                for p in state.phases]
        lines.append(table(["Phase", "Started", "Ended", "Wall time"], rows, ["---", "---", "---", "---:"]))
    return lines


def _setting(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


# ------------------------------------------------------------------------------------------------------ files


def step_dir(log_dir: str | os.PathLike[str], step: int) -> Path:
    """``log_dir/steps/NNN`` (the step number zero-padded to three digits)."""
    return Path(log_dir) / STEPS_DIR / f"{step:03d}"


def _replies_payload(state: RunState, record: Step) -> list[dict[str, Any]]:
    by_id = _by_id(state)
    payload = []
    for reply in record.replies:
        candidate = by_id.get(reply.candidate_id) if reply.candidate_id is not None else None
        score = candidate.score if candidate is not None and candidate.status == "scored" else None
        payload.append(
            {
                "text": reply.text,
                "instruction": reply.instruction,
                "fate": reply.fate,
                "candidate_id": reply.candidate_id,
                "score": score,  # the candidate's training mean in [0, 1]; None unless scored
            }
        )
    return payload


def write_step_files(state: RunState, step: int, log_dir: str | os.PathLike[str]) -> Path:
    """Write ``steps/NNN/meta_prompt.txt`` (the exact meta-prompt), ``replies.json`` and ``report.md``;
    return the folder."""
    record = _require_step(state, step)
    folder = step_dir(log_dir, step)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / META_PROMPT_FILE).write_text(record.meta_prompt, encoding="utf-8", newline="")
    replies = json.dumps(_replies_payload(state, record), indent=2, ensure_ascii=False) + "\n"
    (folder / REPLIES_FILE).write_text(replies, encoding="utf-8", newline="")
    (folder / REPORT_FILE).write_text(render_step_report(state, step), encoding="utf-8", newline="")
    return folder


def write_run_report(state: RunState, log_dir: str | os.PathLike[str], *, plot: bool = True) -> list[Path]:
    """Write ``report.md`` and, when ``plot`` and matplotlib is installed, ``trajectory.png``; return the paths
    written."""
    folder = Path(log_dir)
    folder.mkdir(parents=True, exist_ok=True)
    report = folder / REPORT_FILE
    report.write_text(render_run_report(state), encoding="utf-8", newline="")
    written = [report]
    if plot:
        try:
            written.append(plot_trajectory(state, folder / TRAJECTORY_FILE))
        except ImportError:
            pass  # matplotlib is optional: the report stands without the plot
    return written
