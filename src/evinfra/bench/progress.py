"""Progress of the runs in flight: a long run (25-50 minutes at 256 GPUs) reports how far
its simulated clock has got, not only when it ends.

A run in a worker process writes its simulated time to a small file in its run folder at
most every `every_s` of wall time (`ProgressFile`, picklable, so it travels with the run);
the parent reads those files when no run has finished for a while and prints one line for
all of them (`running_line`). A run in the parent process (`--jobs 1`) prints the same line
itself (`InlineProgress`)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

PROGRESS_FILE = "progress.json"


def fmt_duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, sec = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


@dataclass(frozen=True, slots=True)
class RunProgress:
    run_id: str
    sim_s: float
    end_s: float
    """Where the run's simulated clock stops: its duration plus its drain."""
    wall_s: float

    def describe(self) -> str:
        pct = 100.0 * min(self.sim_s / self.end_s, 1.0) if self.end_s > 0 else 0.0
        return (
            f"{self.run_id} {self.sim_s:,.0f}/{self.end_s:,.0f} simulated s ({pct:.0f}%,"
            f" {fmt_duration(self.wall_s)})"
        )


def running_line(runs: Iterable[RunProgress], elapsed_s: float) -> str:
    """One line for the runs in flight, e.g. `... running: a 612/1,740 simulated s (35%,
    9m12s); b 80/1,740 simulated s (5%, 1m02s) (elapsed 21m40s)`."""
    parts = [r.describe() for r in runs]
    body = "; ".join(parts) if parts else "starting"
    return f"... running: {body} (elapsed {fmt_duration(elapsed_s)})"


class _ProgressHook:
    """The simulator's progress hook for one run: hands `emit` the run's progress at most
    every `every_s` of wall time (the first time at once when `at_once`, else after
    `every_s`). Its wall time counts from the simulator's first call, not from when the
    hook was made: a run handed to a busy worker pool waits there first."""

    def __init__(self, run_id: str, end_s: float, every_s: float, *, at_once: bool) -> None:
        self.run_id = run_id
        self.end_s = end_s
        self.every_s = every_s
        self.at_once = at_once
        self._start: float | None = None
        self._last = -float("inf")

    def __call__(self, sim_s: float, num_events: int) -> None:
        now = time.perf_counter()
        if self._start is None:
            self._start = now
            if not self.at_once:
                self._last = now
        if now - self._last < self.every_s:
            return
        self._last = now
        self.emit(RunProgress(self.run_id, sim_s, self.end_s, now - self._start))

    def emit(self, run: RunProgress) -> None:
        raise NotImplementedError


class ProgressFile(_ProgressHook):
    """For a run in a worker process: writes its progress to `path` (replacing the file
    whole, so a reader never sees half of one), the first time at once."""

    def __init__(self, path: Path, run_id: str, end_s: float, every_s: float) -> None:
        super().__init__(run_id, end_s, every_s, at_once=True)
        self.path = path

    def emit(self, run: RunProgress) -> None:
        tmp = self.path.with_suffix(".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(asdict(run)))
            os.replace(tmp, self.path)
        except OSError:  # progress is a courtesy: never fail a run for it
            pass


def read_progress(path: Path) -> RunProgress | None:
    """What a run's `ProgressFile` last wrote; None before its first write."""
    try:
        return RunProgress(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


class InlineProgress(_ProgressHook):
    """For a run in the parent process (`--jobs 1`): logs `running_line` for it, the first
    time after `every_s`."""

    def __init__(
        self,
        log: Callable[[str], None],
        run_id: str,
        end_s: float,
        every_s: float,
        elapsed_s: Callable[[], float],
    ) -> None:
        super().__init__(run_id, end_s, every_s, at_once=False)
        self.log = log
        self.elapsed_s = elapsed_s

    def emit(self, run: RunProgress) -> None:
        self.log(running_line([run], self.elapsed_s()))
