"""benchmarks/dynamo/report.py: unfinished calls counted next to the replay's mean e2e."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.scripts import load_script


def load() -> ModuleType:
    return load_script("benchmarks/dynamo/report.py", "dynamo_report")


def make_call(session: str, send_s: float, e2e_s: float | None) -> dict[str, Any]:
    done = e2e_s is not None
    return {"session_id": session, "send_s": send_s, "e2e_s": e2e_s,
            "ttft_s": 0.1 if done else None, "itl_s": [0.05] * 3 if done else [],
            "num_output_tokens": 4 if done else 0, "error": None}  # fmt: skip


CALLS = [
    make_call("a", 0.0, 1.0),
    make_call("b", 2.0, 3.0),
    make_call("c", 5.0, None),  # stranded: still waiting when the replay stopped at 60 s
    make_call("a", 8.0, 2.0),
]
"""Finished: 1, 3 and 2 s (mean 2 s); with c counted to the end, (6 + 55) / 4 s."""


def make_replay(folder: Path, calls: list[dict[str, Any]], **summary: Any) -> Path:
    folder.mkdir(parents=True)
    folder.joinpath("requests.jsonl").write_text("\n".join(json.dumps(c) for c in calls))
    base = {"wall_s": 60.0, "mean_e2e_s": 2.0, "num_requests": 3, "num_unfinished": 1}
    folder.joinpath("summary.json").write_text(json.dumps({**base, **summary}))
    return folder


def test_measured_metrics_count_unfinished_calls_to_the_end_of_the_replay(
    tmp_path: Path,
) -> None:
    m = load().measured_metrics(make_replay(tmp_path / "r", CALLS), window_s=40.0)
    assert m["mean_e2e_s"] == 2.0  # the replay's, finished calls only
    assert math.isclose(m["mean_e2e_with_unfinished_s"], (1.0 + 3.0 + 2.0 + 55.0) / 4)
    assert m["num_unfinished"] == 1 and m["replay_num_unfinished"] == 1


def test_the_report_puts_them_next_to_the_mean_and_in_the_ratios(tmp_path: Path) -> None:
    mod = load()
    evinfra = mod.measured_metrics(make_replay(tmp_path / "e", CALLS))
    # the other system finishes every call, more slowly: ahead on the reported mean
    # only because evinfra's stranded call is left out of it
    other = [make_call("a", 0.0, 4.0), make_call("b", 2.0, 4.0)]
    dynamo = mod.measured_metrics(make_replay(tmp_path / "d", other, mean_e2e_s=4.0))
    res = mod.build_results({"coding": {"evinfra-evolving": evinfra, "dynamo-agg": dynamo}}, {})
    ratio = res["coding"]["ratio_to_evinfra"]["dynamo-agg"]
    assert math.isclose(ratio["mean_e2e_s"], 2.0)
    assert math.isclose(ratio["mean_e2e_with_unfinished_s"], 4.0 / 15.25)
    text = mod.markdown(res, "# run")
    assert "| mean e2e (s) | with unfinished (s) | unfinished |" in text
    assert "| evinfra-evolving | 3 (None err) | 2.000 | 15.250 | 1 |" in text
    assert "| dynamo-agg | 3 (None err) | 4.000 | 4.000 | 0 |" in text
    assert "| dynamo-agg | 2.00x | 0.26x |" in text


def test_rerender_recounts_a_finished_run(tmp_path: Path) -> None:
    run = tmp_path / "sbs"
    make_replay(run / "measured" / "coding" / "evinfra-evolving", CALLS)
    old = {"mean_e2e_s": 2.0, "num_requests": 3, "num_errors": 0, "num_unfinished": 1}
    payload = {
        "results": {"coding": {"measured": {"evinfra-evolving": old}, "simulated": {}}},
        "limits": {"duration_s": 40.0},
        "failures": ["mixed on dynamo-agg: timed out"],
    }
    (run / "results.json").write_text(json.dumps(payload))
    (run / "report.md").write_text("# old header\n\nOne run.\n\n## coding\n\nold table\n")
    mod = load()
    assert mod.main([str(run), "--write"]) == 0
    new = json.loads((run / "results.json").read_text())
    measured = new["results"]["coding"]["measured"]["evinfra-evolving"]
    assert math.isclose(measured["mean_e2e_with_unfinished_s"], 15.25)
    text = (run / "report.md").read_text()
    assert text.startswith("# old header\n\nOne run.\n\n## coding\n") and "old table" not in text
    assert "| evinfra-evolving | 3 (0 err) | 2.000 | 15.250 | 1 |" in text
    assert "- mixed on dynamo-agg: timed out" in text
