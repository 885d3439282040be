"""Turning a planned call into a core Request (block hashes, hints) or into real tokens.

Hashing long prompts is the simulator's hot path. Consecutive calls of a session share
almost their whole prompt (an append resends the previous prompt and output), so the
hasher keeps, per session and block size, the hash-chain state reached after the last
call's prompt and output, and resumes from it when the next prompt starts with the same
segments. A prompt that does not (after compaction or truncation) resumes at the last
segment it shares with the last call, or at a remembered harness head, and hashes the
rest at one tuple hash per block. The hashes equal `core.blocks.hash_segment_blocks`
exactly; the cache changes speed, never results.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from evinfra.core.blocks import ROOT_HASH, Segment, common_prefix_len
from evinfra.core.types import AgentHints, Request
from evinfra.workloads.ids import mix64
from evinfra.workloads.types import SessionPlan

_MASK = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class _ChainState:
    """Where block hashing stands after some segments: full-block hashes, the last full
    block's hash, the runs of the partial block being filled, and the token count."""

    hashes: tuple[int, ...]
    last_hash: int
    runs: tuple[int, ...]
    fill: int
    num_tokens: int


_EMPTY = _ChainState((), ROOT_HASH, (), 0, 0)


def _extend(state: _ChainState, segments: Sequence[Segment], block_size: int) -> _ChainState:
    """The state after hashing `segments` on top of `state` (as hash_segment_blocks does:
    a block's content is the flat tuple of its (content_id, start, end) runs)."""
    hashes = list(state.hashes)
    append = hashes.append
    h = state.last_hash
    runs = list(state.runs)
    fill = state.fill
    total = state.num_tokens
    for seg in segments:
        cid = seg.content_id
        n = seg.num_tokens
        if n <= 0:
            continue
        total += n
        offset = 0
        if fill:
            take = min(block_size - fill, n)
            runs.extend((cid, 0, take))
            offset = take
            fill += take
            if fill < block_size:
                continue
            h = hash((h, tuple(runs))) & _MASK
            append(h)
            runs = []
            fill = 0
        last_full = n - block_size
        while offset <= last_full:
            h = hash((h, (cid, offset, offset + block_size))) & _MASK
            append(h)
            offset += block_size
        if offset < n:
            runs = [cid, offset, n]
            fill = n - offset
    return _ChainState(tuple(hashes), h, tuple(runs), fill, total)


@dataclass(frozen=True, slots=True)
class _Entry:
    segments: tuple[Segment, ...]
    state: _ChainState


def tail_runs(segments: Sequence[Segment], num_tail_tokens: int) -> tuple[int, ...]:
    """The flat (content_id, start, end) runs of the last `num_tail_tokens` tokens of
    `segments`: a partial block's content as `_extend` hashes it."""
    runs: list[tuple[int, int, int]] = []
    need = num_tail_tokens
    for seg in reversed(segments):
        if need == 0:
            break
        take = min(need, seg.num_tokens)
        if take:
            runs.append((seg.content_id, seg.num_tokens - take, seg.num_tokens))
        need -= take
    return tuple(v for run in reversed(runs) for v in run)


def _state_at(entry: _Entry, num_segments: int, block_size: int) -> _ChainState:
    """The chain state after the first `num_segments` of `entry.segments`, rebuilt from the
    entry's own hashes (the same int objects): the full blocks those segments cover, and
    the partial block's runs read back from the segments that end it."""
    segments = entry.segments[:num_segments]
    total = sum(seg.num_tokens for seg in segments)
    num_full = total // block_size
    fill = total - num_full * block_size
    hashes = entry.state.hashes[:num_full]
    last_hash = hashes[-1] if hashes else ROOT_HASH
    return _ChainState(hashes, last_hash, tail_runs(segments, fill), fill, total)


_HEAD_SEGMENTS = 2
"""How many leading segments of a prompt hashed from the root `PrefixHashCache` keeps the
chain state of: a harness's shared head (system prompt, tool definitions) is one or two."""
_MAX_HEADS = 1024
"""A computer-use session's head (system prompt, its own task) is its own, so the mixed
workload brings hundreds of one-off heads an hour (398 in 600 s of 64 GPUs): the bound
keeps the harnesses' shared heads among them."""


