"""Pictures, as PNG files (matplotlib, Agg backend): readable without a terminal, axes labelled with units, titled.

* :func:`frontier_plot` — iteration time against energy along one pipeline's frontier, chosen point marked;
* :func:`timeline_plot` — Gantt chart of one iteration: a row per stage (named with its GPU type when known), bars
  coloured by SM clock (as % of each stage's GPU type's maximum when types are known, else in MHz), backward
  passes hatched, transfers as lines between rows, the critical path outlined in red;
* :func:`strategies_plot` — strategies' iteration time against energy, the Pareto set marked and joined;
* :func:`predicted_vs_measured_plot` — the trial report's scatter with the y = x line.

Inputs are plain values (tuples, small dataclasses from :mod:`ampe.energy.timeline`); nothing here computes a plan.
Energy axes are scaled to one SI prefix (J, kJ, MJ: :func:`ampe.units.si_scale`) and say whether the energy is
modelled or measured (the caller's label). Point labels are placed so that they do not cover one another or a point
(:func:`place_labels`). Each ``*_plot`` draws with a ``*_figure`` builder, which tests inspect through matplotlib's
objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DPI = 100


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _title(ax: Any, text: str) -> None:
    """A title wrapped to the axes' width (long strategy labels stay readable)."""
    import textwrap

    width = max(40, int(ax.figure.get_figwidth() * 11))
    ax.set_title("\n".join(textwrap.fill(line, width) for line in text.splitlines()), fontsize=10)


def _save(fig: Any, path: str | Path) -> None:
    """Render the figure in the format its file name says (PNG when it names none) and write it atomically."""
    import io

    from ampe.io import PICTURE_SUFFIXES, write_bytes_atomic

    suffix = Path(path).suffix.lower()
    buf = io.BytesIO()
    fig.savefig(buf, dpi=DPI, format=suffix[1:] if suffix in PICTURE_SUFFIXES else "png")
    _pyplot().close(fig)
    write_bytes_atomic(path, buf.getvalue())


# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FrontierView:
    """The time range a frontier plot shows (s): ``clipped`` when it ends before T* (the slowest point)."""

    lo_s: float
    hi_s: float
    t_star_s: float
    energy_min_s: float  # where the energy (nearly) stops decreasing

    @property
    def clipped(self) -> bool:
        return self.hi_s < self.t_star_s


FLAT_SHARE = 0.005  # energy within 0.5 % of the frontier's energy range above its minimum counts as "stopped"
PAD_SHARE = 0.3  # shown beyond that point: 30 % of the span from T_min to it


def frontier_view(points: Sequence[tuple[float, float]], keep: Sequence[float] = ()) -> FrontierView:
    """The useful part of a frontier (time s, energy J; fastest first): from T_min to a little beyond the first point
    where the energy stops decreasing (within :data:`FLAT_SHARE` of the range above the minimum), past which every
    point is slower *and* costs more (waiting at blocking power), plus :data:`PAD_SHARE` of that span; never cutting
    off a time in ``keep`` (the chosen and all-max points)."""
    times = [p[0] for p in points]
    energies = [p[1] for p in points]
    lo, t_star = min(times), max(times)
    e_min, e_max = min(energies), max(energies)
    flat = next(t for t, e in zip(times, energies, strict=True) if e <= e_min + FLAT_SHARE * (e_max - e_min))
    hi = max(flat + PAD_SHARE * (flat - lo), lo * 1.05, *keep)
    return FrontierView(lo, min(hi, t_star), t_star, flat)


def frontier_figure(points: Sequence[tuple[float, float]], chosen: tuple[float, float],
                    all_max: tuple[float, float], title: str, energy_label: str = "energy per iteration") -> Any:
    """The frontier plot's figure (see :func:`frontier_plot`)."""
    from ampe.units import si_scale

    plt = _pyplot()
    view = frontier_view(points, (chosen[0], all_max[0]))
    shown = [p for p in points if p[0] <= view.hi_s]
    scale, unit = si_scale([p[1] for p in shown] + [chosen[1], all_max[1]], "J")
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    ax.plot([p[0] for p in shown], [p[1] / scale for p in shown], ".-", ms=3, lw=1, label="frontier (ampe)")
    ax.plot([all_max[0]], [all_max[1] / scale], "s", color="tab:gray", label="all clocks max")
    ax.plot([chosen[0]], [chosen[1] / scale], "*", ms=14, color="tab:red", label="chosen point")
    ax.set_ylabel(f"{energy_label} ({unit})")
    if view.clipped:  # said under the axis, where no point can be
        pad = 0.02 * (view.hi_s - view.lo_s)
        ax.set_xlim(view.lo_s - pad, view.hi_s + pad)
        ax.set_xlabel(f"iteration time (s), shown to {view.hi_s:.4g} s\n(beyond, up to T* = {view.t_star_s:.4g} s, "
                      "every point is slower and costlier)")
    else:
        ax.set_xlabel("iteration time (s)")
    _title(ax, title)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    return fig


