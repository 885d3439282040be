"""The evolving system: in-place role switching, an online PD planner, an agent-aware KV
manager. Each mechanism can be switched off alone (ablations)."""
