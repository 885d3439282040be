"""Catalog of models and accelerators, and cost models that turn a batch into a step time."""
