"""The session JSONL format: Mooncake's fields plus the session a row belongs to.

Each row is one call: `timestamp` (ms), `input_length`, `output_length`, `hash_ids`
(512-token blocks, equal ids mean equal prefix blocks), `session_id`, and optionally
`turn` (its index in the session), `tool_s` (the wait before this call, from the end of
the previous one), `expected_tool_s`, `context_event`, `kind`, `parent_session_id` and
`parent_turn` (a sub-agent forked when that call of its parent finished). Rows of one
session are its turns in order.

Files written by `evinfra workload generate` also carry the exact segments, so that a
generated workload round-trips without losing the sub-block prefix structure:
`prefix_segments` (how many leading segments repeat the previous call's prompt and output;
for a sub-agent's first call, those of the parent's forking call), `segments` (the rest, as
[content_id, num_tokens] pairs) and `output_id`. Without them, prompts are built from
`hash_ids` as in a Mooncake trace.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from evinfra.core.blocks import ROOT_HASH, Segment, chain_hash, common_prefix_len
from evinfra.core.types import ContextEvent
from evinfra.workloads.ids import text_key, trace_output_id
from evinfra.workloads.requests import PrefixHashCache, tail_runs
from evinfra.workloads.traces import (
    MOONCAKE_BLOCK_TOKENS,
    TRACE_KIND,
    BlockSegments,
    RowError,
    TraceWorkload,
    check_rate_scale,
    get_hash_ids,
    get_int,
    get_number,
    one_call_session,
    read_json_rows,
)
from evinfra.workloads.types import Call, SessionArrival, SessionPlan

_EVENTS = {e.value: e for e in ContextEvent}


@dataclass(slots=True)
class _Row:
    lineno: int
    timestamp_ms: float
    turn: int
    segments: tuple[Segment, ...]
    num_output_tokens: int
    output_id: int
    tool_s: float | None
    expected_tool_s: float | None
    event: ContextEvent
    kind: str
    parent: str | None
    parent_turn: int | None


class _Reader:
    def __init__(self, path: Path, block_tokens: int) -> None:
        self.path = path
        self.file_key = text_key(path.name)
        self.blocks = BlockSegments(self.file_key, block_tokens)
        self.block_tokens = block_tokens
        self.sessions: dict[str, list[_Row]] = {}
        self.interned: dict[tuple[int, int], Segment] = {}

    def _error(self, lineno: int, message: str) -> RowError:
        return RowError(self.path, lineno, message)

    def _optional_number(self, row: dict[str, Any], field: str, lineno: int) -> float | None:
        return None if row.get(field) is None else get_number(row, field, self.path, lineno)

    def add(self, lineno: int, row: dict[str, Any]) -> None:
        path = self.path
        sid = row.get("session_id")
        if isinstance(sid, bool) or not isinstance(sid, str | int) or sid == "":
            raise self._error(lineno, f"field 'session_id' must be a string or integer: {sid!r}")
        session_id = str(sid)
        rows = self.sessions.setdefault(session_id, [])
        turn = len(rows)
        if row.get("turn") is not None and get_int(row, "turn", path, lineno) != turn:
            raise self._error(lineno, f"field 'turn' is {row['turn']}, expected {turn}")
        parent = row.get("parent_session_id")
        parent = None if parent is None else str(parent)
        parent_turn = None
        if row.get("parent_turn") is not None:
            parent_turn = get_int(row, "parent_turn", path, lineno)
        event_name = row.get("context_event", ContextEvent.APPEND.value if turn else "start")
        event = _EVENTS.get(event_name) if isinstance(event_name, str) else None
        if event is None:
            raise self._error(lineno, f"field 'context_event' is not one of {list(_EVENTS)}")
        num_input = get_int(row, "input_length", path, lineno, minimum=1)
        segments, output_id = self._segments(row, session_id, turn, parent, parent_turn, lineno)
        if sum(s.num_tokens for s in segments) != num_input:
            raise self._error(
                lineno,
                f"segments hold {sum(s.num_tokens for s in segments)} "
                f"tokens but input_length is {num_input}",
            )
        kind = row.get("kind", TRACE_KIND)
        rows.append(
            _Row(
                lineno=lineno,
                timestamp_ms=get_number(row, "timestamp", path, lineno),
                turn=turn,
                segments=segments,
                num_output_tokens=max(1, get_int(row, "output_length", path, lineno)),
                output_id=output_id,
                tool_s=self._optional_number(row, "tool_s", lineno),
                expected_tool_s=self._optional_number(row, "expected_tool_s", lineno),
                event=event,
                kind=kind if isinstance(kind, str) else TRACE_KIND,
                parent=parent,
                parent_turn=parent_turn,
            )
        )

    def _segments(
        self,
        row: dict[str, Any],
        session_id: str,
        turn: int,
        parent: str | None,
        parent_turn: int | None,
        lineno: int,
    ) -> tuple[tuple[Segment, ...], int]:
        if "segments" not in row:
            num_input = get_int(row, "input_length", self.path, lineno, minimum=1)
            ids = get_hash_ids(row, num_input, self.block_tokens, self.path, lineno)
            return self.blocks.segments(ids, num_input), trace_output_id(self.file_key, lineno)
        raw = row["segments"]
        if not isinstance(raw, list) or not all(_is_pair(p) for p in raw):
            raise self._error(lineno, "field 'segments' must be a list of [content_id, tokens]")
        output_id = row.get("output_id")
        if isinstance(output_id, bool) or not isinstance(output_id, int):
            raise self._error(lineno, "field 'output_id' must be an integer with 'segments'")
        num_prefix = 0
        if "prefix_segments" in row:
            num_prefix = get_int(row, "prefix_segments", self.path, lineno)
        before: tuple[Segment, ...] = ()
        if num_prefix:
            before = self._context_before(session_id, turn, parent, parent_turn, lineno)
            if num_prefix > len(before):
                raise self._error(
                    lineno,
                    f"field 'prefix_segments' is {num_prefix} but the "
                    f"previous context has {len(before)} segments",
                )
        new = tuple(self._intern(c, n) for c, n in raw)
        return before[:num_prefix] + new, output_id

    def _context_before(
        self, session_id: str, turn: int, parent: str | None, parent_turn: int | None, lineno: int
    ) -> tuple[Segment, ...]:
        if turn > 0:
            prev = self.sessions[session_id][turn - 1]
        else:
            rows = self.sessions.get(parent or "", [])
            if parent_turn is None or parent_turn >= len(rows):
                raise self._error(lineno, "a sub-agent's first row needs an earlier parent row")
            prev = rows[parent_turn]
        return (*prev.segments, self._intern(prev.output_id, prev.num_output_tokens))

    def _intern(self, content_id: int, num_tokens: int) -> Segment:
        key = (content_id, num_tokens)
        seg = self.interned.get(key)
        if seg is None:
            seg = self.interned[key] = Segment(content_id, num_tokens)
        return seg


def _is_pair(p: object) -> bool:
    return (
        isinstance(p, list)
        and len(p) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in p)
        and p[1] >= 0
    )


def load_session_jsonl(
    path: Path,
    *,
    rate_scale: float = 1.0,
    closed_loop: bool = True,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
) -> TraceWorkload:
    """Sessions from a session JSONL file. Closed-loop (default): one SessionPlan per
    top-level session, starting at its first row's timestamp / rate_scale, each later call
    `tool_s` after its predecessor (without `tool_s`: the recorded gap between timestamps,
    which also holds the recorded service time). Open-loop: every row a one-call session
    `{session_id}@{turn}` at its own timestamp / rate_scale."""
    check_rate_scale(rate_scale)
    reader = _Reader(path, block_tokens)
    for lineno, row in read_json_rows(path):
        reader.add(lineno, row)
    if not closed_loop:
        arrivals = [
            SessionArrival(
                r.timestamp_ms / 1000.0 / rate_scale,
                one_call_session(f"{sid}@{r.turn}", r.segments, r.num_output_tokens, r.output_id),
            )
            for sid, rows in reader.sessions.items()
            for r in rows
        ]
        return TraceWorkload(path.stem, arrivals)
    children: dict[tuple[str, int], list[str]] = {}
    for sid, rows in reader.sessions.items():
        first = rows[0]
        if first.parent in reader.sessions and first.parent_turn is not None:
            if first.parent_turn >= len(reader.sessions[first.parent]):
                raise RowError(path, first.lineno, "field 'parent_turn' is past the parent's end")
            children.setdefault((first.parent, first.parent_turn), []).append(sid)
    nested = {sid for ids in children.values() for sid in ids}

    def build(sid: str) -> SessionPlan:
        rows = reader.sessions[sid]
        calls = []
        for i, r in enumerate(rows):
            if r.tool_s is not None:
                think_s = r.tool_s
            else:
                think_s = (
                    0.0 if i == 0 else max(0.0, r.timestamp_ms - rows[i - 1].timestamp_ms) / 1e3
                )
            forks = tuple(build(c) for c in children.get((sid, i), ()))
            calls.append(
                Call(
                    r.segments,
                    r.num_output_tokens,
                    r.output_id,
                    think_s,
                    r.event,
                    r.expected_tool_s,
                    forks,
                )
            )
        return SessionPlan(sid, rows[0].kind, tuple(calls), rows[0].parent)

    arrivals = [
        SessionArrival(rows[0].timestamp_ms / 1000.0 / rate_scale, build(sid))
        for sid, rows in reader.sessions.items()
        if sid not in nested
    ]
    return TraceWorkload(path.stem, arrivals)


def write_session_jsonl(
    arrivals: Iterable[SessionArrival], out: TextIO, *, block_tokens: int = MOONCAKE_BLOCK_TOKENS
) -> int:
    """Write sessions (and their sub-agents, after the call that forks them) as session
    JSONL. Timestamps assume an infinitely fast server (start plus waits). Returns rows."""
    writer = _Writer(out, block_tokens)
    for arrival in arrivals:
        writer.session(arrival.plan, arrival.start_s, None, None)
    return writer.num_rows


class _Writer:
    def __init__(self, out: TextIO, block_tokens: int) -> None:
        self.out = out
        self.block_tokens = block_tokens
        self.cache = PrefixHashCache()
        self.block_ids: dict[int, int] = {}
        self.num_rows = 0

    def session(
        self,
        plan: SessionPlan,
        start_s: float,
        parent_context: tuple[Segment, ...] | None,
        parent_turn: int | None,
    ) -> None:
        t_s = start_s
        before = parent_context or ()
        for i, call in enumerate(plan.calls):
            t_s += call.think_s
            num_prefix = common_prefix_len(call.segments, before)
            row: dict[str, Any] = {
                "timestamp": round(t_s * 1000.0),
                "input_length": call.num_prompt_tokens,
                "output_length": call.num_output_tokens,
                "hash_ids": self._hash_ids(plan, call),
                "session_id": plan.session_id,
                "turn": i,
                "tool_s": call.think_s,
                "context_event": call.context_event.value,
                "kind": plan.kind,
            }
            if call.expected_tool_s is not None:
                row["expected_tool_s"] = call.expected_tool_s
            if plan.parent_session_id is not None:
                row["parent_session_id"] = plan.parent_session_id
                if i == 0 and parent_turn is not None:
                    row["parent_turn"] = parent_turn
            row["prefix_segments"] = num_prefix
            row["segments"] = [[s.content_id, s.num_tokens] for s in call.segments[num_prefix:]]
            row["output_id"] = call.output_content_id
            self.out.write(json.dumps(row, separators=(",", ":")) + "\n")
            self.num_rows += 1
            before = (*call.segments, Segment(call.output_content_id, call.num_output_tokens))
            for child in call.forks:
                self.session(child, t_s, before, i)

    def _hash_ids(self, plan: SessionPlan, call: Call) -> list[int]:
        output = Segment(call.output_content_id, call.num_output_tokens)
        keys = (
            (plan.session_id,)
            if plan.parent_session_id is None
            else (plan.session_id, plan.parent_session_id)
        )
        hashes, _, num_tokens = self.cache.hash_call(keys, call.segments, output, self.block_tokens)
        chain = list(hashes)
        tail = num_tokens - len(hashes) * self.block_tokens
        if tail:
            parent = hashes[-1] if hashes else ROOT_HASH
            chain.append(chain_hash(parent, tail_runs(call.segments, tail)))
        return [self.block_ids.setdefault(h, len(self.block_ids)) for h in chain]