def frontier_plot(path: str | Path, points: Sequence[tuple[float, float]], chosen: tuple[float, float],
                  all_max: tuple[float, float], title: str, energy_label: str = "energy per iteration") -> FrontierView:
    """Frontier points (iteration time s, energy J), the all-max point and the chosen point; the time axis shows
    :func:`frontier_view`'s useful range (and says so when it ends before T*). ``energy_label`` names the y axis
    without a unit (the SI unit is appended). Returns the range shown."""
    _save(frontier_figure(points, chosen, all_max, title, energy_label), path)
    return frontier_view(points, (chosen[0], all_max[0]))


def timeline_plot(path: str | Path, timeline: Any, title: str, clock_range_mhz: tuple[float, float] | None = None,
                  ) -> None:
    """Gantt chart of a :class:`ampe.energy.timeline.ClockTimeline` (seconds on x, one row per stage)."""
    import matplotlib.colors as mcolors
    from matplotlib.cm import ScalarMappable
    from matplotlib.collections import LineCollection
    from matplotlib.patches import Patch

    plt = _pyplot()
    comps = [b for b in timeline.bars if b.mhz is not None]
    transfers = [b for b in timeline.bars if b.mhz is None]
    types = tuple(getattr(timeline, "stage_types", ()))
    if types:  # each GPU type against its own maximum clock: full speed looks the same on an A100 and a V100
        value = {id(b): 100.0 * timeline.clock_share(b) for b in comps}
        shares = list(value.values()) or [100.0]
        lo, hi = min(shares), 100.0
    else:
        value = {id(b): float(b.mhz) for b in comps}
        clocks = list(value.values()) or [1.0]
        lo, hi = clock_range_mhz or (min(clocks), max(clocks))
    if hi <= lo:
        lo, hi = lo - 1.0, hi + 1.0
    norm = mcolors.Normalize(vmin=lo, vmax=hi)
    cmap = plt.get_cmap("viridis")
    n = timeline.num_stages
    fig, ax = plt.subplots(figsize=(min(16.0, 7.0 + 0.1 * len(comps) / max(n, 1)), 2.6 + 0.6 * n))
    height = 0.6
    label_bars = len(comps) <= 160
    for hatched in (False, True):
        group = [b for b in comps if (b.kind == "backward") == hatched]
        if group:
            ax.barh([b.stage for b in group], [b.duration_s for b in group], left=[b.start_s for b in group],
                    height=height, color=[cmap(norm(value[id(b)])) for b in group], edgecolor="black", linewidth=0.4,
                    hatch="///" if hatched else None, zorder=2)
    critical = [b for b in comps if b.critical]
    if critical:
        ax.barh([b.stage for b in critical], [b.duration_s for b in critical], left=[b.start_s for b in critical],
                height=height, facecolor="none", edgecolor="tab:red", linewidth=2.0, zorder=3)
    if label_bars:
        for b in comps:
            ax.text(b.start_s + b.duration_s / 2, b.stage, f"{b.kind[0].upper()}{b.microbatch}", ha="center",
                    va="center", fontsize=6, color="white" if norm(value[id(b)]) < 0.55 else "black", zorder=4)
    segs, colors, widths = [], [], []
    for b in transfers:
        if b.to_stage is None:
            continue
        y0 = b.stage + (height / 2 if b.to_stage > b.stage else -height / 2)
        y1 = b.to_stage + (-height / 2 if b.to_stage > b.stage else height / 2)
        segs.append([(b.start_s, y0), (b.start_s + b.duration_s, y1)])
        colors.append("tab:red" if b.critical else "0.45")
        widths.append(1.6 if b.critical else 0.7)
    if segs:
        ax.add_collection(LineCollection(segs, colors=colors, linewidths=widths, zorder=1))
    ax.set_yticks(range(n))
    ax.set_yticklabels([f"stage {s}" + (f"\n{types[s][0]}" if types else "") for s in range(n)])
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_xlim(0, timeline.makespan_s * 1.01 if timeline.makespan_s > 0 else 1.0)
    ax.set_xlabel("time within the iteration (s)")
    ax.set_ylabel("pipeline stage")
    _title(ax, title)
    ax.grid(axis="x", alpha=0.3)
    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, pad=0.01)
    if types:
        maxima = ", ".join(f"{name} {mhz:g}" for name, mhz in dict(types).items())
        bar.set_label(f"SM clock, % of the stage's GPU maximum\n({maxima} MHz)")
    else:
        bar.set_label("SM clock (MHz)")
    handles = [Patch(facecolor="white", edgecolor="black", label="forward (F<mb>)"),
               Patch(facecolor="white", edgecolor="black", hatch="///", label="backward (B<mb>)"),
               Patch(facecolor="white", edgecolor="tab:red", linewidth=2, label="critical path"),
               Patch(facecolor="0.45", label="transfer (line between stages)")]
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    _save(fig, path)


