"""Closed-loop session driving: a call is sent when its predecessor (and the sub-agents
it forked) finished and its think time has passed."""

from __future__ import annotations

from dataclasses import dataclass

from evinfra.workloads.types import SessionPlan


@dataclass(slots=True)
class SessionRun:
    plan: SessionPlan
    parent: SessionRun | None
    top_level: bool
    next_call: int = 0
    pending_children: int = 0
    num_calls_sent: int = 0

    @property
    def kind(self) -> str:
        return self.plan.kind

    @property
    def has_next(self) -> bool:
        return self.next_call < len(self.plan.calls)
