"""The context manager's operations leave exactly the prefix structure they should."""

from __future__ import annotations

import pytest

from evinfra.core.blocks import Segment, common_prefix_len, hash_token_blocks
from evinfra.core.types import ContextEvent
from evinfra.workloads.coding import CodingGenerator, CodingParams
from evinfra.workloads.computer_use import ComputerUseGenerator, ComputerUseParams
from evinfra.workloads.ids import IdSource
from evinfra.workloads.requests import render_tokens, segment_hashes
from evinfra.workloads.session import ItemKind, SessionBuilder
from evinfra.workloads.types import Call, SessionPlan

BLOCK = 16


def make_builder(head_tokens: tuple[int, ...] = (100, 40)) -> SessionBuilder:
    ids = IdSource(99)
    head = [Segment(ids.fresh(), n) for n in head_tokens]
    return SessionBuilder("s", "test", ids, head)


def output_of(call: Call) -> Segment:
    return Segment(call.output_content_id, call.num_output_tokens)


def tokens_before(segments: tuple[Segment, ...], index: int) -> int:
    return sum(s.num_tokens for s in segments[:index])


def token_block_break(a: Call, b: Call) -> int:
    ta = render_tokens(a.segments, 50_000, seed=7)
    tb = render_tokens(b.segments, 50_000, seed=7)
    return common_prefix_len(hash_token_blocks(ta, BLOCK), hash_token_blocks(tb, BLOCK))


def hash_block_break(a: Call, b: Call) -> int:
    return common_prefix_len(segment_hashes(a.segments, BLOCK), segment_hashes(b.segments, BLOCK))


def test_append_extends_previous_prompt_and_output() -> None:
    b = make_builder()
    b.call(30, 0.0)
    obs = b.add(ItemKind.OBSERVATION, 77)
    b.call(20, 1.5, previous_tool_hint_s=1.2)
    plan = b.build()
    first, second = plan.calls
    assert second.segments == (*first.segments, output_of(first), obs)
    assert first.context_event is ContextEvent.START
    assert second.context_event is ContextEvent.APPEND
    assert first.expected_tool_s == 1.2 and second.think_s == 1.5
    assert second.num_prompt_tokens == 140 + 30 + 77
    whole = segment_hashes(first.segments, BLOCK)
    assert segment_hashes(second.segments, BLOCK)[: len(whole)] == whole


def test_compaction_keeps_head_then_summary() -> None:
    b = make_builder()
    b.call(30, 0.0)
    b.add(ItemKind.OBSERVATION, 500)
    summary = b.call(64, 0.3)
    b.compact(summary)
    b.call(10, 0.0)
    plan = b.build()
    before, after = plan.calls[1], plan.calls[2]
    assert after.context_event is ContextEvent.COMPACT
    assert after.segments == (*before.segments[:2], summary)
    # The prefix survives exactly over the head's full blocks (140 tokens: 8 blocks of 16).
    assert hash_block_break(before, after) == 140 // BLOCK
    assert token_block_break(before, after) == 140 // BLOCK


def test_truncation_breaks_at_first_dropped_item() -> None:
    b = make_builder()
    b.add(ItemKind.SCREENSHOT, 300)
    b.call(20, 0.0)
    for _ in range(3):
        b.add(ItemKind.SCREENSHOT, 300)
        b.call(20, 2.0)
    b.add(ItemKind.SCREENSHOT, 300)
    assert b.truncate(ItemKind.SCREENSHOT, keep_last=3) == 2
    b.call(20, 2.0)
    plan = b.build()
    prev, cut = plan.calls[-2], plan.calls[-1]
    assert cut.context_event is ContextEvent.TRUNCATE
    assert sum(1 for s in cut.segments if s.num_tokens == 300) == 3
    # The first screenshot sits right after the head: the cut is at token 140.
    assert hash_block_break(prev, cut) == 140 // BLOCK
    assert token_block_break(prev, cut) == 140 // BLOCK


def test_truncation_in_chunks_waits_for_the_chunk() -> None:
    b = make_builder()
    for _ in range(4):
        b.add(ItemKind.SCREENSHOT, 100)
    assert b.truncate(ItemKind.SCREENSHOT, keep_last=3, drop_chunk=2) == 0
    b.add(ItemKind.SCREENSHOT, 100)
    assert b.truncate(ItemKind.SCREENSHOT, keep_last=3, drop_chunk=2) == 2
    assert b.count(ItemKind.SCREENSHOT) == 3


def test_fork_shares_parent_prefix_and_join_returns_results() -> None:
    b = make_builder()
    b.call(30, 0.0)
    child_builder = b.fork("s.0.0", IdSource(5))
    child_builder.add(ItemKind.INSTRUCTION, 50)
    child_builder.call(40, 0.0)
    child_builder.add(ItemKind.OBSERVATION, 60)
    child_builder.call(25, 1.0)
    child = child_builder.build()
    b.join([child])
    b.call(10, 0.5)
    plan = b.build()
    parent_first, parent_join = plan.calls
    assert parent_first.forks == (child,)
    assert child.parent_session_id == "s"
    assert child.calls[0].context_event is ContextEvent.FORK
    context = (*parent_first.segments, output_of(parent_first))
    assert child.calls[0].segments[: len(context)] == context
    assert parent_join.context_event is ContextEvent.JOIN
    assert parent_join.segments == (*context, output_of(child.calls[-1]))


def test_build_without_calls_is_an_error() -> None:
    with pytest.raises(ValueError, match="no calls"):
        make_builder().build()


def _consecutive(plan: SessionPlan, event: ContextEvent) -> list[tuple[Call, Call]]:
    return [
        (a, b) for a, b in zip(plan.calls, plan.calls[1:], strict=False) if b.context_event is event
    ]


def test_generated_compaction_breaks_after_head() -> None:
    gen = CodingGenerator(
        CodingParams(interactive_share=1.0, compact_at_tokens=40_000, context_window_tokens=60_000),
        seed=3,
    )
    pairs = []
    for i in range(40):
        pairs += _consecutive(gen.session(i, f"c{i}"), ContextEvent.COMPACT)
    assert pairs, "no compaction generated"
    for summarise, compacted in pairs[:20]:
        head = compacted.segments[:3]
        assert summarise.segments[:3] == head
        assert compacted.segments[3] == output_of(summarise)
        assert (
            hash_block_break(summarise, compacted) == tokens_before(compacted.segments, 3) // BLOCK
        )


def test_generated_screenshot_truncation_breaks_where_tokens_break() -> None:
    gen = ComputerUseGenerator(ComputerUseParams(keep_last_screenshots=3), seed=4)
    plan = gen.session(0, "cu")
    pairs = _consecutive(plan, ContextEvent.TRUNCATE)
    assert len(pairs) >= 10
    for prev, cut in pairs:
        dropped = next(
            i for i, (x, y) in enumerate(zip(prev.segments, cut.segments, strict=False)) if x != y
        )
        expected = tokens_before(cut.segments, dropped) // BLOCK
        assert hash_block_break(prev, cut) == expected
        assert token_block_break(prev, cut) == expected
