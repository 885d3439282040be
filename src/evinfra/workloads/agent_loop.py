"""The loop shared by the generators: steps separated by tool calls, compaction near the
window, optional keep-last-K truncation, and sub-agent forks."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from evinfra.core.blocks import Segment
from evinfra.workloads.dists import Dist, draw_tokens
from evinfra.workloads.ids import IdSource, mix64
from evinfra.workloads.session import ItemKind, SessionBuilder
from evinfra.workloads.types import SessionPlan

# Room kept in the window for the compaction instruction on top of a tool result.
_SUMMARY_REQUEST_RESERVE = 1_000


@dataclass(frozen=True, slots=True)
class LoopSpec:
    """How one kind of agent behaves between its calls."""

    output_tokens: Dist
    observation_tokens: Dist
    tool_s: Dist
    observation_kind: ItemKind = ItemKind.OBSERVATION
    tool_hint_sigma: float = 0.5
    """Lognormal noise of the client's expected-tool-time hint (0: exact)."""
    compact_at_tokens: int | None = None
    """Compact when the context would reach this many tokens (None: never)."""
    window_tokens: int | None = None
    """The model's context window: a tool result is cut to keep room for the summary
    request (harnesses truncate long tool output)."""
    summary_tokens: Dist | None = None
    compact_instruction: Segment | None = None
    keep_last: int | None = None
    """Keep only the last K items of `observation_kind` (None: keep all)."""
    drop_chunk: int = 1
    fork_prob_per_call: float = 0.0
    fork_children: Dist | None = None
    child_calls: Dist | None = None
    child_task: Dist | None = None


def tool_hint(rng: random.Random, tool_s: float, sigma: float) -> float:
    """What a client expects a tool to take: the true time with lognormal noise."""
    return tool_s if sigma <= 0 else tool_s * math.exp(rng.gauss(0.0, sigma))


def step(
    b: SessionBuilder,
    rng: random.Random,
    spec: LoopSpec,
    think_s: float,
    hint_s: float | None,
    *,
    allow_fork: bool = True,
) -> None:
    """One call of the agent after `think_s` of waiting; staged content is already in `b`.

    Applies truncation, then compaction (a summarisation call whose output replaces the
    history), then the call itself, then possibly forks sub-agents that the next call joins.
    """
    if spec.keep_last is not None:
        b.truncate(spec.observation_kind, spec.keep_last, spec.drop_chunk)
    if spec.compact_at_tokens is not None and b.num_context_tokens >= spec.compact_at_tokens:
        assert spec.summary_tokens is not None and spec.compact_instruction is not None
        b.add_segment(spec.compact_instruction, ItemKind.INSTRUCTION)
        summary = b.call(
            draw_tokens(spec.summary_tokens, rng), think_s, previous_tool_hint_s=hint_s
        )
        b.compact(summary)
        # The harness sends the continuation as soon as the summary is back.
        think_s, hint_s = 0.0, 0.0
    num_output = draw_tokens(spec.output_tokens, rng)
    if spec.window_tokens is not None:
        num_output = max(1, min(num_output, spec.window_tokens - b.num_context_tokens))
    b.call(num_output, think_s, previous_tool_hint_s=hint_s)
    if allow_fork and spec.fork_prob_per_call > 0 and rng.random() < spec.fork_prob_per_call:
        fork(b, rng, spec)


def fork(b: SessionBuilder, rng: random.Random, spec: LoopSpec) -> None:
    """Start sub-agents from the current context and stage their results for a join."""
    assert spec.fork_children is not None and spec.child_calls is not None
    assert spec.child_task is not None
    num_children = max(1, round(spec.fork_children.draw(rng)))
    children: list[SessionPlan] = []
    for j in range(num_children):
        child_id = f"{b.session_id}.{b.num_calls - 1}.{j}"
        child_rng = random.Random(mix64(rng.getrandbits(64), j))
        child = b.fork(child_id, IdSource(child_rng.getrandbits(62)))
        child.add(ItemKind.INSTRUCTION, draw_tokens(spec.child_task, child_rng))
        run_steps(child, child_rng, spec, max(1, round(spec.child_calls.draw(child_rng))))
        children.append(child.build())
    b.join(children)


def run_steps(
    b: SessionBuilder,
    rng: random.Random,
    spec: LoopSpec,
    num_steps: int,
    *,
    first_think_s: float = 0.0,
    first_hint_s: float | None = None,
) -> None:
    """`num_steps` calls: the first after `first_think_s`, the others each after a tool call
    whose result is staged first. Sub-agents fork only from a top-level session."""
    allow_fork = b.parent_session_id is None
    for i in range(num_steps):
        if i == 0:
            think_s, hint_s = first_think_s, first_hint_s
        else:
            think_s = spec.tool_s.draw(rng)
            hint_s = tool_hint(rng, think_s, spec.tool_hint_sigma)
            num_tokens = draw_tokens(spec.observation_tokens, rng)
            if spec.window_tokens is not None:
                room = spec.window_tokens - b.num_context_tokens - _SUMMARY_REQUEST_RESERVE
                num_tokens = max(1, min(num_tokens, room))
            b.add(spec.observation_kind, num_tokens)
        step(b, rng, spec, think_s, hint_s, allow_fork=allow_fork and i < num_steps - 1)
