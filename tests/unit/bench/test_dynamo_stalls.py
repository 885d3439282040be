"""benchmarks/dynamo/stalls.py: the per-call view of a side-by-side run."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.scripts import load_script


def load() -> ModuleType:
    return load_script("benchmarks/dynamo/stalls.py", "dynamo_stalls")


def make_call(
    session: str, send_s: float, e2e_s: float | None, itl_s: list[float], **kw: Any
) -> dict[str, Any]:
    ttft = kw.get("ttft_s", 0.1)
    n_out = len(itl_s) + 1 if e2e_s is not None else 0
    return {"session_id": session, "send_s": send_s, "e2e_s": e2e_s, "itl_s": itl_s,
            "ttft_s": ttft if e2e_s is not None or itl_s else None,
            "num_output_tokens": kw.get("num_output_tokens", n_out),
            "error": kw.get("error")}  # fmt: skip


CALLS = [
    make_call("a", 0.0, 0.1 + 0.03 * 10, [0.03] * 10),
    # stalled 20 s after its first token: one call moves the mean TPOT
    make_call("b", 1.0, 0.1 + 20.0 + 0.03, [20.0, 0.03]),
    make_call("a", 5.0, 0.1 + 0.03 * 4, [0.03] * 4),
    make_call("c", 10.0, None, []),  # still queued when the replay stopped at 60 s
    make_call("d", 12.0, None, [], error="HTTP 500"),  # failed: left out
    make_call("e", 45.0, None, []),  # sent after the load window
]


def test_call_stats_counts_what_the_report_mean_leaves_out() -> None:
    s = load().call_stats(CALLS, end_s=60.0, window_s=40.0)
    assert (s.num_sent, s.num_finished, s.unfinished) == (4, 3, ("c/0",))
    e2e = [0.4, 20.13, 0.22]
    assert math.isclose(s.mean_e2e_s, sum(e2e) / 3)
    # the unfinished call counts from its send to the end of the replay: 50 s at least
    assert math.isclose(s.mean_e2e_with_unfinished_s, (sum(e2e) + 50.0) / 4)
    assert s.num_stalls == 1 and s.longest_stall == (20.0, "b/0")
    assert math.isclose(s.mean_tpot_s, (0.03 + 20.03 / 2 + 0.03) / 3)
    assert math.isclose(s.mean_tpot_without_slowest_s, 0.03)


def test_run_stats_reads_a_run_folder(tmp_path: Path) -> None:
    (tmp_path / "results.json").write_text(json.dumps({"limits": {"duration_s": 40.0}}))
    folder = tmp_path / "measured" / "coding" / "evinfra-evolving"
    folder.mkdir(parents=True)
    folder.joinpath("requests.jsonl").write_text("\n".join(json.dumps(c) for c in CALLS))
    folder.joinpath("summary.json").write_text(json.dumps({"wall_s": 60.0}))
    mod = load()
    stats = mod.run_stats(tmp_path)
    assert stats["coding"]["evinfra-evolving"].unfinished == ("c/0",)
    text = mod.markdown("run", stats, 1.0)
    assert "| evinfra-evolving | 4 | 3 |" in text and "20.0 s (b/0)" in text
