"""The server's Prometheus metrics: latency histograms, token and request counters, and
per-node gauges rendered from the latest node snapshots. Recording never feeds a decision.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from evinfra.core.types import Role
from evinfra.serve.view import NodeState

LATENCY_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
PREFIX = "evinfra"


@dataclass(slots=True)
class Histogram:
    buckets: tuple[float, ...] = LATENCY_BUCKETS_S
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.buckets, value)
        if i < len(self.counts):
            self.counts[i] += 1
        self.total += value
        self.count += 1

    def render(self, name: str, help_text: str) -> list[str]:
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        running = 0
        for bound, n in zip(self.buckets, self.counts, strict=True):
            running += n
            lines.append(f'{name}_bucket{{le="{bound}"}} {running}')
        lines.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        lines.append(f"{name}_sum {self.total}")
        lines.append(f"{name}_count {self.count}")
        return lines


@dataclass(slots=True)
class ServerMetrics:
    ttft_s: Histogram = field(default_factory=Histogram)
    itl_s: Histogram = field(default_factory=Histogram)
    e2e_s: Histogram = field(default_factory=Histogram)
    num_requests: int = 0
    num_finished: int = 0
    num_failed: int = 0
    num_aborted: int = 0
    num_retried: int = 0
    num_prompt_tokens: int = 0
    num_cached_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_kv_bytes_moved: int = 0
    num_kv_bytes_pulled: int = 0
    num_prefix_pulls: int = 0
    num_role_switches: int = 0
    num_node_failures: int = 0
    num_kv_score_messages: int = 0
    num_kv_scored_hashes: int = 0

    @property
    def kv_hit_rate(self) -> float:
        if not self.num_prompt_tokens:
            return 0.0
        return self.num_cached_prompt_tokens / self.num_prompt_tokens

    def render(self, nodes: Sequence[NodeState]) -> str:
        p = PREFIX
        lines: list[str] = []
        lines += self.ttft_s.render(f"{p}_ttft_seconds", "Time to first token.")
        lines += self.itl_s.render(f"{p}_itl_seconds", "Gap between consecutive output tokens.")
        lines += self.e2e_s.render(f"{p}_e2e_seconds", "End-to-end request latency.")
        counters = (
            ("requests_total", self.num_requests, "Requests received."),
            ("requests_finished_total", self.num_finished, "Requests completed."),
            ("requests_failed_total", self.num_failed, "Requests failed (node error or death)."),
            ("requests_aborted_total", self.num_aborted, "Requests whose client went away."),
            ("requests_retried_total", self.num_retried, "Requests resent after a node died."),
            ("prompt_tokens_total", self.num_prompt_tokens, "Prompt tokens of prefilled requests."),
            ("cached_prompt_tokens_total", self.num_cached_prompt_tokens, "Prompt tokens hit."),
            ("output_tokens_total", self.num_output_tokens, "Output tokens streamed."),
            ("kv_transfer_bytes_total", self.num_kv_bytes_moved, "KV bytes moved between nodes."),
            ("kv_pulled_bytes_total", self.num_kv_bytes_pulled, "Of those, prefixes pulled."),
            ("kv_prefix_pulls_total", self.num_prefix_pulls, "Prefills told to pull a prefix."),
            ("role_switches_total", self.num_role_switches, "Node role changes ordered."),
            ("node_failures_total", self.num_node_failures, "Node processes that died."),
            ("kv_score_messages_total", self.num_kv_score_messages, "Tier messages to nodes."),
            ("kv_scored_hashes_total", self.num_kv_scored_hashes, "Block tiers sent to nodes."),
        )
        for name, value, help_text in counters:
            lines += [f"# HELP {p}_{name} {help_text}", f"# TYPE {p}_{name} counter"]
            lines.append(f"{p}_{name} {value}")
        lines += [
            f"# HELP {p}_kv_hit_rate Cached / prompt tokens.",
            f"# TYPE {p}_kv_hit_rate gauge",
        ]
        lines.append(f"{p}_kv_hit_rate {self.kv_hit_rate}")
        lines += _node_gauges(nodes)
        return "\n".join(lines) + "\n"


def _node_gauges(nodes: Sequence[NodeState]) -> list[str]:
    p = PREFIX
    gauges: list[tuple[str, str, list[tuple[str, float]]]] = [
        ("node_waiting_requests", "Requests queued or prefilling.", []),
        ("node_running_decodes", "Sequences decoding.", []),
        ("node_waiting_prefill_tokens", "Uncached prompt tokens queued.", []),
        ("node_kv_usage", "Fraction of KV blocks in use, by tier.", []),
        ("node_kv_cached_blocks", "Blocks holding reusable content.", []),
        ("node_role", "1 for the node's current role.", []),
        ("node_up", "1 while the node's process is alive and serving.", []),
        ("node_busy_seconds", "Seconds the node's executor has run.", []),
    ]
    for node in nodes:
        s = node.stats
        n = f'node="{node.node_id}"'
        gauges[0][2].append((n, s.num_waiting_requests))
        gauges[1][2].append((n, s.num_running_decodes))
        gauges[2][2].append((n, s.num_waiting_prefill_tokens))
        gauges[3][2].append((f'{n},tier="device"', s.num_used_blocks / s.num_device_blocks))
        gauges[3][2].append((f'{n},tier="host"', 0.0))
        gauges[4][2].append((n, len(s.cached_hashes)))
        for role in Role:
            gauges[5][2].append((f'{n},role="{role.value}"', float(node.role is role)))
        gauges[6][2].append((n, float(node.alive and node.is_serving)))
        gauges[7][2].append((n, s.busy_s))
    lines: list[str] = []
    for name, help_text, samples in gauges:
        lines += [f"# HELP {p}_{name} {help_text}", f"# TYPE {p}_{name} gauge"]
        lines += [f"{p}_{name}{{{labels}}} {value}" for labels, value in samples]
    return lines
