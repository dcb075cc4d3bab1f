"""Pictures read right, checked through matplotlib's own objects (no pixels): labels apart, the legend off the
points, the frontier's useful range, and energy axes that say modelled or measured, in SI units."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from ampe.viz import (
    MeasuredPoint,
    StrategyMark,
    frontier_figure,
    frontier_view,
    predicted_vs_measured_figure,
    strategies_figure,
)


def _boxes(fig, artists):
    renderer = fig.canvas.get_renderer()
    return [a.get_window_extent(renderer) for a in artists]


def _labels(ax):
    return [t for t in ax.texts if t.get_text().startswith("#") or t.get_text().isdigit()]


def test_strategy_labels_of_nearly_equal_points_do_not_overlap():
    # the tutorial's three data-parallel strategies: equal time and energy to 1 %
    marks = [StrategyMark(f"#{k} 1/2/1 mbs{m}", 0.1009 * (1 + 0.001 * k), 2836.0 * (1 + 0.001 * k), 0.101, 2836.0,
                          k == 1) for k, m in ((1, 4), (2, 2), (3, 1))]
    marks.append(StrategyMark("#4 2/1/1 mbs2", 0.1499, 3291.0, 0.1499, 3666.0, False))
    fig = strategies_figure(marks, "t", energy_label="modelled energy per iteration, all devices")
    ax = fig.axes[0]
    labels = _labels(ax)
    assert sorted(t.get_text() for t in labels) == sorted(m.label for m in marks)
    boxes = _boxes(fig, labels)
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), [t.get_text() for t in labels]
    frame = ax.get_window_extent(fig.canvas.get_renderer())
    assert all(frame.x0 <= b.x0 and b.x1 <= frame.x1 for b in boxes)
    assert ax.get_ylabel() == "modelled energy per iteration, all devices (kJ)"
    assert max(ax.get_ylim()) < 10  # plotted in kJ, not J


def test_report_legend_covers_no_point():
    points = [MeasuredPoint(p, m, str(k), k % 2 == 0) for k, (p, m) in enumerate(
        [(0.10, 0.11), (0.12, 0.125), (0.15, 0.14), (0.16, 0.19), (0.11, 0.102)], start=1)]
    fig = predicted_vs_measured_figure(points, "t")
    ax = fig.axes[0]
    legend = fig.legends[0] if fig.legends else ax.get_legend()
    box = legend.get_window_extent(fig.canvas.get_renderer())
    for p in points:
        x, y = ax.transData.transform((p.predicted_s, p.measured_s))
        assert not box.contains(x, y), (p, box)
    labels = _labels(ax)
    assert len(labels) == len(points)
    boxes = _boxes(fig, labels)
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def _u_shaped(t_min: float = 48.0, t_emin: float = 60.0, t_star: float = 287.0, n: int = 400):
    """A frontier that falls to its energy minimum at ``t_emin`` and rises (waiting at blocking power) to T*."""
    pts = []
    for i in range(n):
        t = t_min + (t_star - t_min) * i / (n - 1)
        falling = 1.0 + 0.3 * ((t - t_emin) / (t_emin - t_min)) ** 2
        e = 1e6 * (falling if t < t_emin else 1 + 0.002 * (t - t_emin))
        pts.append((t, e))
    return pts


def test_frontier_plot_shows_the_useful_range_and_says_so():
    pts = _u_shaped()
    view = frontier_view(pts, (48.0,))
    assert view.clipped and view.t_star_s == pytest.approx(287.0)
    assert 57.0 <= view.energy_min_s <= 60.0  # where the energy stops falling (within 0.5 % of its range)
    assert 60.0 < view.hi_s < 70.0  # a little beyond it, far short of T*
    fig = frontier_figure(pts, pts[0], (48.0, 1.5e6), "t", "modelled energy per iteration")
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    assert lo < 48.0 and 60.0 < hi < 72.0
    assert "T* = 287" in ax.get_xlabel()
    assert ax.get_ylabel() == "modelled energy per iteration (MJ)"


def test_frontier_without_a_minimum_is_not_clipped_and_keeps_the_chosen_point():
    falling = [(10.0 + i, 100.0 - i) for i in range(20)]  # energy falls all the way to T*
    assert not frontier_view(falling).clipped
    pts = _u_shaped()
    assert frontier_view(pts, (200.0,)).hi_s >= 200.0  # a straggler's chosen point stays in view
