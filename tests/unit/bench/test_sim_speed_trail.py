"""benchmarks/sim_speed.py --progress-every-s: a line per simulated interval, with the
CPU time so far and how full the nodes' KV is."""

from __future__ import annotations

import re

import pytest

from tests.scripts import load_script

sim_speed = load_script("benchmarks/sim_speed.py", "sim_speed")


def test_trail_reports_each_interval_and_the_kv_filling(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--systems", "evolving", "--gpus", "16", "--duration-s", "120", "--drain-s", "0"]
    argv += ["--kv-capacity-scale", "0.005", "--progress-every-s", "30"]
    assert sim_speed.main(argv) == 0
    out = capsys.readouterr()
    lines = [line for line in out.err.splitlines() if line.startswith("evolving 16 GPUs")]
    pattern = re.compile(
        r"sim (\d+) s, CPU ([\d.]+) s \(\+[\d.]+ s\), \d+ events, peak RSS [\d.]+ GiB,"
        r" device KV (\d+)% cached, host KV (\d+)% full"
    )
    found = [pattern.search(line) for line in lines]
    assert all(found) and len(found) >= 4, lines
    sim_s = [int(m[1]) for m in found if m]
    cpu_s = [float(m[2]) for m in found if m]
    assert sim_s == sorted(sim_s) and sim_s[-1] == 120
    assert cpu_s == sorted(cpu_s)
    # a two-hundredth of the device KV fills within two minutes and spills to host
    last = found[-1]
    assert last is not None and int(last[3]) >= 80 and int(last[4]) > 0
    assert "| evolving | 16 | 120 |" in out.out