class PrefixHashCache:
    """Per (session, block size): the segments hashed by the session's last call (prompt
    and output) and the chain state after them. LRU-bounded; results never depend on it.

    Prompts hashed from the root (a session's first call, a compacted context) start from
    a remembered state of their leading segments when another prompt began with them: the
    sessions of one harness then share its head's hash objects as well as their values,
    so a dict that holds such a hash (a pool's index, the cluster-wide index) finds it by
    identity, where an equal object of its own would cost a comparison that reads both.
    A prompt that keeps more than the head of its session's last call (a truncation drops
    old screenshots or observations after some kept history) resumes at the last segment
    the two share, from the last call's own hash objects."""

    def __init__(self, max_entries: int = 8192) -> None:
        self._entries: OrderedDict[tuple[str, int], _Entry] = OrderedDict()
        self._max_entries = max_entries
        self._heads: OrderedDict[tuple[int, tuple[Segment, ...]], _ChainState] = OrderedDict()

    def _from_head(self, segments: tuple[Segment, ...], block_size: int) -> tuple[_ChainState, int]:
        """The chain state after the first up to `_HEAD_SEGMENTS` `segments` hashed from
        the root, remembered (LRU) by block size and those segments; and how many it
        covers."""
        heads = self._heads
        state = _EMPTY
        covered = min(_HEAD_SEGMENTS, len(segments))
        for n in range(1, covered + 1):
            key = (block_size, segments[:n])
            known = heads.get(key)
            if known is None:
                known = _extend(state, segments[n - 1 : n], block_size)
                heads[key] = known
                if len(heads) > _MAX_HEADS:
                    heads.popitem(last=False)
            else:
                heads.move_to_end(key)
            state = known
        return state, covered

    def hash_call(
        self,
        session_keys: Sequence[str],
        segments: tuple[Segment, ...],
        output: Segment,
        block_size: int,
    ) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        """Prompt hashes, output hashes and prompt tokens of a call. The first of
        `session_keys` stores the new state; all are tried as a resumable prefix (a
        sub-agent's first prompt starts with its parent's context)."""
        state = _EMPTY
        start = 0
        entries = [
            entry
            for key in session_keys
            if (entry := self._entries.get((key, block_size))) is not None
        ]
        for entry in entries:
            m = len(entry.segments)
            if m <= len(segments) and m > start and segments[:m] == entry.segments:
                state, start = entry.state, m
        if start == 0:
            best: _Entry | None = None
            shared = min(_HEAD_SEGMENTS, len(segments))
            for entry in entries:
                common = common_prefix_len(segments, entry.segments)
                if common > shared:
                    best, shared = entry, common
            if best is not None:
                state, start = _state_at(best, shared, block_size), shared
            else:
                state, start = self._from_head(segments, block_size)
        prompt = _extend(state, segments[start:], block_size) if start < len(segments) else state
        after = _extend(prompt, (output,), block_size)
        own = (session_keys[0], block_size)
        self._entries[own] = _Entry((*segments, output), after)
        self._entries.move_to_end(own)
        if len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)
        return prompt.hashes, after.hashes[len(prompt.hashes) :], prompt.num_tokens


# A process-wide memo for `make_request` callers that do not hold a cache of their own:
# like functools.lru_cache, it changes speed only.
_DEFAULT_CACHE = PrefixHashCache()


def segment_hashes(segments: Sequence[Segment], block_size: int) -> tuple[int, ...]:
    """Full-block chained hashes of `segments` (equal to core.blocks.hash_segment_blocks)."""
    return _extend(_EMPTY, segments, block_size).hashes


def make_hints(plan: SessionPlan, call_index: int) -> AgentHints:
    """The hints a well-behaved agent client sends with call `call_index` of `plan`."""
    call = plan.calls[call_index]
    return AgentHints(
        session_id=plan.session_id,
        parent_session_id=plan.parent_session_id,
        turn=call_index,
        expected_tool_s=call.expected_tool_s,
        context_event=call.context_event,
        is_last_turn=call_index == len(plan.calls) - 1,
    )


def make_request(
    request_id: int,
    plan: SessionPlan,
    call_index: int,
    block_size: int,
    with_hints: bool,
    *,
    cache: PrefixHashCache | None = None,
) -> Request:
    """The core Request for call `call_index` of `plan`: prompt block hashes, the hashes of
    the full blocks the output completes, and the hints unless `with_hints` is False.
    Reads and updates `cache` (default: a process-wide one)."""
    call = plan.calls[call_index]
    keys: tuple[str, ...] = (plan.session_id,)
    if plan.parent_session_id is not None:
        keys = (plan.session_id, plan.parent_session_id)
    prompt_hashes, output_hashes, num_tokens = (cache or _DEFAULT_CACHE).hash_call(
        keys,
        call.segments,
        Segment(call.output_content_id, call.num_output_tokens),
        block_size,
    )
    return Request(
        request_id=request_id,
        prompt_hashes=prompt_hashes,
        num_prompt_tokens=num_tokens,
        max_output_tokens=call.num_output_tokens,
        output_hashes=output_hashes,
        hints=make_hints(plan, call_index) if with_hints else None,
    )


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _segment_tokens(content_id: int, num_tokens: int, seed: int) -> np.ndarray:
    key = np.uint64(mix64(seed, content_id))
    z = (np.arange(1, num_tokens + 1, dtype=np.uint64) * _GOLDEN) ^ key
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def render_tokens(
    segments: Sequence[Segment], vocab_size: int, seed: int, *, min_token_id: int = 0
) -> list[int]:
    """Deterministic token ids for `segments`: token i of segment c is a pseudo-random id
    in [min_token_id, vocab_size) drawn from (seed, c, i), so equal segment prefixes give
    equal token prefixes and a different segment diverges at its first token."""
    span = vocab_size - min_token_id
    if span <= 0:
        raise ValueError(f"vocab_size {vocab_size} must exceed min_token_id {min_token_id}")
    parts = [_segment_tokens(s.content_id, s.num_tokens, seed) for s in segments if s.num_tokens]
    if not parts:
        return []
    tokens = np.concatenate(parts) % np.uint64(span) + np.uint64(min_token_id)
    return [int(t) for t in tokens.tolist()]
