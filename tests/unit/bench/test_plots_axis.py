"""The log seconds axis labels enough ticks to read a value off the plot."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest

from evinfra.bench.plots import _log_seconds_axis


@pytest.mark.parametrize(
    ("lo_s", "hi_s"),
    [(2.3, 21.0), (0.03, 0.06), (0.04, 60.0), (2.5, 8.0)],
)
def test_log_axis_labels_at_least_three_ticks_inside_the_data(lo_s: float, hi_s: float) -> None:
    fig, ax = plt.subplots()
    ax.plot([1.0, 2.0], [lo_s, hi_s])
    _log_seconds_axis(ax, "y")
    fig.canvas.draw()
    y_lo, y_hi = ax.get_ylim()
    inside = [t for t in ax.get_yticks() if y_lo <= t <= y_hi]
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    plt.close(fig)
    assert len(inside) >= 3, inside
    assert len(labels) >= 3, labels


@pytest.mark.parametrize(
    ("lo_s", "hi_s"),
    [(2.3, 21.0), (0.03, 0.06), (2.5, 8.0), (0.5, 40.0)],
)
def test_log_axis_labels_a_tick_near_the_lowest_value(lo_s: float, hi_s: float) -> None:
    """Over up to two decades the lowest point can be read: a labelled tick within 2x."""
    fig, ax = plt.subplots()
    ax.plot([1.0, 2.0], [lo_s, hi_s])
    _log_seconds_axis(ax, "y")
    fig.canvas.draw()
    y_lo, y_hi = ax.get_ylim()
    labelled = [
        t.get_position()[1]
        for t in ax.get_yticklabels()
        if t.get_text() and y_lo <= t.get_position()[1] <= y_hi
    ]
    plt.close(fig)
    assert any(v <= 2 * lo_s for v in labelled), labelled
