"""evinfra side by side with NVIDIA Dynamo 1.6.1 (benchmarks/dynamo/).

The fast tests check the report's arithmetic and the commands the run builds. The slow
test runs the whole thing, small (`--quick`: coding only, a few seconds of load per
system), inside a private network namespace; it needs root, `unshare`, and the Dynamo venv
from `benchmarks/dynamo/setup.sh`, and is skipped with the reason when any is missing.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks" / "dynamo"
DYNAMO_PYTHON = BENCH / ".venv" / "bin" / "python"
sys.path.insert(0, str(BENCH))

from launch import Deployment, EngineShape, dynamo_commands, evinfra_command  # noqa: E402
from matrix import (  # noqa: E402
    FIXED_COSTS,
    Limits,
    WorkloadRun,
    replay_argv,
    sim_config,
    write_crosscheck_trace,
)
from probe import ProbeTrace, excess, fixed_costs, probe_deployments, probe_sim_config  # noqa: E402
from report import build_results, ratio, token_gaps, token_timing  # noqa: E402


def test_token_gaps_drop_the_trailing_finish_chunk() -> None:
    rows: list[dict[str, Any]] = [
        # Dynamo: 3 tokens, then a chunk carrying only finish_reason -> 3 gaps, keep 2
        {"e2e_s": 1.0, "ttft_s": 0.1, "num_output_tokens": 3, "itl_s": [0.01, 0.02, 0.0001]},
        # evinfra: finish_reason on the last token's chunk -> 2 gaps, keep 2
        {"e2e_s": 1.0, "ttft_s": 0.1, "num_output_tokens": 3, "itl_s": [0.03, 0.04]},
        {"e2e_s": None, "error": "HTTP 500", "num_output_tokens": 0, "itl_s": [0.5]},
    ]
    assert token_gaps(rows) == [0.01, 0.02, 0.03, 0.04]


def test_token_timing_drops_evinfra_handoff_chunk_from_the_start() -> None:
    # evinfra disaggregated: an empty chunk at the handoff, then 3 tokens
    row = {"e2e_s": 1.0, "ttft_s": 0.5, "num_output_tokens": 3, "itl_s": [0.2, 0.01, 0.02]}
    ttft, gaps = token_timing(row, leading_extra=True)  # type: ignore[misc]
    assert ttft == pytest.approx(0.7) and gaps == [0.01, 0.02]
    ttft, gaps = token_timing(row, leading_extra=False)  # type: ignore[misc]
    assert ttft == pytest.approx(0.5) and gaps == [0.2, 0.01]
    assert token_timing({**row, "error": "x"}, leading_extra=True) is None


def test_build_results_ratios_and_sim_errors() -> None:
    base = {"mean_e2e_s": 2.0, "p50_ttft_s": 0.1, "p95_ttft_s": 0.5, "mean_itl_s": 0.01,
            "p50_itl_s": 0.01, "p95_itl_s": 0.02, "mean_tpot_s": 0.01}  # fmt: skip
    dyn = {**base, "mean_e2e_s": 5.0, "p95_ttft_s": 2.0}
    measured = {"coding": {"evinfra-evolving": base, "dynamo-agg": dyn}}
    simulated = {"coding": {"dynamo-agg": {**dyn, "mean_e2e_s": 6.0}}}
    res = build_results(measured, simulated)["coding"]
    assert res["ratio_to_evinfra"]["dynamo-agg"]["mean_e2e_s"] == pytest.approx(2.5)
    assert res["ratio_to_evinfra"]["dynamo-agg"]["p95_ttft_s"] == pytest.approx(4.0)
    assert res["sim_relative_error"]["dynamo-agg"]["mean_e2e_s"] == pytest.approx(0.2)
    assert "evinfra-evolving" not in res["sim_relative_error"]  # no simulation given
    assert math.isnan(ratio(1.0, None))


def test_both_systems_get_the_same_engine() -> None:
    shape = EngineShape(block_size=16, num_blocks=4096, max_num_seqs=64,
                        max_num_batched_tokens=2048, speedup_ratio=2.0)  # fmt: skip
    ev = evinfra_command(Deployment("evinfra"), shape, "evinfra", 9000)
    (_, frontend), (_, mocker) = dynamo_commands(
        Deployment("dynamo-agg"), shape, "python", Path("/m"), 9001
    )

    def flag(argv: list[str], name: str) -> str:
        return argv[argv.index(name) + 1]

    assert flag(ev, "--block-size") == flag(mocker, "--block-size") == "16"
    assert flag(ev, "--num-blocks") == flag(mocker, "--num-gpu-blocks-override") == "4096"
    assert flag(ev, "--max-num-seqs") == flag(mocker, "--max-num-seqs") == "64"
    assert flag(ev, "--max-num-batched-tokens") == flag(mocker, "--max-num-batched-tokens")
    assert "speedup_ratio=2.0" in ev and flag(mocker, "--speedup-ratio") == "2.0"
    assert f"kv_capacity_tokens={16 * 4096}" in ev
    assert "utilisation_source=decode_context" in ev
    assert flag(ev, "--kv-allocation") == "chunk-when-prompt-fits"  # the mocker's scheduler
    assert flag(frontend, "--router-mode") == "kv" and flag(frontend, "--http-host") == "127.0.0.1"
    assert flag(mocker, "--discovery-backend") == "file"
    assert flag(mocker, "--request-plane") == "tcp"
    assert flag(mocker, "--num-workers") == "2"
    disagg = dynamo_commands(Deployment("dynamo-disagg"), shape, "python", Path("/m"), 9002)
    modes = [flag(argv, "--disaggregation-mode") for _, argv in disagg[1:]]
    assert modes == ["prefill", "decode"]


def test_replay_is_bounded_and_sim_matches_the_run(tmp_path: Path) -> None:
    run = WorkloadRun("coding", kind="coding", concurrency=4, shape=EngineShape(num_blocks=1000))
    limits = Limits(duration_s=12.0, drain_s=5.0, seed=3)
    argv = replay_argv("evinfra", "http://127.0.0.1:1", "m", run, limits, "x", tmp_path,
                       hints=False)  # fmt: skip
    assert argv[argv.index("--max-duration-s") + 1] == "12.0"
    assert argv[argv.index("--max-requests") + 1] == str(run.max_requests)
    assert "--no-hints" in argv
    cfg = sim_config(Deployment("dynamo-agg"), run, limits, num_device_blocks_per_node=100_000)
    assert cfg["system"] == "aggregated" and cfg["hints"] is False
    assert int(100_000 * cfg["kv_capacity_scale"]) == 1000  # the simulator's pool size
    assert cfg["cost_options"]["kv_capacity_tokens"] == 16_000
    assert (cfg["duration_s"], cfg["warmup_s"], cfg["seed"]) == (12.0, 0.0, 3)
    trace = tmp_path / "t.jsonl"
    write_crosscheck_trace(trace, num_requests=3, num_prefix_blocks=1, num_own_blocks=1)
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [r["hash_ids"] for r in rows] == [[0, 1], [0, 2], [0, 3]]


def test_sim_configs_carry_each_servers_measured_fixed_costs() -> None:
    run = WorkloadRun("coding", kind="coding", concurrency=4, shape=EngineShape(num_blocks=1000))
    limits = Limits()
    ev = sim_config(Deployment("evinfra"), run, limits, 100_000)
    agg = sim_config(Deployment("dynamo-agg"), run, limits, 100_000)
    dis = sim_config(Deployment("dynamo-disagg"), run, limits, 100_000)
    assert ev["api_overhead_s"] == FIXED_COSTS["evinfra"].api_overhead_s > 0
    assert ev["handoff_overhead_s"] == FIXED_COSTS["evinfra"].handoff_overhead_s
    assert agg["api_overhead_s"] == dis["api_overhead_s"] == FIXED_COSTS["dynamo"].api_overhead_s
    # Dynamo's client gets its first token from the decode worker's first pass
    assert dis["first_token_on_decode_step"] and not ev["first_token_on_decode_step"]
    # each server's own KV allocation: evinfra's setting, the mocker's scheduler for Dynamo
    assert ev["kv_allocation"] == agg["kv_allocation"] == "chunk-when-prompt-fits"
    from side_by_side import with_kv_allocation

    chunk = with_kv_allocation(run, "chunk")
    assert sim_config(Deployment("evinfra"), chunk, limits, 100_000)["kv_allocation"] == "chunk"
    assert sim_config(Deployment("dynamo-disagg"), chunk, limits, 100_000)["kv_allocation"] == (
        "chunk-when-prompt-fits"
    )
    assert evinfra_command(Deployment("evinfra"), chunk.shape, "e", 1)[-1] == "chunk"
    # the probe's simulations run without them, so the excess is the whole fixed cost
    probe = probe_sim_config(Deployment("dynamo-disagg"), run, limits, 100_000)
    assert probe["api_overhead_s"] == probe["handoff_overhead_s"] == 0.0
    assert probe["first_token_on_decode_step"]
    # the probe's forced-disaggregated evinfra hands every request off, in serve and sim
    forced = probe_deployments()[1]
    argv = evinfra_command(forced, run.shape, "evinfra", 1)
    assert argv[argv.index("--system") + 1] == "evolving-no-planner"
    assert "max_local_prefill_tokens=0" in argv
    cfg = sim_config(forced, run, limits, 100_000)
    assert cfg["system"] == "evolving-no-planner"
    assert cfg["system_options"]["max_local_prefill_tokens"] == 0


def test_several_evinfra_bundles_run_as_their_own_deployments() -> None:
    """`--evinfra-systems evolving,evolving-lru`: the ablation runs (and is simulated) as
    its own deployment, labelled apart, before both Dynamo deployments."""
    from matrix import default_deployments

    deps = default_deployments(2, ("evolving", "evolving-lru"))
    assert [d.label for d in deps] == [
        "evinfra-evolving", "evinfra-evolving-lru", "dynamo-agg", "dynamo-disagg",
    ]  # fmt: skip
    assert "--system evolving-lru" in " ".join(
        evinfra_command(deps[1], EngineShape(), "evinfra", 1)
    )
    run = WorkloadRun("coding", kind="coding", concurrency=24, params=(("interactive_share", "1"),))
    cfg = sim_config(deps[1], run, Limits(), 1000)
    assert cfg["system"] == "evolving-lru" and cfg["workload_params"] == {"interactive_share": 1}
    assert run.replay_flags()[-2:] == ["--workload-param", "interactive_share=1"]


def _sbs_args(*flags: str) -> Any:
    import side_by_side

    return side_by_side.parse_args(["--workloads", "coding,mixed,mooncake", *flags])


def test_every_systems_replay_is_cut_to_a_nodes_kv_by_default(tmp_path: Path) -> None:
    """Bug 13: evinfra lists its KV as max_model_len and Dynamo lists none, so the client
    cut a call for evinfra only. By default every system's replay gets one limit, a
    node's KV in tokens, and the simulator is given the same cut calls."""
    import side_by_side
    from matrix import default_deployments

    runs = side_by_side.workload_runs(_sbs_args("--agent-num-blocks", "1024"))
    assert {r.name: r.max_context_tokens for r in runs} == {
        "coding": 16_384, "mixed": 16_384, "mooncake": 16_384 * 16,
    }  # fmt: skip
    limits = Limits()
    for run in runs:
        sent = set()
        for dep in default_deployments(2, ("evolving", "evolving-lru")):
            argv = replay_argv("evinfra", "http://127.0.0.1:1", "m", run, limits, dep.label,
                               tmp_path, hints=dep.sends_hints)  # fmt: skip
            sent.add(argv[argv.index("--max-context-tokens") + 1])
        assert sent == {str(run.shape.kv_capacity_tokens)}
        sim = side_by_side.sim_argv("evinfra", run, tmp_path / "c.yaml", tmp_path / "o")
        assert sim[1].endswith("sim_cut.py")
        assert sim[sim.index("--max-context-tokens") + 1] == str(run.shape.kv_capacity_tokens)


