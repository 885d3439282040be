"""Computer-use agents (OSWorld-style): one screenshot per step, short outputs (a thought
and an action), a few seconds of action execution, tens of steps, and keep-last-K
screenshot truncation that cuts the prefix after the system prompt and task. Cited in
docs/workloads.md.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from evinfra.core.blocks import Segment
from evinfra.workloads.agent_loop import LoopSpec, run_steps
from evinfra.workloads.dists import LogNormal, Uniform, draw_tokens
from evinfra.workloads.ids import NS_GENERATED, IdSource, mix64, shared_id, text_key
from evinfra.workloads.session import ItemKind, SessionBuilder
from evinfra.workloads.types import SessionPlan

KIND = "computer-use"
_KIND_KEY = text_key(KIND)


@dataclass(frozen=True, slots=True)
class ComputerUseParams:
    system_tokens: int = 2_500
    task_median_tokens: float = 80.0
    min_steps: int = 15
    max_steps: int = 50
    screenshot_min_tokens: int = 1_000
    screenshot_max_tokens: int = 3_000
    """A session's screenshots share one resolution: its size is drawn once per session."""
    keep_last_screenshots: int = 3
    drop_chunk: int = 1
    """Drop old screenshots only once this many are over the limit (fewer prefix breaks)."""
    output_median_tokens: float = 150.0
    output_sigma: float = 0.6
    max_output_tokens: int = 2_000
    action_min_s: float = 1.0
    action_max_s: float = 5.0
    tool_hint_sigma: float = 0.3

    def __post_init__(self) -> None:
        if not 1 <= self.min_steps <= self.max_steps:
            raise ValueError("need 1 <= min_steps <= max_steps")
        if not 0 < self.screenshot_min_tokens <= self.screenshot_max_tokens:
            raise ValueError("need 0 < screenshot_min_tokens <= screenshot_max_tokens")
        if self.keep_last_screenshots < 1 or self.drop_chunk < 1:
            raise ValueError("keep_last_screenshots and drop_chunk must be at least 1")


class ComputerUseGenerator:
    kind = KIND

    def __init__(self, params: ComputerUseParams, seed: int) -> None:
        p = params
        self.params = params
        self.seed = seed
        self._system = Segment(shared_id(_KIND_KEY, 1, p.system_tokens), p.system_tokens)
        self._task = LogNormal.from_median(p.task_median_tokens, 0.6, 10, 2_000)

    def session(self, index: int, session_id: str) -> SessionPlan:
        p = self.params
        rng = random.Random(mix64(self.seed, _KIND_KEY, index))
        ids = IdSource(NS_GENERATED, _KIND_KEY, self.seed, index)
        screenshot_tokens = rng.randint(p.screenshot_min_tokens, p.screenshot_max_tokens)
        spec = LoopSpec(
            output_tokens=LogNormal.from_median(
                p.output_median_tokens, p.output_sigma, 1, p.max_output_tokens
            ),
            observation_tokens=Uniform(screenshot_tokens, screenshot_tokens),
            tool_s=Uniform(p.action_min_s, p.action_max_s),
            observation_kind=ItemKind.SCREENSHOT,
            tool_hint_sigma=p.tool_hint_sigma,
            keep_last=p.keep_last_screenshots,
            drop_chunk=p.drop_chunk,
        )
        head = (self._system, Segment(ids.fresh(), draw_tokens(self._task, rng)))
        b = SessionBuilder(session_id, KIND, ids, head)
        b.add(ItemKind.SCREENSHOT, screenshot_tokens)
        run_steps(b, rng, spec, rng.randint(p.min_steps, p.max_steps))
        return b.build()
