"""Math agents: reasoning with a code interpreter (ReTool-style).

Few turns (1-5), short prompts, long reasoning outputs, short interpreter calls: the
decode-heavy opposite of coding. A session's response (its outputs summed over turns) is
about 6-10k tokens with a tail to the 32k generation budget (ReTool, WORKLOADS.md); the
model stops at each code block, the interpreter runs (0.1-2 s), its result is appended,
and generation continues in the next call. Cited in docs/workloads.md.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from evinfra.core.blocks import Segment
from evinfra.workloads.agent_loop import tool_hint
from evinfra.workloads.dists import LogNormal, Uniform, draw_tokens
from evinfra.workloads.ids import NS_GENERATED, IdSource, mix64, shared_id, text_key
from evinfra.workloads.session import ItemKind, SessionBuilder
from evinfra.workloads.types import SessionPlan

KIND = "math"
_KIND_KEY = text_key(KIND)


@dataclass(frozen=True, slots=True)
class MathParams:
    system_tokens: int = 400
    tools_tokens: int = 300
    problem_median_tokens: float = 150.0
    min_turns: int = 1
    max_turns: int = 5
    response_median_tokens: float = 8_000.0
    response_sigma: float = 0.45
    max_response_tokens: int = 32_768
    split_response_across_turns: bool = True
    """True: a session's response is shared among its turns (ReTool's figure is per
    response). False: every call draws a whole response (more decode-heavy)."""
    code_result_median_tokens: float = 80.0
    code_result_sigma: float = 1.0
    max_code_result_tokens: int = 4_000
    tool_min_s: float = 0.1
    tool_max_s: float = 2.0
    tool_hint_sigma: float = 0.3

    def __post_init__(self) -> None:
        if not 1 <= self.min_turns <= self.max_turns:
            raise ValueError("need 1 <= min_turns <= max_turns")
        if not 0 <= self.tool_min_s <= self.tool_max_s:
            raise ValueError("need 0 <= tool_min_s <= tool_max_s")


class MathGenerator:
    kind = KIND

    def __init__(self, params: MathParams, seed: int) -> None:
        p = params
        self.params = params
        self.seed = seed
        self._head = (
            Segment(shared_id(_KIND_KEY, 1, p.system_tokens), p.system_tokens),
            Segment(shared_id(_KIND_KEY, 2, p.tools_tokens), p.tools_tokens),
        )
        self._problem = LogNormal.from_median(p.problem_median_tokens, 0.6, 20, 4_000)
        self._response = LogNormal.from_median(
            p.response_median_tokens, p.response_sigma, 64, p.max_response_tokens
        )
        self._code_result = LogNormal.from_median(
            p.code_result_median_tokens, p.code_result_sigma, 1, p.max_code_result_tokens
        )
        self._tool_s = Uniform(p.tool_min_s, p.tool_max_s)

    def session(self, index: int, session_id: str) -> SessionPlan:
        p = self.params
        rng = random.Random(mix64(self.seed, _KIND_KEY, index))
        ids = IdSource(NS_GENERATED, _KIND_KEY, self.seed, index)
        head = (*self._head, Segment(ids.fresh(), draw_tokens(self._problem, rng)))
        b = SessionBuilder(session_id, KIND, ids, head)
        num_turns = rng.randint(p.min_turns, p.max_turns)
        for turn, num_output in enumerate(self._outputs(rng, num_turns)):
            if turn == 0:
                b.call(num_output, 0.0)
                continue
            tool_s = self._tool_s.draw(rng)
            b.add(ItemKind.OBSERVATION, draw_tokens(self._code_result, rng))
            b.call(
                num_output,
                tool_s,
                previous_tool_hint_s=tool_hint(rng, tool_s, p.tool_hint_sigma),
            )
        return b.build()

    def _outputs(self, rng: random.Random, num_turns: int) -> list[int]:
        if not self.params.split_response_across_turns:
            return [draw_tokens(self._response, rng) for _ in range(num_turns)]
        total = draw_tokens(self._response, rng, minimum=num_turns)
        weights = [rng.uniform(0.5, 1.5) for _ in range(num_turns)]
        scale = total / sum(weights)
        outputs = [max(1, int(w * scale)) for w in weights]
        outputs[-1] += total - sum(outputs)
        return [max(1, n) for n in outputs]
