"""`evinfra sim` with the closed loop of `evinfra replay`, for predicting a measured run.

The simulator's closed loop ends a session whose next call would be sent after the horizon
and, with a fixed concurrency, starts a new session in its place at once
(`Simulation._end_session`). `evinfra replay` keeps such a session: it waits out the think
time and is then stopped by `--max-duration-s`. A coding session whose next call comes
after a 40 s human wait is replaced in the simulator from t = 0.4 s of a 20 s run, so the
simulator sees more sessions active, more uncached first prompts, and more load than the
measured run had. This variant leaves the slot empty, as the client does; everything else
is the stock simulator.

    python sim_matched.py --config CONFIG.yaml --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from evinfra.sim.config import load_config
from evinfra.sim.metrics import summarize
from evinfra.sim.runner import build_simulation
from evinfra.sim.sessions import SessionRun
from evinfra.sim.simulation import Simulation


class ReplayMatchedSimulation(Simulation):
    """A top-level session cut by the horizon is not replaced (the replay client's slot
    stays taken until the run stops)."""

    def _end_session(self, run: SessionRun, finished: bool) -> None:
        if finished or run.parent is not None or self.workload.concurrency is None:
            super()._end_session(run, finished)
            return
        self._active_by_kind[run.kind] -= 1
        self._num_active_sessions -= 1


def run_matched(config_path: Path) -> dict[str, Any]:
    cfg = load_config(config_path, {})
    sim, _ = build_simulation(cfg)
    sim.__class__ = ReplayMatchedSimulation  # same state, one method differs
    metrics = sim.run()
    summary: dict[str, Any] = {"system": cfg.system}
    summary.update(
        summarize(metrics, warmup_s=cfg.warmup_s, end_s=cfg.duration_s, num_gpus=cfg.num_gpus)
    )
    summary["role_switches"] = metrics.role_switches
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args(argv)
    summary = run_matched(args.config)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
