"""Imports every module that registers a system bundle."""

from evinfra.policy import aggregated, oracle, simple  # noqa: F401
from evinfra.policy.dynamo import bundles  # noqa: F401
from evinfra.policy.evolving import bundle  # noqa: F401
