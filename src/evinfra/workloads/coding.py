"""Coding agents: long shared system prompt and tool definitions, many short-output calls
separated by tool runs, input growing to tens of thousands of tokens, compaction near the
window limit, occasional human turns.

Two populations, mixed by `interactive_share`:
- autonomous SWE-bench-style sessions (one task, ~40 calls): calibrated on one SWE-bench
  Verified run of a bash-only agent (500 sessions, WORKLOADS.md);
- interactive Claude Code / Codex-style sessions (human turns, each a run of steps, long
  contexts, compaction at ~167k of a 200k window, sub-agents): calibrated on TraceLab
  (4,265 sessions, arXiv 2606.30560). `profile="tracelab"` makes every session one.
Every figure below is cited in docs/workloads.md.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from evinfra.core.blocks import Segment
from evinfra.workloads.agent_loop import LoopSpec, run_steps
from evinfra.workloads.dists import (
    LogNormal,
    LogNormalParetoTail,
    OneOrLogNormal,
    UniformInt,
    draw_tokens,
)
from evinfra.workloads.ids import NS_GENERATED, IdSource, mix64, shared_id, text_key
from evinfra.workloads.session import ItemKind, SessionBuilder
from evinfra.workloads.types import SessionPlan

KIND = "coding"
_KIND_KEY = text_key(KIND)


@dataclass(frozen=True, slots=True)
class CodingParams:
    interactive_share: float = 0.05
    """Share of sessions that are interactive (TraceLab-like); the rest are autonomous."""

    # Autonomous, SWE-bench-style (calls: median 36, mean 40, max 145; input mean 16.5k,
    # median 14k, p95 38k; output median 90, mean 276, p95 1,038).
    swe_system_tokens: int = 2_000
    swe_tools_tokens: int = 500
    swe_task_median_tokens: float = 450.0
    swe_calls_median: float = 36.0
    swe_calls_sigma: float = 0.46
    swe_max_calls: int = 150
    swe_output_median_tokens: float = 90.0
    swe_output_sigma: float = 1.5
    swe_observation_median_tokens: float = 130.0
    swe_observation_sigma: float = 1.3
    keep_last_observations: int = 0
    """Older SWE-agent configurations kept the last 5 observations; 0 keeps all."""

    # Interactive, TraceLab-style (human turns per session: median 1, mean 9.2, p90 18,
    # p99 137; steps per turn: median 1, mean 7.8, p90 20, p99 86; output mean ~520).
    tl_system_tokens: int = 12_000
    tl_tools_tokens: int = 8_000
    tl_task_median_tokens: float = 300.0
    tl_turns_p_one: float = 0.5
    tl_turns_mu: float = 1.48
    tl_turns_sigma: float = 1.675
    tl_max_turns: int = 150
    tl_steps_p_one: float = 0.5
    tl_steps_mu: float = 1.99
    tl_steps_sigma: float = 1.2
    tl_max_steps: int = 200
    tl_output_median_tokens: float = 140.0
    tl_output_sigma: float = 1.6
    tl_observation_median_tokens: float = 600.0
    tl_observation_sigma: float = 1.4
    tl_user_median_tokens: float = 120.0
    tl_fork_prob_per_call: float = 0.02
    tl_fork_max_children: int = 3
    tl_child_calls_median: float = 8.0

    # Both populations.
    max_output_tokens: int = 16_384
    max_observation_tokens: int = 25_000
    tool_mu: float = -1.20
    tool_sigma: float = 2.98
    tool_max_s: float = 600.0
    human_mu: float = 4.43
    human_sigma: float = 2.10
    human_tail_quantile: float = 0.95
    human_tail_alpha: float = 0.55
    human_max_s: float = 3_600.0
    tool_hint_sigma: float = 0.5
    context_window_tokens: int = 200_000
    compact_at_tokens: int = 167_000
    summary_median_tokens: float = 3_000.0
    compact_instruction_tokens: int = 300

    def __post_init__(self) -> None:
        if not 0.0 <= self.interactive_share <= 1.0:
            raise ValueError(f"interactive_share must be in [0, 1], got {self.interactive_share}")
        if self.compact_at_tokens > self.context_window_tokens:
            raise ValueError("compact_at_tokens must not exceed context_window_tokens")


PROFILES: dict[str, dict[str, object]] = {
    "default": {},
    "swe": {"interactive_share": 0.0},
    "tracelab": {"interactive_share": 1.0},
}


class CodingGenerator:
    """Draws coding sessions; session `index` depends only on (params, seed, index)."""

    kind = KIND

    def __init__(self, params: CodingParams, seed: int) -> None:
        self.params = params
        self.seed = seed
        p = params
        self._tool_s = LogNormal(p.tool_mu, p.tool_sigma, 0.0, p.tool_max_s)
        self._human_s = LogNormalParetoTail(
            p.human_mu, p.human_sigma, p.human_tail_quantile, p.human_tail_alpha, p.human_max_s
        )
        instruction = Segment(
            shared_id(_KIND_KEY, 3, p.compact_instruction_tokens), p.compact_instruction_tokens
        )
        common = {
            "tool_s": self._tool_s,
            "tool_hint_sigma": p.tool_hint_sigma,
            "compact_at_tokens": p.compact_at_tokens,
            "window_tokens": p.context_window_tokens,
            "summary_tokens": LogNormal.from_median(p.summary_median_tokens, 0.4, 500, 10_000),
            "compact_instruction": instruction,
        }
        self._swe_head = self._shared_head(10, p.swe_system_tokens, p.swe_tools_tokens)
        self._swe_loop = LoopSpec(
            output_tokens=LogNormal.from_median(
                p.swe_output_median_tokens, p.swe_output_sigma, 1, p.max_output_tokens
            ),
            observation_tokens=LogNormal.from_median(
                p.swe_observation_median_tokens,
                p.swe_observation_sigma,
                1,
                p.max_observation_tokens,
            ),
            keep_last=p.keep_last_observations or None,
            **common,  # type: ignore[arg-type]
        )
        self._tl_head = self._shared_head(20, p.tl_system_tokens, p.tl_tools_tokens)
        self._tl_loop = LoopSpec(
            output_tokens=LogNormal.from_median(
                p.tl_output_median_tokens, p.tl_output_sigma, 1, p.max_output_tokens
            ),
            observation_tokens=LogNormal.from_median(
                p.tl_observation_median_tokens,
                p.tl_observation_sigma,
                1,
                p.max_observation_tokens,
            ),
            fork_prob_per_call=p.tl_fork_prob_per_call,
            fork_children=UniformInt(1, p.tl_fork_max_children),
            child_calls=LogNormal.from_median(p.tl_child_calls_median, 0.5, 1, 60),
            child_task=LogNormal.from_median(300, 0.5, 50, 3_000),
            **common,  # type: ignore[arg-type]
        )
        self._swe_calls = LogNormal(
            math.log(p.swe_calls_median), p.swe_calls_sigma, 1, p.swe_max_calls
        )
        self._tl_turns = OneOrLogNormal(
            p.tl_turns_p_one, p.tl_turns_mu, p.tl_turns_sigma, p.tl_max_turns
        )
        self._tl_steps = OneOrLogNormal(
            p.tl_steps_p_one, p.tl_steps_mu, p.tl_steps_sigma, p.tl_max_steps
        )

    @staticmethod
    def _shared_head(role: int, system_tokens: int, tools_tokens: int) -> tuple[Segment, ...]:
        # Shared by every coding session of this harness, whatever the seed: a harness
        # sends the same system prompt and tool definitions to everyone.
        return (
            Segment(shared_id(_KIND_KEY, role, system_tokens), system_tokens),
            Segment(shared_id(_KIND_KEY, role + 1, tools_tokens), tools_tokens),
        )

    def session(self, index: int, session_id: str) -> SessionPlan:
        rng = random.Random(mix64(self.seed, _KIND_KEY, index))
        ids = IdSource(NS_GENERATED, _KIND_KEY, self.seed, index)
        if rng.random() < self.params.interactive_share:
            return self._interactive(rng, ids, session_id)
        return self._autonomous(rng, ids, session_id)

    def _autonomous(self, rng: random.Random, ids: IdSource, session_id: str) -> SessionPlan:
        p = self.params
        task = LogNormal.from_median(p.swe_task_median_tokens, 0.6, 50, 8_000)
        head = (*self._swe_head, Segment(ids.fresh(), draw_tokens(task, rng)))
        b = SessionBuilder(session_id, KIND, ids, head)
        run_steps(b, rng, self._swe_loop, max(1, round(self._swe_calls.draw(rng))))
        return b.build()

    def _interactive(self, rng: random.Random, ids: IdSource, session_id: str) -> SessionPlan:
        p = self.params
        task = LogNormal.from_median(p.tl_task_median_tokens, 0.8, 20, 8_000)
        head = (*self._tl_head, Segment(ids.fresh(), draw_tokens(task, rng)))
        b = SessionBuilder(session_id, KIND, ids, head)
        user = LogNormal.from_median(p.tl_user_median_tokens, 1.0, 5, 8_000)
        for turn in range(round(self._tl_turns.draw(rng))):
            num_steps = round(self._tl_steps.draw(rng))
            if turn == 0:
                run_steps(b, rng, self._tl_loop, num_steps)
                continue
            b.add(ItemKind.USER, draw_tokens(user, rng))
            run_steps(b, rng, self._tl_loop, num_steps, first_think_s=self._human_s.draw(rng))
        return b.build()
