"""The log seconds axis labels enough ticks to read a value off the plot."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest

from evinfra.bench.plots import _log_seconds_axis


def _labelled_ticks(lo_s: float, hi_s: float) -> tuple[list[float], list[float]]:
    """Plot a line from `lo_s` to `hi_s` on the log seconds y axis; return the tick values
    inside the axis' range and the positions of the labelled ones among them."""
    fig, ax = plt.subplots()
    ax.plot([1.0, 2.0], [lo_s, hi_s])
    _log_seconds_axis(ax, "y")
    fig.canvas.draw()
    y_lo, y_hi = ax.get_ylim()
    inside = [t for t in ax.get_yticks() if y_lo <= t <= y_hi]
    labelled = [
        t.get_position()[1]
        for t in ax.get_yticklabels()
        if t.get_text() and y_lo <= t.get_position()[1] <= y_hi
    ]
    plt.close(fig)
    return inside, labelled


@pytest.mark.parametrize(
    ("lo_s", "hi_s"),
    [(2.3, 21.0), (0.03, 0.06), (0.04, 60.0), (2.5, 8.0)],
)
def test_log_axis_labels_at_least_three_ticks_inside_the_data(lo_s: float, hi_s: float) -> None:
    inside, labelled = _labelled_ticks(lo_s, hi_s)
    assert len(inside) >= 3, inside
    assert len(labelled) >= 3, labelled


@pytest.mark.parametrize(
    ("lo_s", "hi_s"),
    [(2.3, 21.0), (0.03, 0.06), (2.5, 8.0), (0.5, 40.0)],
)
def test_log_axis_labels_a_tick_near_the_lowest_value(lo_s: float, hi_s: float) -> None:
    """Over up to two decades the lowest point can be read: a labelled tick within 2x."""
    _, labelled = _labelled_ticks(lo_s, hi_s)
    assert any(v <= 2 * lo_s for v in labelled), labelled
