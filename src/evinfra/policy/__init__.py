"""Policies (router, planner, KV manager) and the system bundles built from them."""