@dataclass(frozen=True)
class StrategyMark:
    """One strategy on the strategies plot: its label, chosen point and all-max point (s, J), Pareto flag."""

    label: str
    time_s: float
    energy_j: float
    max_clock_time_s: float
    max_clock_energy_j: float
    pareto: bool


def strategies_figure(marks: Sequence[StrategyMark], title: str, bound_s: float | None = None,
                      energy_label: str = "energy per iteration, all devices") -> Any:
    """The strategies plot's figure (see :func:`strategies_plot`)."""
    from ampe.units import si_scale

    plt = _pyplot()
    scale, unit = si_scale([v for m in marks for v in (m.energy_j, m.max_clock_energy_j)], "J")
    fig, ax = plt.subplots(figsize=(7.2, 5.2))
    for m in marks:
        ax.annotate("", xy=(m.time_s, m.energy_j / scale), xytext=(m.max_clock_time_s, m.max_clock_energy_j / scale),
                    arrowprops={"arrowstyle": "->", "color": "0.6", "lw": 0.8})
    ax.scatter([m.max_clock_time_s for m in marks], [m.max_clock_energy_j / scale for m in marks], facecolors="none",
               edgecolors="0.5", s=30, label="all clocks max")
    rest = [m for m in marks if not m.pareto]
    front = sorted((m for m in marks if m.pareto), key=lambda m: m.time_s)
    if rest:
        ax.scatter([m.time_s for m in rest], [m.energy_j / scale for m in rest], color="tab:blue", s=30,
                   label="chosen point (dominated)", zorder=3)
    if front:
        ax.plot([m.time_s for m in front], [m.energy_j / scale for m in front], "-", color="tab:red", lw=1, zorder=3,
                drawstyle="steps-post")
        ax.scatter([m.time_s for m in front], [m.energy_j / scale for m in front], marker="*", color="tab:red", s=140,
                   label="Pareto set (time vs energy)", zorder=4)
    if bound_s is not None:
        ax.axvline(bound_s, color="tab:green", ls="--", lw=1, label="slowdown bound")
    ax.set_xlabel("iteration time (s)")
    ax.set_ylabel(f"{energy_label} ({unit})")
    _title(ax, title)
    ax.grid(alpha=0.3)
    ax.margins(0.08, 0.12)  # room for the labels at the edges
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    avoid = [(m.max_clock_time_s, m.max_clock_energy_j / scale) for m in marks]
    place_labels(ax, [(m.label, m.time_s, m.energy_j / scale) for m in marks], fontsize=7, avoid=avoid)
    return fig


def strategies_plot(path: str | Path, marks: Sequence[StrategyMark], title: str, bound_s: float | None = None,
                    energy_label: str = "energy per iteration, all devices") -> None:
    """Each strategy's chosen point (and, hollow, its all-max point); the Pareto set marked and joined; labels
    placed apart. ``energy_label`` names the y axis without a unit (say "modelled" or "measured" in it)."""
    _save(strategies_figure(marks, title, bound_s, energy_label), path)


