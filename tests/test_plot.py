"""The trajectory plot, read back through matplotlib's objects: series, positions, colours, labels, the legend."""

from __future__ import annotations

from pathlib import Path

import pytest

from dspy_opro.record.plot import (
    PREDICTOR_COLOURS,
    SELECTED_COLOUR,
    START_COLOUR,
    build_trajectory_figure,
    plot_trajectory,
    score_axis_label,
    spread_offsets,
)
from dspy_opro.state import RunState, Selection
from tests.test_report import build_fixture_state

pytest.importorskip("matplotlib")

from matplotlib.colors import to_hex  # noqa: E402


def _series(figure) -> dict[str, object]:
    """Every labelled artist of the axes by its legend label."""
    axes = figure.axes[0]
    artists = [*axes.collections, *axes.lines]
    return {a.get_label(): a for a in artists if not a.get_label().startswith("_")}


def _points(collection) -> list[tuple[float, float]]:
    return [(round(float(x), 3), round(float(y), 3)) for x, y in collection.get_offsets()]


@pytest.fixture
def state() -> RunState:
    return build_fixture_state()


def test_spread_offsets() -> None:
    assert spread_offsets(0) == []
    assert spread_offsets(1) == [0.0]
    assert spread_offsets(2) == [-0.2, 0.2]
    assert spread_offsets(3) == [-0.2, 0.0, 0.2]
    assert spread_offsets(5, width=1.0) == [-0.5, -0.25, 0.0, 0.25, 0.5]


def test_candidates_one_colour_per_predictor_and_equal_scores_spread(state: RunState) -> None:
    series = _series(build_trajectory_figure(state))
    start, rewrite, answer = series["start (the program as given)"], series["candidate (rewrite)"], series[
        "candidate (answer)"]
    assert _points(start) == [(-1.0, 40.0)]
    assert _points(rewrite) == [(0.0, 50.0), (0.0, 30.0), (0.0, 40.0), (2.0, 70.0), (2.0, 20.0), (2.0, 50.0)]
    # Candidates 4 and 6 both score 60.0 at step 1: side by side, not one behind the other.
    assert _points(answer) == [(0.8, 60.0), (1.2, 60.0), (3.0, 45.0)]
    assert [to_hex(c) for c in start.get_facecolors()] == [START_COLOUR]
    assert {to_hex(c) for c in rewrite.get_facecolors()} == {PREDICTOR_COLOURS[0]}  # state.predictors[0]
    assert {to_hex(c) for c in answer.get_facecolors()} == {PREDICTOR_COLOURS[1]}
    # The equal pair also carries a count.
    texts = [(t.get_text(), t.xy) for t in build_trajectory_figure(state).axes[0].texts]
    assert texts == [("×2", (1, 60.0))]


def test_best_so_far_start_line_and_validation_points(state: RunState) -> None:
    series = _series(build_trajectory_figure(state))
    best = series["best training score so far"]
    assert list(best.get_xdata()) == [-1, 0, 1, 2, 3, 3.0]
    assert list(best.get_ydata()) == [40.0, 50.0, 60.0, 70.0, 70.0, 70.0]
    assert list(series["start training score (40.0)"].get_ydata()) == [40.0, 40.0]
    validation = series["validation score"]
    assert _points(validation) == [(1.0, 50.0), (2.0, 75.0)]  # candidates 4 and 7, where the run validated
    assert [to_hex(c) for c in validation.get_edgecolors()] == [PREDICTOR_COLOURS[1], PREDICTOR_COLOURS[0]]
    assert len(validation.get_facecolors()) == 0  # hollow


def test_returned_candidate_is_marked_with_its_scores(state: RunState) -> None:
    series = _series(build_trajectory_figure(state))
    label = "returned by compile: candidate 7 (step 2), training score 70.0, validation 75.0"
    assert _points(series[label]) == [(2.0, 70.0)]
    assert [to_hex(c) for c in series[label].get_facecolors()] == [SELECTED_COLOUR]

    start_picked = state.model_copy(
        update={"selection": Selection(candidate_id=0, selected_by="start", reason="nothing beat it"),
                "start_val_score": 0.5}
    )
    series = _series(build_trajectory_figure(start_picked))
    assert _points(series["returned by compile: candidate 0 (start), training score 40.0, validation 50.0"]) == [
        (-1.0, 40.0)]

    unselected = state.model_copy(update={"selection": None})
    assert not [k for k in _series(build_trajectory_figure(unselected)) if k.startswith("returned")]


def test_legend_outside_the_axes_and_axis_names(state: RunState) -> None:
    figure = build_trajectory_figure(state)
    axes = figure.axes[0]
    assert axes.get_legend() is None and len(figure.legends) == 1
    legend = figure.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == [
        "start (the program as given)",
        "candidate (rewrite)",
        "candidate (answer)",
        "best training score so far",
        "start training score (40.0)",
        "validation score",
        "returned by compile: candidate 7 (step 2), training score 70.0, validation 75.0",
    ]
    figure.canvas.draw()
    legend_box, axes_box = legend.get_window_extent(), axes.get_window_extent()
    assert legend_box.y1 <= axes_box.y0  # wholly below the axes: it covers no data
    assert axes.get_ylabel() == "training score (%)"  # the fixture records no metric
    assert axes.get_title() == "OPRO: training score by step"
    assert [t.get_text() for t in axes.get_xticklabels() if t.get_text()][:2] == ["start", "0"]


def test_axis_label_names_the_metric_or_the_preference(state: RunState) -> None:
    with_metric = state.model_copy(update={"config": {**state.config, "metric": "mypkg.metrics.exact_match"}})
    assert score_axis_label(with_metric) == "training score (metric: exact_match) %"
    # As the run records it: the qualified name and the digest of the metric's code.
    recorded = state.model_copy(update={"config": {**state.config, "metric": "mypkg.metrics.exact_match#4dc7fd2b"}})
    assert score_axis_label(recorded) == "training score (metric: exact_match) %"
    label_free = state.model_copy(update={"config": {**state.config, "metric": None, "label_free": True}})
    assert score_axis_label(label_free) == "preference over the start (%, 50 = as good)"
    figure = build_trajectory_figure(label_free)
    assert figure.axes[0].get_title() == "OPRO: preference over the start by step"
    assert "best preference so far" in _series(figure)


def test_single_predictor_candidates_are_not_named(state: RunState) -> None:
    single = state.model_copy(update={"predictors": ["rewrite"]})
    assert "candidate" in _series(build_trajectory_figure(single))


def test_plot_trajectory_writes_a_960_by_540_png(state: RunState, tmp_path: Path) -> None:
    path = plot_trajectory(state, tmp_path / "plots" / "trajectory.png")
    assert path == tmp_path / "plots" / "trajectory.png"
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert (int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")) == (960, 540)
