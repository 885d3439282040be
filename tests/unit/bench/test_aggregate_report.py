from __future__ import annotations

import math
from typing import Any

import pytest

from evinfra.bench.aggregate import add_ratios, mean_summary, sanitize, spread
from evinfra.bench.report import findings, main_table


def block(label: str, e2e: float, ttft: float, **extra: Any) -> dict[str, Any]:
    summary = {
        "system": label,
        "mean_e2e_s": e2e,
        "p95_ttft_s": ttft,
        "num_requests": 100,
        "num_unfinished": 0,
        "mean_tpot_s": 0.02,
        "throughput_tok_s_per_gpu": 10.0,
        "kv_hit_rate": 0.5,
    }
    summary.update(extra)
    return {
        "label": label,
        "system": label,
        "summary": summary,
        "spread": {},
        "seeds": [0],
        "errors": {},
        "runs": [f"{label}__seed0"],
    }


def test_mean_summary_and_spread() -> None:
    a = {"system": "x", "mean_e2e_s": 1.0, "num_requests": 10, "p95_ttft_s": float("nan")}
    b = {"system": "x", "mean_e2e_s": 3.0, "num_requests": 20, "p95_ttft_s": 1.0}
    m = mean_summary([a, b])
    assert m["system"] == "x"
    assert m["mean_e2e_s"] == 2.0
    assert m["num_requests"] == 15.0
    assert math.isnan(m["p95_ttft_s"])
    s = spread([a, b])
    assert s["mean_e2e_s"] == {"min": 1.0, "max": 3.0, "std": 1.0}
    assert mean_summary([a])["num_requests"] == 10


def test_ratios_against_baseline_and_floor() -> None:
    blocks = {
        "evolving": block("evolving", 2.0, 0.1),
        "dynamo": block("dynamo", 8.0, 1.4),
        "oracle": block("oracle", 1.0, 0.05),
    }
    add_ratios(blocks, "dynamo", "oracle")
    assert blocks["evolving"]["ratio_vs_dynamo"]["mean_e2e_s"] == pytest.approx(4.0)
    assert blocks["evolving"]["ratio_vs_dynamo"]["p95_ttft_s"] == pytest.approx(14.0)
    assert blocks["dynamo"]["ratio_vs_dynamo"]["mean_e2e_s"] == pytest.approx(1.0)
    assert blocks["evolving"]["vs_floor"]["mean_e2e_s"] == pytest.approx(2.0)
    assert blocks["oracle"]["vs_floor"]["p95_ttft_s"] == pytest.approx(1.0)


def test_floor_is_the_lowest_of_the_oracle_variants_per_metric() -> None:
    blocks = {
        "evolving": block("evolving", 2.0, 0.1),
        "oracle": block("oracle", 2.5, 0.05),
        "oracle-split": block("oracle-split", 1.6, 0.08),
        "oracles": block("oracles", 0.1, 0.001),  # not a variant: no "oracle-" prefix
    }
    add_ratios(blocks, "dynamo", "oracle")
    assert blocks["evolving"]["vs_floor"]["mean_e2e_s"] == pytest.approx(2.0 / 1.6)
    assert blocks["evolving"]["vs_floor"]["p95_ttft_s"] == pytest.approx(0.1 / 0.05)
    assert blocks["oracle"]["vs_floor"]["mean_e2e_s"] == pytest.approx(2.5 / 1.6)


def test_ratios_missing_baseline_are_none() -> None:
    blocks = {"evolving": block("evolving", 2.0, 0.1)}
    add_ratios(blocks, "dynamo", "oracle")
    assert blocks["evolving"]["ratio_vs_dynamo"] == {"mean_e2e_s": None, "p95_ttft_s": None}


def test_sanitize_removes_nan() -> None:
    assert sanitize({"a": [float("nan"), 1.0], "b": float("inf")}) == {"a": [None, 1.0], "b": None}


def make_results(**systems: dict[str, Any]) -> dict[str, Any]:
    add_ratios(systems, "dynamo", "oracle")
    return {"baseline": "dynamo", "floor": "oracle", "systems": systems, "goodput": None}


def test_findings_say_who_is_ahead_and_behind() -> None:
    res = make_results(
        evolving=block("evolving", 2.0, 0.1),
        slow=block("slow", 10.0, 0.5),
        dynamo=block("dynamo", 8.0, 1.4),
    )
    text = "\n".join(findings(res))
    assert "`evolving` is ahead of `dynamo`: 4.00x lower mean e2e latency, 14.00x" in text
    assert "**`slow` is behind `dynamo`** on mean e2e (mean e2e 0.80x" in text


def test_findings_flag_unfinished_and_failures() -> None:
    bad = block("evolving", 2.0, 0.1, num_unfinished=50)
    bad["errors"] = {"1": "boom"}
    res = make_results(evolving=bad, dynamo=block("dynamo", 8.0, 1.4))
    text = "\n".join(findings(res))
    assert "left 50 of 150" in text
    assert "failed for seed(s) 1" in text


