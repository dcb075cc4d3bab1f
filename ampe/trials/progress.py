"""Progress display of a trial run: trial i of k, the budget left, and the current iteration.

On a terminal a rich live bar is redrawn in place; otherwise (a pipe, a CI log) one plain line is printed per event
and nothing is redrawn, so logs stay readable. Both write to stderr, keeping stdout for the results table.
"""

from __future__ import annotations

import sys
from typing import IO, TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rich.progress import TaskID

from ampe.formats.trial import TrialResult
from ampe.units import si


class ProgressView(Protocol):
    """What the runner reports while it works."""

    def start_trial(self, index: int, total: int, trial_id: str, label: str, budget_left_s: float | None) -> None:
        """Trial ``index`` (1-based) of ``total`` starts."""

    def iteration(self, done: int, of: int, elapsed_s: float) -> None:
        """The worker reported iteration ``done`` of ``of``."""

    def end_trial(self, result: TrialResult, cached: bool = False) -> None:
        """A trial finished (or was found finished in the results folder when ``cached``)."""

    def close(self) -> None:
        """The run is over."""


class SilentView:
    """Shows nothing (library use, tests)."""

    def start_trial(self, index: int, total: int, trial_id: str, label: str, budget_left_s: float | None) -> None:
        pass

    def iteration(self, done: int, of: int, elapsed_s: float) -> None:
        pass

    def end_trial(self, result: TrialResult, cached: bool = False) -> None:
        pass

    def close(self) -> None:
        pass


class LineView:
    """One line per event, for logs and pipes (no cursor movement)."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stderr
        self._last_iter = -1

    def _say(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def start_trial(self, index: int, total: int, trial_id: str, label: str, budget_left_s: float | None) -> None:
        self._last_iter = -1
        budget = "" if budget_left_s is None else f", budget left {budget_left_s:.0f} s"
        self._say(f"trial {index}/{total} {trial_id} ({label}) starting{budget}")

    def iteration(self, done: int, of: int, elapsed_s: float) -> None:
        if done != self._last_iter and (done == of or done % max(1, of // 4) == 0):
            self._say(f"  iteration {done}/{of} ({elapsed_s:.1f} s)")
        self._last_iter = done

    def end_trial(self, result: TrialResult, cached: bool = False) -> None:
        self._say(f"  {describe(result, cached)}")

    def close(self) -> None:
        pass


class RichView:
    """A live progress bar on a terminal."""

    def __init__(self, console) -> None:  # console: rich.console.Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = console
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[status]}"),
                                 TimeElapsedColumn(), console=console, transient=True)
        self.progress.start()
        self.task: TaskID | None = None
        self.budget: float | None = None

    def start_trial(self, index: int, total: int, trial_id: str, label: str, budget_left_s: float | None) -> None:
        self.budget = budget_left_s
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task(f"trial {index}/{total} {label}", total=None,
                                           status=self._status("starting", 0.0))

    def iteration(self, done: int, of: int, elapsed_s: float) -> None:
        if self.task is not None:
            self.progress.update(self.task, total=of, completed=done,
                                 status=self._status(f"iteration {done}/{of}", elapsed_s))

    def _status(self, what: str, elapsed_s: float) -> str:
        if self.budget is None:
            return what
        return f"{what} · budget left {max(0.0, self.budget - elapsed_s):.0f} s"

    def end_trial(self, result: TrialResult, cached: bool = False) -> None:
        self.progress.console.print(describe(result, cached), markup=False, highlight=False)

    def close(self) -> None:
        self.progress.stop()


def describe(result: TrialResult, cached: bool = False) -> str:
    """One line about a finished trial."""
    where = "(already in the results folder) " if cached else ""
    if result.status == "ok":
        energy = ""
        if result.energy_j_per_iter is not None:
            energy = f", {si(result.energy_j_per_iter, 'J')}/iter ({result.energy_source})"
        std = f" ± {result.iteration_s_std:.4f}" if result.iteration_s_std is not None else ""
        pred = (f" (predicted {result.predicted_iteration_s:.4f} s)" if result.predicted_iteration_s else "")
        return f"{result.trial_id}: {where}ok {result.iteration_s_mean:.4f}{std} s/iter{pred}{energy}"
    return f"{result.trial_id}: {where}{result.status}: {result.reason}"


def make_view(kind: str = "auto", stream: IO[str] | None = None) -> ProgressView:
    """``auto``: rich on a terminal, plain lines otherwise; ``plain``; ``none``."""
    if kind == "none":
        return SilentView()
    stream = stream or sys.stderr
    if kind == "auto":
        from rich.console import Console

        console = Console(file=stream)
        if console.is_terminal:
            return RichView(console)
    return LineView(stream)

