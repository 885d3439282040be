"""Requests built from plans: hashes equal the core's, the cache never changes results."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from evinfra.core.blocks import (
    Segment,
    common_prefix_len,
    hash_segment_blocks,
    hash_token_blocks,
)
from evinfra.core.types import ContextEvent
from evinfra.workloads.coding import CodingGenerator, CodingParams
from evinfra.workloads.computer_use import ComputerUseGenerator, ComputerUseParams
from evinfra.workloads.requests import (
    PrefixHashCache,
    make_request,
    render_tokens,
    segment_hashes,
)
from evinfra.workloads.types import SessionPlan

segments_strategy = st.lists(
    st.builds(Segment, st.integers(0, 6), st.integers(0, 300)), max_size=10
)


@given(segments_strategy, st.sampled_from([1, 3, 16, 64, 512]))
@settings(max_examples=200, deadline=None)
def test_segment_hashes_equal_core(segments: list[Segment], block_size: int) -> None:
    assert (
        list(segment_hashes(segments, block_size)) == hash_segment_blocks(segments, block_size)[0]
    )


def tracelab_plans(n: int) -> list[SessionPlan]:
    params = CodingParams(
        interactive_share=1.0,
        compact_at_tokens=20_000,
        context_window_tokens=30_000,
        tl_max_turns=4,
        tl_max_steps=25,
        tl_fork_prob_per_call=0.1,
    )
    gen = CodingGenerator(params, seed=11)
    return [gen.session(i, f"t{i}") for i in range(n)]


def walk(plan: SessionPlan) -> list[tuple[SessionPlan, int]]:
    out = []
    for i, call in enumerate(plan.calls):
        out.append((plan, i))
        for child in call.forks:
            out += walk(child)
    return out


def test_requests_match_direct_hashing_with_and_without_cache() -> None:
    cache = PrefixHashCache(max_entries=4)
    events = set()
    for plan in tracelab_plans(6):
        for sub, i in walk(plan):
            call = sub.calls[i]
            events.add(call.context_event)
            req = make_request(1, sub, i, 32, True, cache=cache)
            full, total = hash_segment_blocks(call.segments, 32)
            assert req.prompt_hashes == tuple(full)
            assert req.num_prompt_tokens == total == call.num_prompt_tokens
            out = Segment(call.output_content_id, call.num_output_tokens)
            with_out, _ = hash_segment_blocks((*call.segments, out), 32)
            assert req.output_hashes == tuple(with_out[len(full) :])
            assert req.max_output_tokens == call.num_output_tokens
    assert {ContextEvent.COMPACT, ContextEvent.FORK, ContextEvent.JOIN} <= events


def test_hints_carry_session_state_and_can_be_stripped() -> None:
    plan = next(p for p in tracelab_plans(30) if any(c.forks for c in p.calls))
    last = len(plan.calls) - 1
    req = make_request(7, plan, last, 64, True)
    assert req.hints is not None and req.session_id == plan.session_id
    assert req.hints.turn == last and req.hints.is_last_turn
    assert req.hints.context_event is plan.calls[last].context_event
    child = next(c for call in plan.calls for c in call.forks)
    child_req = make_request(8, child, 0, 64, True)
    assert child_req.hints is not None
    assert child_req.hints.parent_session_id == plan.session_id
    assert child_req.hints.context_event is ContextEvent.FORK
    assert make_request(9, plan, 0, 64, False).hints is None
    assert (
        make_request(9, plan, 0, 64, False).prompt_hashes
        == make_request(9, plan, 0, 64, True).prompt_hashes
    )


def test_render_tokens_is_deterministic_and_in_range() -> None:
    segs = (Segment(1, 50), Segment(2, 30))
    toks = render_tokens(segs, 1000, seed=3, min_token_id=10)
    assert toks == render_tokens(segs, 1000, seed=3, min_token_id=10)
    assert len(toks) == 80 and all(10 <= t < 1000 for t in toks)
    assert toks[:50] == render_tokens((Segment(1, 50),), 1000, seed=3, min_token_id=10)
    assert toks != render_tokens(segs, 1000, seed=4, min_token_id=10)
    # Token i of a segment does not depend on where the segment sits.
    assert render_tokens((Segment(9, 5), *segs), 1000, 3, min_token_id=10)[5:] == toks


def test_token_prefixes_break_where_block_hash_prefixes_break() -> None:
    for plan in tracelab_plans(6):
        prev = None
        for sub, i in walk(plan):
            if sub is not plan:
                continue
            call = sub.calls[i]
            toks = render_tokens(call.segments, 151_000, seed=1)
            by_tokens = hash_token_blocks(toks, 32)
            by_segments = segment_hashes(call.segments, 32)
            assert len(by_tokens) == len(by_segments)
            if prev is not None:
                a = sum(1 for x, y in zip(prev[0], by_tokens, strict=False) if x == y)
                b = sum(1 for x, y in zip(prev[1], by_segments, strict=False) if x == y)
                assert a == b
            prev = (by_tokens, by_segments)


def test_cached_hashing_of_a_long_session_is_fast() -> None:
    gen = CodingGenerator(CodingParams(interactive_share=1.0), seed=2)
    plan = max((gen.session(i, f"f{i}") for i in range(40)), key=lambda p: len(p.calls))
    cache = PrefixHashCache()
    t0 = time.perf_counter()
    for i in range(len(plan.calls)):
        make_request(i, plan, i, 64, True, cache=cache)
    per_call_s = (time.perf_counter() - t0) / len(plan.calls)
    assert per_call_s < 0.005


def test_sessions_of_one_harness_share_their_heads_hash_objects() -> None:
    """Prompts hashed from the root (first calls, compacted contexts) hold the harness's
    shared head as the same int objects, so a dict keyed by them matches by identity."""
    cache = PrefixHashCache()
    plans = tracelab_plans(6)
    head = len(segment_hashes(plans[0].calls[0].segments[:2], 64))
    assert head > 100  # the interactive harness's system prompt and tools
    first = make_request(0, plans[0], 0, 64, True, cache=cache).prompt_hashes
    rooted = 0
    for plan in plans:
        for i, call in enumerate(plan.calls):
            hashes = make_request(i, plan, i, 64, True, cache=cache).prompt_hashes
            assert hashes == tuple(hash_segment_blocks(call.segments, 64)[0])
            if i == 0 or call.context_event is ContextEvent.COMPACT:
                rooted += 1
                assert all(a is b for a, b in zip(hashes[:head], first[:head], strict=True))
    assert rooted > len(plans)  # first calls and at least one compaction


@given(
    st.lists(
        st.lists(
            st.builds(
                Segment, st.integers(0, 6), st.one_of(st.integers(0, 9), st.integers(0, 300))
            ),
            max_size=8,
        ),
        min_size=1,
        max_size=6,
    ),
    st.sampled_from([1, 3, 16, 64]),
)
@settings(max_examples=200, deadline=None)
def test_a_session_whose_prompts_share_any_prefix_hashes_as_the_core(
    prompts: list[list[Segment]], block_size: int
) -> None:
    """Each prompt keeps some leading segments of the last call's (prompt and output) and
    changes the rest, as truncation and compaction do: the cache resumes at the shared
    segments and the hashes still equal the core's."""
    cache = PrefixHashCache()
    for i, tail in enumerate(prompts):
        out = Segment(100 + i, 37)
        segments = (*tail,)
        prompt, output, total = cache.hash_call(("s",), segments, out, block_size)
        full, expected_total = hash_segment_blocks(segments, block_size)
        assert prompt == tuple(full) and total == expected_total
        with_out, _ = hash_segment_blocks((*segments, out), block_size)
        assert output == tuple(with_out[len(full) :])
        # The next prompt keeps a prefix of this call's segments (and maybe its output).
        if i + 1 < len(prompts):
            keep = len(prompts[i + 1]) % (len(segments) + 2)
            prompts[i + 1] = [*(*segments, out)[:keep], *prompts[i + 1]]


def test_a_truncated_prompt_keeps_its_sessions_hash_objects() -> None:
    """Computer-use drops old screenshots after kept history: the blocks before the first
    dropped one are the last call's own objects, not equal copies."""
    gen = ComputerUseGenerator(ComputerUseParams(), seed=3)
    cache = PrefixHashCache()
    shared = 0
    for s in range(20):
        plan = gen.session(s, f"cu{s}")
        last: tuple[int, ...] = ()
        for i, call in enumerate(plan.calls):
            hashes = make_request(i, plan, i, 64, True, cache=cache).prompt_hashes
            assert hashes == tuple(hash_segment_blocks(call.segments, 64)[0])
            if call.context_event is ContextEvent.TRUNCATE:
                same = common_prefix_len(hashes, last)
                head = len(segment_hashes(call.segments[:2], 64))
                if same > head:
                    shared += 1
                    assert all(a is b for a, b in zip(hashes[:same], last[:same], strict=True))
            last = hashes
    assert shared > 10
