"""What one simulation runs for, and the fixed costs it adds around the engines."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SimSettings:
    horizon_s: float
    warmup_s: float = 0.0
    drain_s: float = 600.0
    sample_interval_s: float = 10.0
    kv_tick_s: float = 1.0
    check_integrity: bool = False
    api_overhead_s: float = 0.0
    """Fixed time from a call being sent to the system seeing it (HTTP, frontend, the
    first token's way back), added to each request's TTFT and end-to-end latency; 0 at
    cluster scale, where it is small against the step times."""
    handoff_overhead_s: float = 0.0
    """Fixed time a disaggregated hand-off adds after its KV transfer and before the decode
    engine has the request (the protocol's messages between the engines)."""
    first_token_on_decode_step: bool = False
    """After a hand-off, the first token is the decode engine's first step's (Dynamo: the
    decode worker streams from its first pass), not the prefill's at the KV's arrival."""
