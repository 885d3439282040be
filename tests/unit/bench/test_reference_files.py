"""benchmarks/reference/make_reference.py: the shipped reference files are what it writes,
and each `-stable` companion differs from its 256-GPU file only in the rate (dynamo's own
goodput there, below the 64-GPU rate scaled) and the text that says so."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import yaml

from tests.scripts import load_script

REFERENCE = Path(__file__).resolve().parents[3] / "benchmarks" / "reference"


def load() -> ModuleType:
    return load_script("benchmarks/reference/make_reference.py", "make_reference")


def test_shipped_files_are_the_generators_output() -> None:
    expected = load().all_scenarios()
    names = {str(data["name"]) for data in expected}
    assert names == {p.stem for p in REFERENCE.glob("*.yaml")}
    for data in expected:
        shipped = yaml.safe_load((REFERENCE / f"{data['name']}.yaml").read_text())
        assert shipped == data, f"{data['name']}: rerun make_reference.py"


def test_stable_companions_sit_below_the_scaled_rate() -> None:
    mod = load()
    assert mod.STABLE_RATE_AT_256_GPUS
    for model, workload in mod.STABLE_RATE_AT_256_GPUS:
        scaled = mod.scenario(model, workload, mod.STABLE_NUM_GPUS)
        stable = mod.scenario(model, workload, mod.STABLE_NUM_GPUS, stable=True)
        assert stable["name"] == f"{scaled['name']}-stable"
        assert stable["base"]["session_rate"] < scaled["base"]["session_rate"]
        assert {k: v for k, v in stable["base"].items() if k != "session_rate"} == {
            k: v for k, v in scaled["base"].items() if k != "session_rate"
        }
        assert "-stable" in scaled["description"]
        assert "goodput" in stable["description"]


def test_stable_rate_refused_at_another_cluster_size() -> None:
    mod = load()
    model, workload = next(iter(mod.STABLE_RATE_AT_256_GPUS))
    with pytest.raises(ValueError, match="256 GPUs, not 64"):
        mod.scenario(model, workload, 64, stable=True)
