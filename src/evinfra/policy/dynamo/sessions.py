"""Router-side agent state of `dynamo-agentic`: session affinity and expected output load.

Session affinity source: Dynamo `docs/components/router/router-configuration.md` ("Session
Affinity"): the first dispatched request binds a session id to its worker; later requests of
the session go to that worker; active requests prevent expiry; the idle timer (the TTL)
restarts when a request ends; a binding to a worker that is gone is dropped and the next
selection rebinds. Prefill and decode keep separate, phase-local bindings.

Expected output (`agent_hints.osl`) source: `router-concepts.md` ("Decode Load Modeling"):
with `--router-track-output-blocks` the router counts a request's output blocks in its
worker's decode load. evinfra's router sees no token progress, so it counts the expected
output blocks of every active request in full until the request finishes (Dynamo decays
them as generation approaches `osl`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from evinfra.core.types import Request
from evinfra.policy.dynamo.cost import Phase


@dataclass(slots=True)
class _Binding:
    node_id: int
    idle_since_s: float


class SessionAffinity:
    """Sticky `(session id, phase) -> node` bindings with an idle TTL."""

    def __init__(self, ttl_s: float) -> None:
        if ttl_s <= 0:
            raise ValueError(f"session affinity ttl_s must be > 0, got {ttl_s}")
        self.ttl_s = ttl_s
        self._bindings: dict[str, dict[Phase, _Binding]] = {}
        self._num_active: dict[str, int] = {}

    def lookup(self, session_id: str, phase: Phase, now_s: float) -> int | None:
        """The bound node, or None when unbound or expired (an expired binding is dropped)."""
        binding = self._bindings.get(session_id, {}).get(phase)
        if binding is None:
            return None
        if self._num_active.get(session_id, 0) == 0 and now_s >= binding.idle_since_s + self.ttl_s:
            self.invalidate(session_id, phase)
            return None
        return binding.node_id

    def bind(self, session_id: str, phase: Phase, node_id: int, now_s: float) -> None:
        self._bindings.setdefault(session_id, {})[phase] = _Binding(node_id, now_s)

    def invalidate(self, session_id: str, phase: Phase) -> None:
        phases = self._bindings.get(session_id)
        if phases is not None:
            phases.pop(phase, None)
            if not phases:
                del self._bindings[session_id]

    def dispatched(self, session_id: str) -> None:
        self._num_active[session_id] = self._num_active.get(session_id, 0) + 1

    def released(self, session_id: str, now_s: float) -> None:
        """A request of the session ended: its idle timers restart when none is active."""
        left = self._num_active.get(session_id, 0) - 1
        if left > 0:
            self._num_active[session_id] = left
            return
        self._num_active.pop(session_id, None)
        for binding in self._bindings.get(session_id, {}).values():
            binding.idle_since_s = now_s

    def num_bindings(self) -> int:
        return sum(len(phases) for phases in self._bindings.values())


class OutputLoad:
    """Expected output blocks of active requests, per decode node (the `osl` hint)."""

    def __init__(self) -> None:
        self._by_request: dict[int, tuple[int, int]] = {}
        self._by_node: dict[int, int] = {}

    def add(self, request: Request, node_id: int, block_size: int) -> None:
        hints = request.hints
        if hints is None or hints.expected_output_tokens is None:
            return
        num_blocks = math.ceil(hints.expected_output_tokens / block_size)
        self._by_request[request.request_id] = (node_id, num_blocks)
        self._by_node[node_id] = self._by_node.get(node_id, 0) + num_blocks

    def remove(self, request_id: int) -> None:
        entry = self._by_request.pop(request_id, None)
        if entry is None:
            return
        node_id, num_blocks = entry
        self._by_node[node_id] -= num_blocks
        if self._by_node[node_id] == 0:
            del self._by_node[node_id]

    def num_blocks(self, node_id: int) -> int:
        return self._by_node.get(node_id, 0)


class AgentRouterState:
    """What the router and the KV manager of `dynamo-agentic` share: the router records
    dispatches, the KV manager's `on_finish` reports ends."""

    def __init__(self, affinity: SessionAffinity | None, track_output: bool) -> None:
        self.affinity = affinity
        self.output = OutputLoad() if track_output else None

    def finished(self, request: Request, now_s: float) -> None:
        if self.output is not None:
            self.output.remove(request.request_id)
        if self.affinity is not None and request.session_id is not None:
            self.affinity.released(request.session_id, now_s)
