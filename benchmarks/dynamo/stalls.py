"""Per-call view of side-by-side runs: what the report's means leave out.

The report's mean end-to-end latency averages the calls that finished inside the window;
a call stranded behind a preemption (waiting at the head of its node's queue for the
whole prompt to fit again) and still running at the end is not in it, and one such call
that does finish moves a mean TPOT over ~60 calls by tens of milliseconds. Per workload
and system this prints: calls sent in the load window, finished, the report's mean e2e,
the mean e2e with every unfinished call counted from its send to the end of the replay
(a lower bound on its latency), the unfinished calls (session/turn), inter-token gaps
over `--stall-s` (how many, their total, the longest with its call), and the mean TPOT
with and without its slowest call.

    .venv/bin/python benchmarks/dynamo/stalls.py runs/sbs-X [runs/sbs-Y ...]
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class CallStats:
    num_sent: int
    num_finished: int
    mean_e2e_s: float
    mean_e2e_with_unfinished_s: float
    unfinished: tuple[str, ...]
    num_stalls: int
    stall_total_s: float
    longest_stall: tuple[float, str] | None
    """(gap seconds, session/turn of the call)."""
    mean_tpot_s: float
    mean_tpot_without_slowest_s: float


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def call_stats(
    calls: Sequence[Mapping[str, Any]], end_s: float, window_s: float, stall_s: float = 1.0
) -> CallStats:
    """Statistics of one system's calls (`evinfra replay`'s requests.jsonl rows, in send
    order) for the calls sent before `window_s`; `end_s` is when the replay stopped
    (seconds from its start, as `send_s`). Calls that failed are left out."""
    turns: dict[str, int] = {}
    names: list[str] = []
    for c in calls:
        turn = turns.get(c["session_id"], 0)
        turns[c["session_id"]] = turn + 1
        names.append(f"{c['session_id']}/{turn}")
    sent = [(n, c) for n, c in zip(names, calls, strict=True)
            if c["send_s"] < window_s and c.get("error") is None]  # fmt: skip
    done = [c for _, c in sent if c["e2e_s"] is not None]
    e2e = [float(c["e2e_s"]) for c in done]
    lower = e2e + [end_s - c["send_s"] for _, c in sent if c["e2e_s"] is None]
    gaps = [(float(g), n) for n, c in sent for g in c.get("itl_s") or () if g > stall_s]
    tpots = sorted(
        (float(c["e2e_s"]) - float(c["ttft_s"])) / (c["num_output_tokens"] - 1)
        for c in done
        if c["num_output_tokens"] > 1 and c["ttft_s"] is not None
    )
    return CallStats(
        num_sent=len(sent),
        num_finished=len(done),
        mean_e2e_s=_mean(e2e),
        mean_e2e_with_unfinished_s=_mean(lower),
        unfinished=tuple(n for n, c in sent if c["e2e_s"] is None),
        num_stalls=len(gaps),
        stall_total_s=sum(g for g, _ in gaps),
        longest_stall=max(gaps) if gaps else None,
        mean_tpot_s=_mean(tpots),
        mean_tpot_without_slowest_s=_mean(tpots[:-1]),
    )


def replay_stats(
    folder: Path, window_s: float = math.inf, stall_s: float = 1.0
) -> CallStats | None:
    """`call_stats` of one replay's output folder (`requests.jsonl`, and `summary.json`'s
    `wall_s` as the end of the replay); None where the folder has no requests.jsonl."""
    rows = folder / "requests.jsonl"
    if not rows.is_file():
        return None
    calls = [json.loads(line) for line in rows.read_text().splitlines() if line.strip()]
    end_s = float(json.loads((folder / "summary.json").read_text())["wall_s"])
    return call_stats(calls, end_s, window_s, stall_s)


def run_stats(run: Path, stall_s: float = 1.0) -> dict[str, dict[str, CallStats]]:
    """workload -> system -> stats, for a side-by-side run folder (`--out`)."""
    window_s = float(json.loads((run / "results.json").read_text())["limits"]["duration_s"])
    out: dict[str, dict[str, CallStats]] = {}
    for folder in sorted((run / "measured").glob("*/*")):
        stats = replay_stats(folder, window_s, stall_s)
        if stats is not None:
            out.setdefault(folder.parent.name, {})[folder.name] = stats
    return out


def markdown(name: str, stats: Mapping[str, Mapping[str, CallStats]], stall_s: float) -> str:
    lines = [f"### {name}", ""]
    for workload, systems in stats.items():
        lines += [f"{workload}:", "",
                  "| system | sent | finished | mean e2e (s) | with unfinished (s) "
                  f"| gaps > {stall_s:g} s | longest gap | mean TPOT (ms) | without slowest "
                  "| unfinished |",
                  "|---|---:|---:|---:|---:|---:|---|---:|---:|---|"]  # fmt: skip
        for system, s in systems.items():
            longest = "" if s.longest_stall is None else (
                f"{s.longest_stall[0]:.1f} s ({s.longest_stall[1]})")  # fmt: skip
            cells = [system, str(s.num_sent), str(s.num_finished), f"{s.mean_e2e_s:.3f}",
                     f"{s.mean_e2e_with_unfinished_s:.3f}",
                     f"{s.num_stalls} ({s.stall_total_s:.1f} s)", longest,
                     f"{s.mean_tpot_s * 1e3:.1f}", f"{s.mean_tpot_without_slowest_s * 1e3:.1f}",
                     ", ".join(s.unfinished)]  # fmt: skip
            lines.append(f"| {' | '.join(cells)} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="side-by-side run folders (--out)")
    p.add_argument("--stall-s", type=float, default=1.0, help="a gap longer than this stalls")
    args = p.parse_args(argv)
    for run in map(Path, args.runs):
        print(markdown(run.name, run_stats(run, args.stall_s), args.stall_s))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
