"""Imports every module that registers a system bundle."""

from evinfra.policy import simple  # noqa: F401
