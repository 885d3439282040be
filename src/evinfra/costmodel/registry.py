"""Cost models by name: `make_cost_model("roofline", node, hbm=0.8)`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

from evinfra.costmodel.base import CostModel
from evinfra.costmodel.dynamo_polynomial import DynamoPolynomialCostModel
from evinfra.costmodel.node import NodeSpec
from evinfra.costmodel.profile import ProfileCostModel
from evinfra.costmodel.roofline import RooflineCostModel, RooflineEfficiency


def _roofline(node: NodeSpec, **options: Any) -> CostModel:
    """Options: the fields of `RooflineEfficiency` (prefill_flops, decode_flops, hbm, link,
    comm_overlap, step_overhead_s, layer_overhead_s)."""
    known = {f.name for f in fields(RooflineEfficiency)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"unknown roofline options {unknown}; known: {sorted(known)}")
    return RooflineCostModel(node, RooflineEfficiency(**options))


def _dynamo_polynomial(node: NodeSpec, **options: Any) -> CostModel:
    """Options: speedup_ratio, decode_speedup_ratio, kv_capacity_tokens, utilisation_source."""
    return DynamoPolynomialCostModel(node, **options)


def _profile(node: NodeSpec, table_path: str | None = None, **options: Any) -> CostModel:
    """Options: table_path (required), the JSON table written by `ProfileTable.save`."""
    if options:
        raise TypeError(f"unknown profile options {sorted(options)}; known: ['table_path']")
    if table_path is None:
        raise TypeError("the profile cost model needs a table_path option")
    return ProfileCostModel.from_json(table_path, node)


COST_MODELS: dict[str, Callable[..., CostModel]] = {
    "roofline": _roofline,
    "dynamo-polynomial": _dynamo_polynomial,
    "profile": _profile,
}


def make_cost_model(name: str, node: NodeSpec, **options: Any) -> CostModel:
    """The cost model registered as `name` for `node`; raises KeyError on an unknown name
    and TypeError on an option that model does not take."""
    try:
        factory = COST_MODELS[name]
    except KeyError:
        raise KeyError(f"unknown cost model {name!r}; known: {sorted(COST_MODELS)}") from None
    return factory(node, **options)
