"""Running a benchmark's simulator runs: in worker processes (`--jobs`), each finished run
reported with an ETA, a failed run recorded without stopping the others, stored runs
reused (`--resume`)."""

from __future__ import annotations

import ctypes
import functools
import gc
import time
import traceback
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from evinfra.bench.progress import (
    PROGRESS_FILE,
    InlineProgress,
    ProgressFile,
    fmt_duration,
    read_progress,
    running_line,
)
from evinfra.bench.scenario import RunSpec
from evinfra.bench.store import load_summary, run_dir, save_error, save_run
from evinfra.sim.runner import run_sim
from evinfra.sim.simulation import Progress

Log = Callable[[str], None]
K = TypeVar("K")


@dataclass(frozen=True, slots=True)
class RunOutcome:
    run_id: str
    summary: dict[str, Any] | None
    error: str | None
    wall_s: float
    reused: bool = False

    @property
    def ok(self) -> bool:
        return self.summary is not None


def execute_run(spec: RunSpec, out: str, progress: Progress | None = None) -> RunOutcome:
    """Run one simulation and store it under `out`; an exception becomes the outcome's error
    (and error.json), so one bad run does not take the benchmark down. `progress` is the
    simulator's progress hook (`bench/progress.py`); its file, if it wrote one, is removed
    when the run ends."""
    start = time.perf_counter()
    try:
        result = run_sim(spec.config, progress)
        save_run(Path(out), spec.run_id, result)
        summary = result.summary
        del result
    except Exception as exc:  # any failure of one run is reported, not raised
        tb = traceback.format_exc(limit=6)
        error = f"{type(exc).__name__}: {exc}\n{tb}"
        save_error(Path(out), spec.run_id, spec.config, error)
        return RunOutcome(spec.run_id, None, error, time.perf_counter() - start)
    finally:
        (run_dir(Path(out), spec.run_id) / PROGRESS_FILE).unlink(missing_ok=True)
        release_freed_memory()
    return RunOutcome(spec.run_id, summary, None, time.perf_counter() - start)


