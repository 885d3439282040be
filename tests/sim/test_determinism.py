"""Same seed, same summary; bad config gets an error naming the field."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from evinfra.sim.config import ConfigError, SimConfig, load_config
from evinfra.sim.runner import run_sim

SMALL = {
    "workload": "coding",
    "model": "kimi-k2",
    "gpu": "gb300",
    "num_gpus": 16,
    "session_rate": 1.0,
    "duration_s": 40.0,
    "warmup_s": 5.0,
    "drain_s": 60.0,
    "check_integrity": True,
}

TIMING_KEYS = {"wall_s", "events_per_s", "sim_s_per_wall_s"}


def summary(system: str, seed: int) -> dict[str, object]:
    s = run_sim(SimConfig(system=system, seed=seed, **SMALL)).summary
    return {k: v for k, v in s.items() if k not in TIMING_KEYS}


@pytest.mark.parametrize("system", ["evolving", "dynamo"])
def test_same_seed_same_summary(system: str) -> None:
    a, b = summary(system, 1), summary(system, 1)
    assert a == b or all(
        a[k] == b[k] or (isinstance(a[k], float) and math.isnan(a[k]) and math.isnan(b[k]))  # type: ignore[arg-type]
        for k in a
    )
    assert isinstance(a["num_requests"], int) and a["num_requests"] > 0
    c = summary(system, 2)
    assert c["num_requests"] != a["num_requests"] or c["mean_e2e_s"] != a["mean_e2e_s"]


def test_bad_values_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="num_gpus"):
        load_config(None, {"num_gpus": 12, "gpus_per_node": 8})
    with pytest.raises(ConfigError, match="session_rate"):
        load_config(None, {"session_rate": -1.0})
    bad = tmp_path / "bad.yaml"
    bad.write_text("sesion_rate: 3\n")
    with pytest.raises(ConfigError, match="sesion_rate"):
        load_config(bad, {})
    bad.write_text("[1, 2")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad, {})


def test_cli_errors_name_the_field_and_summary_is_written(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "evinfra.cli", "sim", "--quiet", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300)

    bad = run("--model", "gpt-9")
    assert bad.returncode == 2
    assert "model" in bad.stderr and "Traceback" not in bad.stderr
    bad_system = run("--system", "nope", "--num-gpus", "16")
    assert bad_system.returncode == 2 and "system" in bad_system.stderr
    out = tmp_path / "run"
    ok = run(
        "--system", "evolving", "--workload", "math", "--num-gpus", "16",
        "--duration-s", "30", "--warmup-s", "5", "--session-rate", "0.5", "--out", str(out),
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    data = json.loads((out / "summary.json").read_text())
    for key in (
        "system", "num_requests", "num_sessions", "mean_e2e_s", "p50_ttft_s", "p95_ttft_s",
        "p99_ttft_s", "mean_tpot_s", "throughput_tok_s", "kv_hit_rate", "role_switches",
        "sim_events", "wall_s",
    ):  # fmt: skip
        assert key in data
    assert json.loads((out / "config.json").read_text())["workload"] == "math"
    assert "mean e2e" in ok.stdout


def test_kv_moved_splits_into_hand_offs_pulls_and_migrations() -> None:
    s = run_sim(SimConfig(system="evolving", seed=0, **SMALL)).summary
    parts = ("kv_bytes_handed_off", "kv_bytes_pulled", "kv_bytes_migrated")
    assert sum(s[k] for k in parts) == s["kv_bytes_moved"]
    assert s["prefix_pulls"] > 0 and s["kv_bytes_pulled"] > 0 and s["kv_bytes_handed_off"] > 0