# Where a label may go around its point (points right/up of it), nearest first; far ones get a leader line.
LABEL_OFFSETS = ((5, 4), (5, -11), (-5, 4), (-5, -11), (5, 15), (-5, 15), (5, -22), (-5, -22), (14, 26),
                 (-14, 26), (14, -33), (-14, -33), (24, 38), (-24, 38), (24, -45), (-24, -45))


def place_labels(ax: Any, items: Sequence[tuple[str, float, float]], fontsize: float = 7,
                 avoid: Sequence[tuple[float, float]] = ()) -> list[Any]:
    """Annotate each ``(label, x, y)`` (data coordinates) at the first of :data:`LABEL_OFFSETS` where its text
    stays inside the axes and covers no label placed before it and no point (``items`` and ``avoid``); where every
    offset collides, the one with the fewest collisions (leaving the axes counts two). Call after the axes' limits
    and layout are final. Returns the annotations."""
    fig = ax.figure
    fig.canvas.draw()  # fixes the limits and the layout the display coordinates depend on
    renderer = fig.canvas.get_renderer()
    points = ax.transData.transform([(x, y) for _, x, y in items] + list(avoid)) if items or avoid else []
    frame = ax.get_window_extent(renderer)
    placed: list[Any] = []
    boxes: list[Any] = []
    for label, x, y in items:
        best: Any = None
        best_box: Any = None
        best_hits: int | None = None
        for dx, dy in LABEL_OFFSETS:
            far = abs(dy) > 15
            note = ax.annotate(label, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=fontsize,
                               ha="left" if dx >= 0 else "right", va="bottom" if dy >= 0 else "top",
                               arrowprops={"arrowstyle": "-", "color": "0.6", "lw": 0.5} if far else None)
            box = note.get_window_extent(renderer).padded(1)
            hits = (sum(box.overlaps(b) for b in boxes) + sum(bool(box.contains(px, py)) for px, py in points)
                    + 2 * (box.x0 < frame.x0 or box.x1 > frame.x1 or box.y0 < frame.y0 or box.y1 > frame.y1))
            if best_hits is None or hits < best_hits:
                if best is not None:
                    best.remove()
                best, best_hits, best_box = note, hits, box
            else:
                note.remove()
            if hits == 0:
                break
        placed.append(best)
        boxes.append(best_box)
    return placed


@dataclass(frozen=True)
class MeasuredPoint:
    """One trial on the predicted-vs-measured plot (seconds)."""

    predicted_s: float
    measured_s: float
    label: str
    scheduled: bool


def predicted_vs_measured_figure(points: Sequence[MeasuredPoint], title: str) -> Any:
    """The predicted-vs-measured plot's figure (see :func:`predicted_vs_measured_plot`)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 6.4))
    plain = [p for p in points if not p.scheduled]
    sched = [p for p in points if p.scheduled]
    for group, marker, name in ((plain, "o", "without frequency schedule"), (sched, "^", "with frequency schedule")):
        if group:
            ax.scatter([p.predicted_s for p in group], [p.measured_s for p in group], marker=marker, label=name,
                       zorder=3)
    vals = [v for p in points for v in (p.predicted_s, p.measured_s)]
    if vals:
        lo, hi = min(vals), max(vals)
        if hi / lo > 20:
            ax.set_xscale("log")
            ax.set_yscale("log")
            lo, hi = lo / 1.3, hi * 1.3
        else:
            pad = (hi - lo) * 0.08 or hi * 0.1
            lo, hi = max(0.0, lo - pad), hi + pad
        ax.plot([lo, hi], [lo, hi], "k--", linewidth=1, label="y = x (perfect prediction)", zorder=2)
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        # below the axes, never over a point
        fig.legend(*ax.get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=8, frameon=False)
    else:
        ax.text(0.5, 0.5, "no measured trials", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("predicted iteration time (s)")
    ax.set_ylabel("measured iteration time (s)")
    _title(ax, title)
    ax.grid(True, alpha=0.3)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    place_labels(ax, [(p.label, p.predicted_s, p.measured_s) for p in points], fontsize=8)
    return fig


def predicted_vs_measured_plot(path: str | Path, points: Sequence[MeasuredPoint], title: str) -> None:
    """Predicted (x) against measured (y) iteration time, the y = x line, labelled points; scheduled runs as
    triangles; log axes when the values span more than 20×; the legend below the axes. A 640×640 PNG."""
    _save(predicted_vs_measured_figure(points, title), path)
