"""Cost models by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from evinfra.costmodel.dynamo_polynomial import DynamoPolynomialCostModel
from evinfra.costmodel.node import NodeSpec
from evinfra.costmodel.profile import ProfileCostModel, ProfileTable
from evinfra.costmodel.registry import COST_MODELS, make_cost_model
from evinfra.costmodel.roofline import RooflineCostModel

NODE = NodeSpec.from_names("tiny", "h100", 1)


def test_names() -> None:
    assert sorted(COST_MODELS) == ["dynamo-polynomial", "profile", "roofline"]


def test_roofline_with_options() -> None:
    model = make_cost_model("roofline", NODE, hbm=0.5, step_overhead_s=0.0)
    assert isinstance(model, RooflineCostModel)
    assert model.efficiency.hbm == 0.5 and model.efficiency.step_overhead_s == 0.0
    with pytest.raises(TypeError, match="hbm"):
        make_cost_model("roofline", NODE, bandwidth=0.5)


def test_dynamo_polynomial_with_options() -> None:
    model = make_cost_model("dynamo-polynomial", NODE, speedup_ratio=10.0)
    assert isinstance(model, DynamoPolynomialCostModel) and model.speedup_ratio == 10.0


def test_profile_needs_a_table(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="table_path"):
        make_cost_model("profile", NODE)
    path = tmp_path / "t.json"
    ProfileTable((1.0, 2.0), (1.0, 2.0), (1.0,), (1.0,), ((3.0,),)).save(path)
    model = make_cost_model("profile", NODE, table_path=str(path))
    assert isinstance(model, ProfileCostModel)
    with pytest.raises(TypeError, match="unknown profile options"):
        make_cost_model("profile", NODE, table_path=str(path), speedup_ratio=2.0)


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(KeyError, match="dynamo-polynomial"):
        make_cost_model("vidur", NODE)
