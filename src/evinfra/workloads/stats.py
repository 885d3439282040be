"""Statistics of a workload: what `evinfra workload stats` prints.

Computed from the session plans alone (no server): per-call lengths, gaps, prefix reuse
at a block size, and the context events the plans carry.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass

from evinfra.core.blocks import common_prefix_len
from evinfra.core.types import ContextEvent
from evinfra.workloads.requests import PrefixHashCache, make_request
from evinfra.workloads.types import SessionArrival, SessionPlan


@dataclass(frozen=True, slots=True)
class Distribution:
    count: int
    mean: float
    p50: float
    p90: float
    p95: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Distribution:
        xs = sorted(values)
        if not xs:
            return cls(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        return cls(
            count=len(xs),
            mean=sum(xs) / len(xs),
            p50=quantile(xs, 0.50),
            p90=quantile(xs, 0.90),
            p95=quantile(xs, 0.95),
            p99=quantile(xs, 0.99),
            max=xs[-1],
        )


def quantile(sorted_xs: list[float], q: float) -> float:
    """Linear-interpolated quantile of an already sorted list."""
    if not sorted_xs:
        return 0.0
    pos = q * (len(sorted_xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class WorkloadStats:
    block_size: int
    num_sessions: int
    num_sub_sessions: int
    num_calls: int
    calls_per_session: Distribution
    """Calls of a top-level session, its sub-agents' calls included."""
    input_tokens: Distribution
    output_tokens: Distribution
    new_input_tokens: Distribution
    """Prompt tokens not covered by the session's previous prompt and output (block
    granularity): what a per-session cache would have to prefill."""
    gap_s: Distribution
    """Waits before calls other than a session's first (tool and human time)."""
    session_wait_s: Distribution
    """A session's summed waits: its duration on an infinitely fast server."""
    session_reuse_ratio: float
    """Share of prompt tokens found in the same session's previous call (prompt+output)."""
    global_reuse_ratio: float
    """Share of prompt tokens whose block was seen earlier in any call (an infinite cache)."""
    num_compactions: int
    num_truncations: int
    num_forks: int
    compacting_session_share: float
    compactions_per_compacting_session: float
    truncating_session_share: float

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _walk(plan: SessionPlan) -> Iterator[tuple[SessionPlan, int]]:
    """(plan, call index) of a session and its sub-agents, each fork after its call."""
    for i, call in enumerate(plan.calls):
        yield plan, i
        for child in call.forks:
            yield from _walk(child)


def workload_stats(arrivals: Iterable[SessionArrival], block_size: int = 64) -> WorkloadStats:
    cache = PrefixHashCache()
    seen: set[int] = set()
    inputs: list[float] = []
    outputs: list[float] = []
    new_inputs: list[float] = []
    gaps: list[float] = []
    calls_per_session: list[float] = []
    waits: list[float] = []
    events = dict.fromkeys(ContextEvent, 0)
    compactions_by_session: list[int] = []
    num_truncating = 0
    num_sub = 0
    reused_session = reused_global = total_prompt = 0
    request_id = 0
    for arrival in arrivals:
        previous: dict[str, tuple[int, ...]] = {}
        num_calls = 0
        wait_s = 0.0
        compactions = truncations = 0
        for plan, i in _walk(arrival.plan):
            call = plan.calls[i]
            req = make_request(request_id, plan, i, block_size, False, cache=cache)
            request_id += 1
            num_calls += 1
            if i == 0 and plan.parent_session_id is not None:
                num_sub += 1
            prompt = req.prompt_hashes
            # A sub-agent's first prompt continues its parent's context.
            before = previous.get(plan.session_id) or previous.get(plan.parent_session_id or "", ())
            own = common_prefix_len(prompt, before)
            new_inputs.append(req.num_prompt_tokens - own * block_size)
            reused_session += own * block_size
            hit = 0
            while hit < len(prompt) and prompt[hit] in seen:
                hit += 1
            reused_global += hit * block_size
            seen.update(prompt)
            seen.update(req.output_hashes)
            previous[plan.session_id] = prompt + req.output_hashes
            total_prompt += req.num_prompt_tokens
            inputs.append(req.num_prompt_tokens)
            outputs.append(call.num_output_tokens)
            events[call.context_event] += 1
            compactions += call.context_event is ContextEvent.COMPACT
            truncations += call.context_event is ContextEvent.TRUNCATE
            if i > 0:
                gaps.append(call.think_s)
            if plan.parent_session_id is None:
                wait_s += call.think_s
        calls_per_session.append(num_calls)
        waits.append(wait_s)
        compactions_by_session.append(compactions)
        num_truncating += truncations > 0
    compacting = [c for c in compactions_by_session if c > 0]
    num_sessions = len(calls_per_session)
    return WorkloadStats(
        block_size=block_size,
        num_sessions=num_sessions,
        num_sub_sessions=num_sub,
        num_calls=len(inputs),
        calls_per_session=Distribution.of(calls_per_session),
        input_tokens=Distribution.of(inputs),
        output_tokens=Distribution.of(outputs),
        new_input_tokens=Distribution.of(new_inputs),
        gap_s=Distribution.of(gaps),
        session_wait_s=Distribution.of(waits),
        session_reuse_ratio=reused_session / total_prompt if total_prompt else 0.0,
        global_reuse_ratio=reused_global / total_prompt if total_prompt else 0.0,
        num_compactions=events[ContextEvent.COMPACT],
        num_truncations=events[ContextEvent.TRUNCATE],
        num_forks=events[ContextEvent.FORK],
        compacting_session_share=len(compacting) / num_sessions if num_sessions else 0.0,
        compactions_per_compacting_session=(
            sum(compacting) / len(compacting) if compacting else 0.0
        ),
        truncating_session_share=num_truncating / num_sessions if num_sessions else 0.0,
    )


_DIST_ROWS = (
    ("calls per session", "calls_per_session", "{:.1f}"),
    ("input tokens / call", "input_tokens", "{:.0f}"),
    ("new input tokens / call", "new_input_tokens", "{:.0f}"),
    ("output tokens / call", "output_tokens", "{:.0f}"),
    ("gap before call (s)", "gap_s", "{:.2f}"),
    ("session waits (s)", "session_wait_s", "{:.0f}"),
)


def format_stats(stats: WorkloadStats) -> str:
    """A readable table of `stats`."""
    cols = ("mean", "p50", "p90", "p95", "p99", "max")
    lines = [
        f"sessions {stats.num_sessions} (+{stats.num_sub_sessions} sub-agents), "
        f"calls {stats.num_calls}, block size {stats.block_size}",
        f"{'':26}" + "".join(f"{c:>10}" for c in cols),
    ]
    for label, field, fmt in _DIST_ROWS:
        dist: Distribution = getattr(stats, field)
        lines.append(f"{label:26}" + "".join(f"{fmt.format(getattr(dist, c)):>10}" for c in cols))
    lines += [
        f"prefix reuse: session {stats.session_reuse_ratio:.1%}, "
        f"global {stats.global_reuse_ratio:.1%}",
        f"compactions {stats.num_compactions} (sessions {stats.compacting_session_share:.1%}, "
        f"{stats.compactions_per_compacting_session:.1f} each), "
        f"truncations {stats.num_truncations} (sessions {stats.truncating_session_share:.1%}), "
        f"forks {stats.num_forks}",
    ]
    return "\n".join(lines)