def test_main_table_rows() -> None:
    res = make_results(evolving=block("evolving", 2.0, 0.1), dynamo=block("dynamo", 8.0, 1.4))
    lines = main_table(res)
    row = next(x for x in lines if x.startswith("| evolving"))
    assert "| 2.000 | 4.00x | 0.100 | 14.00x |" in row


def test_setup_names_the_load_a_run_had() -> None:
    from evinfra.bench.report import describe_setup

    config = {
        "model": "kimi-k2",
        "gpu": "gb300",
        "num_gpus": 64,
        "gpus_per_node": 8,
        "duration_s": 1200.0,
        "warmup_s": 240.0,
        "rate_scale": 1.0,
    }
    generated = describe_setup({"config": {**config, "workload": "math"}, "seeds": [0]})
    assert "load: 1 sessions/s (the workload default)" in generated
    trace = describe_setup(
        {"config": {**config, "trace": "mooncake", "rate_scale": 2.0}, "seeds": [0]}
    )
    assert "load: the trace's own arrivals x2.0" in trace
    fixed = describe_setup(
        {"config": {**config, "workload": "math", "session_rate": 4.0}, "seeds": [0]}
    )
    assert "load: 4.0 sessions/s" in fixed


def test_sweep_findings_name_the_points_where_a_system_is_behind() -> None:
    from evinfra.bench.report import sweep_findings

    def point(value: float, evolving_e2e: float) -> dict[str, Any]:
        systems = {
            "evolving": block("evolving", evolving_e2e, 0.1),
            "dynamo": block("dynamo", 4.54, 0.16),
        }
        add_ratios(systems, "dynamo", "oracle")  # as the bench does for each point
        return {"value": value, "systems": systems}

    res = make_results(evolving=block("evolving", 5.0, 0.1), dynamo=block("dynamo", 5.5, 2.4))
    res["sweep"] = {
        "field": "session_rate",
        "headline": 3.0,
        "values": [1.0, 2.0, 3.0],
        "points": [point(1.0, 1.78), point(2.0, 4.65), point(3.0, 9.9)],
    }
    notes = sweep_findings(res)
    # the headline point (3) is findings()'s; rate 1 is ahead; rate 2 is behind
    assert notes == [
        "- **`evolving` is behind `dynamo` at session_rate = 2**: mean e2e 0.98x"
        " (mean e2e 4.650 s against 4.540 s)."
    ]
    assert sweep_findings(make_results(evolving=block("evolving", 1.0, 0.1))) == []


def test_main_table_gives_a_goodput_as_the_load_tried() -> None:
    """A goodput is a load the search tried (up to 4 significant digits): 12.75 is not
    rounded to 12.8, which would be a load never run."""
    res = make_results(evolving=block("evolving", 2.0, 0.1), dynamo=block("dynamo", 8.0, 1.4))
    res["goodput"] = {
        "targets": {"field": "session_rate"},
        "systems": {
            "evolving": {"rate": 12.75, "bound": "exact", "ratio_vs_dynamo": 2.55},
            "dynamo": {"rate": 5.0, "bound": "exact", "ratio_vs_dynamo": 1.0},
        },
    }
    row = next(x for x in main_table(res) if x.startswith("| evolving"))
    assert row.endswith(" 12.75 | 2.55x |")
    assert " goodput (/s) | vs dynamo |" in main_table(res)[0]
    # a search over a trace's rate_scale is a multiple, not a rate
    res["goodput"]["targets"] = {"field": "rate_scale"}
    assert " goodput (x) | vs dynamo |" in main_table(res)[0]


def test_load_axes_name_their_unit() -> None:
    from evinfra.bench.goodput import load_axis_label

    assert load_axis_label("session_rate") == "session rate (/s)"
    assert load_axis_label("rate_scale") == "rate scale (x)"
    assert load_axis_label("concurrency") == "concurrency (sessions)"
    assert load_axis_label("num_gpus") == "num gpus"


def test_goodput_bar_is_labelled_as_the_report_cell() -> None:
    """goodput.png writes each bar as report.md's goodput cell, for every bound: a search
    that failed at its lowest load is "< 4" on both, not a bar labelled 0."""
    from evinfra.bench.goodput import goodput_label
    from evinfra.bench.plots import goodput_bar_text

    below = {"rate": 0.0, "bound": "below", "points": [{"value": 4.0, "passed": False}]}
    cases = [
        ({"rate": 12.75, "bound": "exact", "ratio_vs_dynamo": 2.55}, "12.75\n2.55x"),
        ({"rate": 18.0, "bound": "at_least", "ratio_vs_dynamo": 3.6}, ">= 18\n3.60x"),
        ({**below, "ratio_vs_dynamo": 0.0}, "< 4\n0.00x"),
        (below, "< 4"),
    ]
    for result, text in cases:
        assert goodput_bar_text(result) == text
        assert goodput_bar_text(result).splitlines()[0] == goodput_label(result)
