"""benchmarks/gpu_calibration.py end to end in its tiny CPU mode (a few seconds)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("torch")

from evinfra.costmodel.base import BatchShape, PrefillChunk
from evinfra.costmodel.node import NodeSpec
from evinfra.costmodel.profile import ProfileTable
from evinfra.costmodel.registry import make_cost_model
from tests.scripts import load_script as load_repo_script


def load_script() -> ModuleType:
    return load_repo_script("benchmarks/gpu_calibration.py", "gpu_calibration")


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("calibration")
    argv = ["--device", "cpu", "--tiny", "--out", str(path), "--repeats", "2"]
    assert load_script().main(argv) == 0
    return path


def test_every_point_measured_with_finite_positive_ratios(out: Path) -> None:
    data = json.loads((out / "calibration.json").read_text())
    assert data["complete"] is True
    assert data["ceilings"]["matmul_tflops"] > 0 and data["ceilings"]["copy_gb_s"] > 0
    points = data["shapes"]["tiny"]["points"]
    labels = [p["label"] for p in points]
    assert labels[:3] == ["prefill 16", "prefill 64", "prefill 128"]
    assert "decode 8 x ctx 128" in labels and labels[-1] == "prefill 32 on 64"
    for p in points:
        assert p["status"] == "ok", p
        for key in ("measured_ms", "roofline_ms", "ratio", "floor_ms", "full_model_ms"):
            assert math.isfinite(p[key]) and p[key] > 0, (p["label"], key)
        assert p["ratio"] == pytest.approx(p["measured_ms"] / p["roofline_ms"])
        parts = p["breakdown"]
        assert parts["proj_ms"] > 0 and parts["mlp_ms"] > 0 and parts["attention_core_ms"] > 0
        assert 0 < p["layers_ms"] <= p["measured_ms"] * 1.5


def test_roofline_prediction_is_the_simulators(out: Path) -> None:
    data = json.loads((out / "calibration.json").read_text())
    point = next(p for p in data["shapes"]["tiny"]["points"] if p["label"] == "decode 4 x ctx 32")
    node = NodeSpec.from_names("tiny", "h200", 1, kv_dtype="bf16", block_size=16)
    batch = BatchShape(num_decode_seqs=4, num_decode_context_tokens=128, num_kv_tokens_in_use=128)
    expected_ms = make_cost_model("roofline", node).step_time_s(batch) * 1e3
    assert point["roofline_ms"] == pytest.approx(expected_ms)


def test_profile_table_loads_and_drives_the_profile_cost_model(out: Path) -> None:
    table = ProfileTable.load(out / "profile-tiny.json")
    assert table.prefill_tokens == (16.0, 64.0, 128.0)  # the chunk on a cached prefix is not
    assert table.decode_batch_sizes == (1.0, 4.0, 8.0)
    assert table.decode_context_tokens == (32.0, 128.0)
    assert "tiny ran 2 of 2 layers" in table.source
    node = NodeSpec.from_names("tiny", "h200", 1)
    model = make_cost_model("profile", node, table_path=str(out / "profile-tiny.json"))
    mixed = BatchShape((PrefillChunk(64, 0),), num_decode_seqs=4, num_decode_context_tokens=256)
    assert table.covers(mixed)
    assert model.step_time_s(mixed) > 0
    assert model.decode_run_time_s(4, 256, 256, 10) > 0


def test_report_has_a_row_per_point(out: Path) -> None:
    report = (out / "report.md").read_text()
    assert "| step | measured ms | roofline ms | ratio |" in report
    assert report.count("| decode ") == 6 and "| prefill 32 on 64 |" in report


def test_full_model_scales_only_the_layers() -> None:
    script = load_script()
    assert script.full_model_ms(outside_ms=2.0, layers_ms=8.0, num_layers=8, full=80) == 82.0


def test_profile_fills_a_decode_hole_linearly_in_context() -> None:
    script = load_script()
    filled, holes = script.fill_row([10.0, 20.0, None], [1000, 2000, 4000])
    assert filled == [10.0, 20.0, 40.0] and holes == [2]


def test_an_oom_is_recorded_and_skips_no_smaller_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    script = load_script()
    measure = script.measure_point

    def failing(ex, works, args, budget):  # type: ignore[no-untyped-def]
        if len(works) == 4 and works[0].num_computed_tokens == 31:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return measure(ex, works, args, budget)

    monkeypatch.setattr(script, "measure_point", failing)
    assert script.main(["--device", "cpu", "--tiny", "--out", str(tmp_path), "--repeats", "1"]) == 0
    points = json.loads((tmp_path / "calibration.json").read_text())["shapes"]["tiny"]["points"]
    status = {p["label"]: p["status"] for p in points}
    assert status["decode 1 x ctx 32"] == "ok" and status["decode 4 x ctx 32"] == "oom"
    larger = ("decode 8 x ctx 32", "decode 1 x ctx 128", "decode 4 x ctx 128")
    assert all(status[label] == "skipped" for label in larger)
    assert status["prefill 128"] == "ok" and status["prefill 32 on 64"] == "ok"
    assert "oom: OutOfMemoryError" in (tmp_path / "report.md").read_text()
