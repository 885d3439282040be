"""The roofline defaults reproduce the published serving figures within about 30%."""

from __future__ import annotations

from types import ModuleType

import pytest

from evinfra.costmodel.catalog import get_gpu, get_model
from evinfra.costmodel.roofline import RooflineEfficiency
from evinfra.costmodel.spec import Dtype
from tests.scripts import load_script as load_repo_script


def load_script() -> ModuleType:
    return load_repo_script("benchmarks/costmodel_calibration.py", "costmodel_calibration")


def test_published_figures_within_30_percent() -> None:
    script = load_script()
    table = script.rows(RooflineEfficiency())
    held = [(case, ratio) for case, _, ratio in table if not case.excluded]
    assert len(held) >= 8
    for case, ratio in held:
        assert 0.7 <= ratio <= 1.3, f"{case.setup}: ratio {ratio:.2f}"


def test_excluded_kimi_prefill_figure_exceeds_physics() -> None:
    script = load_script()
    excluded = [case for case in script.CASES if case.excluded]
    assert [case.setup for case in excluded] == ["SGLang Kimi K2, 128 H200, prefill 4 nodes"]
    flops_needed = 2 * get_model("kimi-k2").derived_params_active * excluded[0].published
    assert flops_needed > 0.9 * get_gpu("h200").flops(Dtype.FP8)


def test_defaults_are_physically_plausible() -> None:
    eff = RooflineEfficiency()
    assert 0.4 <= eff.prefill_flops <= 0.7
    assert 0.6 <= eff.hbm <= 0.85
    assert eff.decode_flops <= eff.prefill_flops
    assert eff.step_overhead_s == pytest.approx(2e-3)
