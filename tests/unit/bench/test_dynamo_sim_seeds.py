"""benchmarks/dynamo/sim_seeds.py: a side-by-side run's cells re-simulated over seeds."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.scripts import load_script


def load() -> ModuleType:
    return load_script("benchmarks/dynamo/sim_seeds.py", "dynamo_sim_seeds")


def sim_cfg(system: str, **kw: Any) -> dict[str, Any]:
    """A side-by-side-like config: the tiny model, two one-GPU nodes with small KV."""
    cfg: dict[str, Any] = {
        "system": system, "model": "tiny", "gpu": "h200", "num_gpus": 2,
        "gpus_per_node": 1, "block_size": 16, "kv_capacity_scale": 1.73e-05,
        "max_num_batched_tokens": 2048, "max_num_seqs": 64,
        "cost_model": "dynamo-polynomial",
        "cost_options": {"speedup_ratio": 1.0, "kv_capacity_tokens": 16384,
                         "utilisation_source": "decode_context"},
        "duration_s": 8.0, "warmup_s": 0.0, "drain_s": 4.0, "seed": 0,
        "workload": "coding", "concurrency": 6,
    }  # fmt: skip
    cfg.update(kw)
    return cfg


@pytest.fixture
def run(tmp_path: Path) -> Path:
    folder = tmp_path / "sbs"
    (folder / "sim" / "coding").mkdir(parents=True)
    (folder / "results.json").write_text(
        json.dumps({"workloads": {"coding": {"max_context_tokens": 4096}}})
    )
    for name, system in (("evinfra-evolving", "evolving"), ("dynamo-agg", "aggregated")):
        path = folder / "sim" / "coding" / f"{name}.yaml"
        path.write_text(json.dumps(sim_cfg(system)))
    return folder


def test_parse_seeds() -> None:
    m = load()
    assert m.parse_seeds("0-3") == [0, 1, 2, 3]
    assert m.parse_seeds("2,5,7-8") == [2, 5, 7, 8]
    with pytest.raises(SystemExit, match="--seeds"):
        m.parse_seeds("a-b")


def test_summarize_ratios_by_hand() -> None:
    m = load()
    r = m.SeedResult
    results = {
        "a": [r(0, 2.0, 4.0, 1), r(1, 4.0, 4.0, 0)],
        "ref": [r(0, 4.0, 4.0, 0), r(1, 2.0, 8.0, 2)],
    }
    rows = {row[0]: row for row in m.summarize(results, "ref")}
    _, mean_s, counted_s, ratio, ratio_counted, wins = rows["a"]
    assert mean_s == 3.0 and counted_s == 4.0
    assert ratio == pytest.approx(1.0)  # sqrt(2 * 0.5)
    assert ratio_counted == pytest.approx(math.sqrt(2.0))  # sqrt(1 * 2)
    assert wins == 1
    assert rows["ref"][3] == pytest.approx(1.0) and rows["ref"][5] == 0


def test_main_simulates_each_seed(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    m = load()
    out = tmp_path / "seeds.json"
    assert m.main([str(run), "--seeds", "0-1", "--json", str(out)]) == 0
    data = json.loads(out.read_text())["coding"]
    assert list(data) == ["evinfra-evolving", "dynamo-agg"]  # the reference last
    for rows in data.values():
        assert [row["seed"] for row in rows] == [0, 1]
        assert any(row["num_unfinished"] > 0 for row in rows)
        for row in rows:
            assert row["mean_e2e_s"] > 0
            if row["num_unfinished"] == 0:
                assert row["mean_e2e_with_unfinished_s"] == pytest.approx(row["mean_e2e_s"])
            else:  # an unfinished call counts at least the 4 s drain, above any mean here
                assert row["mean_e2e_with_unfinished_s"] > row["mean_e2e_s"]
        # the seed reaches the workload: two seeds, two different runs
        assert rows[0]["mean_e2e_s"] != rows[1]["mean_e2e_s"]
    text = capsys.readouterr().out
    assert "## coding (calls cut to 4096 tokens)" in text
    assert "| dynamo-agg |" in text and "1.000x" in text


def test_bad_arguments_name_the_field(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = load()
    for argv, field in (
        ([str(run), "--workloads", "math"], "--workloads: 'math' is not in the run"),
        ([str(run), "--systems", "evinfra-nope"], "--systems: evinfra-nope not simulated"),
        ([str(run.parent / "missing")], "has no results.json"),
        ([str(run), "--num-blocks", "0"], "--num-blocks: must be a positive number"),
    ):
        with pytest.raises(SystemExit):
            m.main(argv)
        assert field in capsys.readouterr().err


def test_a_cell_moved_to_other_sessions_and_kv(tmp_path: Path, run: Path) -> None:
    m = load()
    config = run / "sim" / "coding" / "dynamo-agg.yaml"
    base = json.loads(config.read_text())
    over = m.cell_overrides(config, concurrency=9, num_blocks=512)
    assert over["concurrency"] == 9
    assert over["cost_options"]["kv_capacity_tokens"] == 512 * 16
    assert over["kv_capacity_scale"] == pytest.approx(base["kv_capacity_scale"] / 2)
    assert m.cell_overrides(config) == {}
    moved = tmp_path / "moved.json"
    same = tmp_path / "same.json"
    assert m.main([str(run), "--seeds", "0", "--json", str(same)]) == 0
    assert m.main([str(run), "--seeds", "0", "--concurrency", "9", "--num-blocks", "512",
                   "--json", str(moved)]) == 0  # fmt: skip
    a = json.loads(same.read_text())["coding"]["dynamo-agg"][0]
    b = json.loads(moved.read_text())["coding"]["dynamo-agg"][0]
    assert a["mean_e2e_s"] != b["mean_e2e_s"]