def test_the_context_limit_flag_server_or_a_number(tmp_path: Path) -> None:
    import side_by_side

    runs = side_by_side.workload_runs(_sbs_args("--max-context-tokens", "server"))
    assert all(r.max_context_tokens is None for r in runs)
    argv = replay_argv("evinfra", "u", "m", runs[0], Limits(), "x", tmp_path)
    assert "--max-context-tokens" not in argv
    assert side_by_side.sim_argv("evinfra", runs[0], tmp_path, tmp_path)[:2] == ["evinfra", "sim"]
    runs = side_by_side.workload_runs(_sbs_args("--max-context-tokens", "8000"))
    assert [r.max_context_tokens for r in runs] == [8000, 8000, 8000]
    assert "mixed 8,000" in side_by_side.context_note(runs)
    assert "own listed" in side_by_side.context_note([replace(r, max_context_tokens=None)
                                                      for r in runs])  # fmt: skip


@pytest.mark.parametrize("bad", ["0", "1", "kv2", "-4", "1e4"])
def test_a_bad_context_limit_is_refused_by_name(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        _sbs_args("--max-context-tokens", bad)
    assert "argument --max-context-tokens" in capsys.readouterr().err


def test_the_simulator_cuts_the_call_the_client_cuts(tmp_path: Path) -> None:
    """The 1,024-block coding cell's 20,516-token first call: over a node's KV the
    simulator rejects it, as the mocker rejects the whole prompt; cut to the node's KV it
    is served, as both servers are now sent it."""
    import side_by_side
    from sim_cut import run_cut

    run = WorkloadRun("coding", kind="coding", concurrency=16, shape=EngineShape(num_blocks=1024))
    limits = Limits(duration_s=4.0, drain_s=2.0)
    cfg = sim_config(Deployment("dynamo-agg"), run, limits,
                     side_by_side.num_tiny_device_blocks(16))  # fmt: skip
    path = tmp_path / "agg.yaml"
    path.write_text(json.dumps(cfg))
    whole, none_cut = run_cut(str(path), None)
    assert whole["num_rejected"] >= 1 and none_cut == []
    cut_summary, cut = run_cut(str(path), 16_384)
    assert cut_summary["num_rejected"] == 0 and cut_summary["num_cut_calls"] == len(cut) >= 1
    assert (cut[0].num_prompt_tokens, cut[0].max_output_tokens) == (12_288, 4_096)
    assert len(cut[0].prompt_hashes) == 12_288 // 16 and cut[0].output_hashes == ()


def test_probe_trace_and_excess_arithmetic(tmp_path: Path) -> None:
    trace = ProbeTrace(num_requests=4, interval_ms=500, burst_size=3)
    path = tmp_path / "probe.jsonl"
    trace.write(path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["timestamp"] for r in rows] == [0, 500, 1000, 1500, 2500, 2500, 2500]
    assert [r["input_length"] for r in rows] == [512, 2048, 4096, 512, 512, 512, 512]
    ids = [h for r in rows for h in r["hash_ids"]]
    assert len(ids) == len(set(ids))  # nothing shared: nothing hits the cache
    sim = [(512, 0.02, 0.2), (2048, 0.05, 0.3), (4096, 0.10, 0.4), (512, 0.02, 0.2)]
    meas = [(n, t + 0.005, e + 0.006) for n, t, e in sim]
    burst_sim = [(512, 0.03, 0.2)] * 3
    burst_meas = [(512, 0.03 + d, 0.2) for d in (0.01, 0.03, 0.02)]
    agg = excess(meas + burst_meas, sim + burst_sim, burst_size=3)
    assert agg["median_ttft_excess_s"] == pytest.approx(0.005)
    assert agg["median_e2e_excess_s"] == pytest.approx(0.006)
    assert agg["burst_excess_slope_s"] == pytest.approx(0.01)
    dis = excess([(n, t + 0.012, e) for n, t, e in meas] + burst_meas, sim + burst_sim, 3)
    costs = fixed_costs({"dynamo-agg": agg, "dynamo-disagg": dis})
    assert costs["dynamo"]["api_overhead_s"] == pytest.approx(0.005)
    assert costs["dynamo"]["handoff_overhead_s"] == pytest.approx(0.012)
    with pytest.raises(ValueError, match="prompt sizes differ"):
        excess(list(reversed(meas)) + burst_meas, sim + burst_sim, 3)


def _skip_reason() -> str | None:
    if not DYNAMO_PYTHON.is_file():
        return f"ai-dynamo is not installed ({DYNAMO_PYTHON} missing: run {BENCH}/setup.sh)"
    probe = subprocess.run([str(DYNAMO_PYTHON), "-c", "import dynamo.mocker, dynamo.frontend"],
                           capture_output=True, timeout=120)  # fmt: skip
    if probe.returncode != 0:
        return "ai-dynamo is not importable in benchmarks/dynamo/.venv"
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs root, unshare and ip for a private network namespace"
    if importlib.util.find_spec("evinfra") is None:
        return "evinfra is not importable"
    return None


@pytest.mark.slow
def test_side_by_side_quick_run(tmp_path: Path) -> None:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    out = tmp_path / "run"
    proc = subprocess.run(
        [str(BENCH / "run_side_by_side.sh"), "--quick", "--duration-s", "8", "--drain-s", "10",
         "--no-aiperf", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "EVINFRA_PYTHON": sys.executable},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    coding = results["results"]["coding"]
    for label in ("evinfra-evolving", "dynamo-agg", "dynamo-disagg"):
        m = coding["measured"][label]
        assert m["num_requests"] > 0 and m["num_errors"] == 0, (label, m)
        assert m["mean_e2e_s"] > 0 and m["p95_ttft_s"] >= m["p50_ttft_s"] > 0
        assert coding["simulated"][label]["num_requests"] > 0
    assert coding["ratio_to_evinfra"]["dynamo-agg"]["mean_e2e_s"] > 0
    assert "## coding" in (out / "report.md").read_text()
    # every server process the run started is gone (their logs name them)
    assert not results["failures"]
