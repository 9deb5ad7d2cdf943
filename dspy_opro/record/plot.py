"""The score-trajectory plot of an OPRO run (``trajectory.png``), drawn from the run record alone.

The figure follows the OPRO paper's trajectory figures and adds what a reader of one run asks next: every scored
candidate is a dot coloured by the predictor its step optimized (round-robin runs show one colour per predictor),
candidates of one step with equal scores are spread side by side instead of hiding behind each other, validation
scores are hollow diamonds where the run scored them, candidates racing stopped are grey crosses at their partial
mean ("raced out", never on the best-so-far line), and the candidate ``compile`` returned (``state.selection``)
is a star with its training and validation scores in the legend. The legend sits below the axes, away from the
data, and the y-axis is named after what is plotted: the metric's training score, or, for label-free runs, the
preference over the starting program.

Only matplotlib's object-oriented API with the Agg canvas is used, so pyplot's global state and the backend a user
has chosen stay untouched; matplotlib is imported when a figure is built.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspy_opro.state import Candidate, RunState

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PLOT_INSTALL_HINT = "pip install dspy-opro[plot]"
DASH = "—"  # a score there is none of, in the plot and the reports
FIGURE_SIZE = (9.6, 5.4)  # inches; 960 x 540 pixels at DPI
DPI = 100
SPREAD = 0.4  # total width (in steps) over which candidates of one step with equal scores are spread

def fmt_pct(score: float | None) -> str:
    return DASH if score is None else f"{score * 100:.1f}"


def is_scored(candidate: Candidate) -> bool:
    return candidate.status == "scored" and candidate.score is not None


def is_start(candidate: Candidate) -> bool:
    """The program as given (step -1 and no predictor); initial instructions are step -1 with their predictor."""
    return candidate.step < 0 and candidate.predictor is None


START_COLOUR = "#636363"
BEST_COLOUR = "#08519c"
SELECTED_COLOUR = "#d62728"
# Colour-blind-safe (Okabe-Ito) colours, one per predictor in the order the run lists them.
PREDICTOR_COLOURS = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#000000")


def score_axis_label(state: RunState) -> str:
    """The y-axis label: ``preference over the start (%, 50 = as good)`` for label-free runs, else
    ``training score (metric: NAME) %`` (``training score (%)`` when the run did not record its metric)."""
    if state.config.get("label_free"):
        return "preference over the start (%, 50 = as good)"
    metric = state.config.get("metric")  # the run's ``module.qualname#digest``: the bare name is shown
    name = metric.split("#", 1)[0].rsplit(".", 1)[-1] if metric and isinstance(metric, str) else None
    return f"training score (metric: {name}) %" if name else "training score (%)"


def spread_offsets(count: int, width: float = SPREAD) -> list[float]:
    """``count`` x-offsets centred on 0 and at most ``width`` apart end to end (``[0.0]`` for one point)."""
    if count <= 1:
        return [0.0] * count
    return [round(-width / 2 + i * width / (count - 1), 6) for i in range(count)]


def _equal_groups(candidates: list[Candidate], value: Callable[[Candidate], Any]
                  ) -> dict[tuple[int, float], list[Candidate]]:
    """(step, y) -> the candidates of that step whose ``value(c) * 100`` is y."""
    groups: dict[tuple[int, float], list[Candidate]] = defaultdict(list)
    for candidate in candidates:
        groups[(candidate.step, round(value(candidate) * 100, 6))].append(candidate)
    return groups


def _positions(candidates: list[Candidate], value: Callable[[Candidate], Any]) -> dict[int, tuple[float, float]]:
    """Candidate id -> (x, y) with y = ``value(c) * 100``; candidates of one step sharing a y are spread apart."""
    return {c.id: (step + offset, y) for (step, y), group in _equal_groups(candidates, value).items()
            for c, offset in zip(sorted(group, key=lambda c: c.id), spread_offsets(len(group)), strict=True)}


def _colour(state: RunState, predictor: str | None) -> str:
    if predictor is None:
        return START_COLOUR
    names = list(state.predictors)
    return PREDICTOR_COLOURS[(names.index(predictor) if predictor in names else len(names)) % len(PREDICTOR_COLOURS)]


def build_trajectory_figure(state: RunState) -> Figure:
    """The trajectory figure of ``state`` (see the module docstring), not yet written anywhere.

    Raises ImportError when matplotlib is not installed."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import FuncFormatter, MaxNLocator
    except ImportError as exc:
        raise ImportError(f"the trajectory plot needs matplotlib: {PLOT_INSTALL_HINT}") from exc

    figure = Figure(figsize=FIGURE_SIZE, dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    label_free = bool(state.config.get("label_free"))
    scored = [c for c in state.candidates if is_scored(c)]
    positions = _positions(scored, lambda c: c.score)
    what = "preference" if label_free else "training score"

    # Candidates: one series per predictor (the start in grey), so the legend names each colour.
    series: dict[str | None, list[Candidate]] = defaultdict(list)
    for candidate in scored:
        series[candidate.predictor].append(candidate)
    unlisted = sorted(p for p in series if p is not None and p not in state.predictors)
    for predictor in [None, *state.predictors, *unlisted]:
        members = series.get(predictor)
        if not members:
            continue
        label = ("start (the program as given)" if predictor is None  # the predictor named only when there are more
                 else f"candidate ({predictor})" if len(state.predictors) > 1 else "candidate")
        axes.scatter([positions[c.id][0] for c in members], [positions[c.id][1] for c in members], s=28,
                     color=_colour(state, predictor), alpha=0.85, edgecolors="white", linewidths=0.5, label=label,
                     zorder=4)

    # Racing: a candidate stopped early, at its partial mean; never part of the best-so-far line.
    raced_out = [c for c in state.candidates if c.status == "raced_out" and c.score is not None]
    if raced_out:
        axes.scatter([c.step for c in raced_out], [100 * c.score for c in raced_out], s=22, marker="x",  # type: ignore[operator]
                     color=START_COLOUR, alpha=0.7, linewidths=1.0, label="raced out (partial mean)", zorder=2)

    # Equal scores: besides the spread, a count over each group, readable even when many steps squeeze it.
    for (step, y), group in _equal_groups(scored, lambda c: c.score).items():
        if len(group) > 1:
            axes.annotate(f"×{len(group)}", (step, y), xytext=(0, 6), textcoords="offset points", ha="center",
                          va="bottom", fontsize=7, color="#333333", zorder=7)

    if scored:  # the best training score so far at each step with a scored candidate
        steps: list[float] = sorted({c.step for c in scored})
        best = [round(max(c.score or 0.0 for c in scored if c.step <= step) * 100, 6) for step in steps]
        steps.append(max(x for x, _ in positions.values()))  # reach the rightmost dot, spread included
        best.append(best[-1])
        axes.step(steps, best, where="post", color=BEST_COLOUR, linewidth=2, label=f"best {what} so far", zorder=3)

    start = next((c for c in scored if is_start(c)), None)
    if start is not None:
        axes.axhline(start.score * 100, color=START_COLOUR, linestyle="--", linewidth=1.0,  # type: ignore[operator]
                     label=f"start {what} ({fmt_pct(start.score)})", zorder=1)

    validated = [c for c in state.candidates if c.val_score is not None]
    if validated:
        val_positions = _positions(validated, lambda c: c.val_score)
        axes.scatter([val_positions[c.id][0] for c in validated], [val_positions[c.id][1] for c in validated], s=46,
                     marker="D", facecolors="none", edgecolors=[_colour(state, c.predictor) for c in validated],
                     linewidths=1.3, label="validation score", zorder=7)  # over the star, which may share its score
    elif state.start_val_score is not None and start is not None:
        axes.scatter([-1], [state.start_val_score * 100], s=46, marker="D", facecolors="none",
                     edgecolors=[START_COLOUR], linewidths=1.3, label="validation score", zorder=7)

    selected = next((c for c in scored if state.selection is not None and c.id == state.selection.candidate_id), None)
    if selected is not None:  # the scored candidate compile returned
        val = selected.val_score if selected.val_score is not None else (
            state.start_val_score if is_start(selected) else None)
        where = ("start" if is_start(selected) else "initial instruction" if selected.step < 0
                 else f"step {selected.step}")
        text = (f"returned by compile: candidate {selected.id} ({where}), {what} {fmt_pct(selected.score)}"
                + ("" if val is None else f", validation {fmt_pct(val)}"))
        x, y = positions[selected.id]
        axes.scatter([x], [y], s=220, marker="*", color=SELECTED_COLOUR, edgecolors="black", linewidths=0.6,
                     label=text, zorder=6)

    if not scored:
        axes.text(0.5, 0.5, "no scored candidates yet", ha="center", va="center", transform=axes.transAxes)
    axes.set_title("OPRO: preference over the start by step" if label_free else "OPRO: training score by step")
    axes.set_xlabel("step")
    axes.set_ylabel(score_axis_label(state))
    axes.set_ylim(-3, 103)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    # Step -1 is the program as given; no step lies before it.
    axes.xaxis.set_major_formatter(FuncFormatter(lambda x, _: "" if x < -1 else "start" if x == -1 else f"{x:g}"))
    axes.grid(True, axis="y", alpha=0.3)
    handles, labels = axes.get_legend_handles_labels()
    if handles:
        # Below the axes, never over the data; the layout engine makes room for it.
        figure.legend(handles, labels, loc="outside lower center", ncols=2, frameon=False, fontsize="small")
    return figure


def plot_trajectory(state: RunState, path: str | os.PathLike[str]) -> Path:
    """Draw the trajectory figure of ``state`` (see ``build_trajectory_figure``) as a 960 x 540 PNG at
    ``path``; return the path. Raises ImportError when matplotlib is not installed."""
    figure = build_trajectory_figure(state)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    # The Agg canvas build_trajectory_figure gave it: the figure's own size and dpi, whatever savefig.* rcParams say.
    figure.canvas.print_png(str(target))  # type: ignore[attr-defined]
    return target