def release_freed_memory() -> None:
    """Give the memory a finished run freed back to the system: a garbage collection, then
    glibc's `malloc_trim`. Without it a process that runs one simulation after another
    (`--jobs 1`, or a worker process) keeps about half of its largest run's memory: two
    goodput searches at 128 GPUs held 10.7 and 13.4 GB after their overloaded runs ended,
    and a 1,200 s GLM-5 run at 64 GPUs 979 MB of its 1,950 MB after `gc.collect()`, 425 MB
    after the trim. Where there is no glibc, the collection alone."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        fn: Callable[[int], int] = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    return fn


class BenchExecutor:
    """Runs batches of RunSpecs; remembers every outcome by run id.

    `planned_work` (sum of RunSpec.work of everything the benchmark expects to run) makes
    the ETA cover later batches too (goodput bisection); it grows if a batch exceeds it.
    """

    def __init__(
        self,
        out: Path,
        *,
        jobs: int = 1,
        resume: bool = False,
        log: Log,
        progress_every_s: float = 60.0,
    ) -> None:
        if jobs < 1:
            raise ValueError(f"jobs must be >= 1, got {jobs}")
        if progress_every_s <= 0:
            raise ValueError(f"progress_every_s must be > 0, got {progress_every_s}")
        self.progress_every_s = progress_every_s
        """While no run finishes, how often a line tells how far the runs in flight are."""
        self.out = out
        self.jobs = jobs
        self.resume = resume
        self.log = log
        self.outcomes: dict[str, RunOutcome] = {}
        self.planned_work = 0.0
        self._done_work = 0.0
        self._started_work = 0.0
        self._run_work = 0.0
        self._run_wall_s = 0.0
        self._num_done = 0
        self._num_planned = 0
        self._start = time.perf_counter()
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> BenchExecutor:
        if self.jobs > 1:
            self._pool = ProcessPoolExecutor(max_workers=self.jobs)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=exc_type is None, cancel_futures=True)
            self._pool = None

    def plan(self, specs: Iterable[RunSpec]) -> None:
        """Add runs expected later to the ETA."""
        for s in specs:
            self.planned_work += s.work
            self._num_planned += 1

    def run(self, specs: list[RunSpec]) -> dict[str, RunOutcome]:
        """Outcomes of `specs` (already known ones are not run twice)."""
        self.run_chains({None: specs}, lambda _: [])
        return {s.run_id: self.outcomes[s.run_id] for s in specs}

    def run_chains(
        self, first: Mapping[K, list[RunSpec]], then: Callable[[K], list[RunSpec]]
    ) -> None:
        """Chains of dependent batches, side by side: when every run of a key's batch has
        its outcome (in `outcomes`), `then(key)` gives that key's next batch (empty: its
        chain ends), which starts at once, without waiting for the other keys' batches.
        So a goodput search per system keeps the worker processes busy, instead of each
        round waiting for its slowest system. Without worker processes the runs go one by
        one, in the order they are asked for."""
        waiting: dict[K, list[str]] = {}
        queue: deque[RunSpec] = deque()
        futures: dict[Future[RunOutcome], RunSpec] = {}
        started: set[str] = set()

        def begin(key: K, batch: list[RunSpec]) -> None:
            if not batch:
                return
            waiting[key] = [s.run_id for s in batch]
            new = {
                s.run_id: s
                for s in batch
                if s.run_id not in self.outcomes and s.run_id not in started
            }.values()
            self._expect(new)
            for spec in new:
                stored = load_summary(self.out, spec.run_id, spec.config) if self.resume else None
                if stored is not None:
                    self._finish(spec, RunOutcome(spec.run_id, stored, None, 0.0, reused=True))
                    continue
                started.add(spec.run_id)
                if self._pool is None:
                    queue.append(spec)
                else:
                    hook = ProgressFile(
                        self._progress_path(spec),
                        spec.run_id,
                        spec.end_s,
                        min(10.0, self.progress_every_s / 2),
                    )
                    futures[self._pool.submit(execute_run, spec, str(self.out), hook)] = spec

        for key, batch in first.items():
            begin(key, batch)
        while waiting:
            ready = [k for k, ids in waiting.items() if all(i in self.outcomes for i in ids)]
            for key in ready:
                del waiting[key]
                begin(key, then(key))
            if ready:
                continue
            if futures:
                done, _ = wait(futures, self.progress_every_s, FIRST_COMPLETED)
                if not done:
                    self._log_running(futures.values())
                for fut in done:
                    spec = futures.pop(fut)
                    started.discard(spec.run_id)
                    self._finish(spec, self._collect(fut, spec))
            else:
                spec = queue.popleft()  # not empty: a waiting run is queued or running
                started.discard(spec.run_id)
                inline = InlineProgress(
                    self.log, spec.run_id, spec.end_s, self.progress_every_s, self._elapsed_s
                )
                self._finish(spec, execute_run(spec, str(self.out), inline))

    def _elapsed_s(self) -> float:
        return time.perf_counter() - self._start

    def _progress_path(self, spec: RunSpec) -> Path:
        return run_dir(self.out, spec.run_id) / PROGRESS_FILE

    def _log_running(self, specs: Iterable[RunSpec]) -> None:
        """One line for the runs in flight that have reported (queued ones have not)."""
        runs = [p for p in map(read_progress, map(self._progress_path, specs)) if p is not None]
        self.log(running_line(runs, self._elapsed_s()))

    def _expect(self, specs: Collection[RunSpec]) -> None:
        """Runs about to start count in the progress line and the ETA."""
        self._num_planned = max(self._num_planned, self._num_done + len(specs))
        self._started_work += sum(s.work for s in specs)
        self.planned_work = max(self.planned_work, self._started_work)

    def _collect(self, fut: Future[RunOutcome], spec: RunSpec) -> RunOutcome:
        try:
            return fut.result()
        except Exception as exc:  # a dead worker fails its run only
            error = f"worker failed: {type(exc).__name__}: {exc}"
            save_error(self.out, spec.run_id, spec.config, error)
            return RunOutcome(spec.run_id, None, error, 0.0)

    def _finish(self, spec: RunSpec, outcome: RunOutcome) -> None:
        self.outcomes[spec.run_id] = outcome
        self._num_done += 1
        self._done_work += spec.work
        self.planned_work = max(self.planned_work, self._done_work)
        self._num_planned = max(self._num_planned, self._num_done)
        if not outcome.reused:
            self._run_work += spec.work
            self._run_wall_s += outcome.wall_s
        self.log(self._line(spec, outcome))

    def eta_s(self) -> float | None:
        """Remaining wall time: remaining work at the observed wall time per unit of work,
        shared by the worker processes."""
        if self._run_work <= 0:
            return None
        remaining = max(self.planned_work - self._done_work, 0.0)
        return remaining * (self._run_wall_s / self._run_work) / self.jobs

    def _line(self, spec: RunSpec, outcome: RunOutcome) -> str:
        head = f"[{self._num_done}/{self._num_planned}] {spec.run_id}"
        if outcome.summary is None:
            first = (outcome.error or "").splitlines()[0] if outcome.error else "?"
            body = f"FAILED: {first}"
        else:
            s = outcome.summary
            how = "stored" if outcome.reused else f"{outcome.wall_s:.1f}s"
            body = (
                f"{how}: mean e2e {s.get('mean_e2e_s', float('nan')):.3f}s,"
                f" p95 TTFT {s.get('p95_ttft_s', float('nan')):.3f}s,"
                f" {s.get('num_requests', 0)} requests"
            )
            if s.get("stopped_s") is not None:
                body += f"; stopped at {s['stopped_s']:.0f} s, certain to fail (figures to then)"
        elapsed = time.perf_counter() - self._start
        eta = self.eta_s()
        tail = f"elapsed {fmt_duration(elapsed)}"
        if eta is not None:
            tail += f", ETA {fmt_duration(eta)}"
        return f"{head} {body} ({tail})"
