"""The session model: an agent's context manager, building the prompts of a session.

A session's context is a list of items (segments with a kind). Each operation below leaves
the exact prefix structure that a real harness leaves:

- append: a call's prompt is the previous prompt, the previous output, then new items;
- compaction: everything after the head (system prompt, tool definitions, task) is
  replaced by a summary, so the old prefix is dead after the head;
- truncation: the oldest items of one kind (observations, screenshots) are dropped, so the
  prefix breaks at the first dropped item;
- fork: a sub-agent's first prompt is the parent's context (prompt and output) plus its
  own task; join: the parent's next prompt appends each sub-agent's final output;
- end: the last call of a plan.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from evinfra.core.blocks import Segment
from evinfra.core.types import ContextEvent
from evinfra.workloads.ids import IdSource
from evinfra.workloads.types import Call, SessionPlan


class ItemKind(enum.Enum):
    HEAD = "head"  # system prompt, tool definitions, task: kept by compaction
    OUTPUT = "output"  # the model's own output
    OBSERVATION = "observation"  # a tool result
    SCREENSHOT = "screenshot"
    USER = "user"  # a human message
    INSTRUCTION = "instruction"  # harness text (compaction request, sub-agent task)
    SUMMARY = "summary"  # a compaction summary or a sub-agent's result


# When several operations build one prompt, the hint names the strongest break.
_EVENT_RANK = {
    ContextEvent.APPEND: 0,
    ContextEvent.JOIN: 1,
    ContextEvent.TRUNCATE: 2,
    ContextEvent.COMPACT: 3,
}


@dataclass(frozen=True, slots=True)
class _Item:
    segment: Segment
    kind: ItemKind


@dataclass(slots=True)
class _Draft:
    segments: tuple[Segment, ...]
    num_output_tokens: int
    output_content_id: int
    think_s: float
    context_event: ContextEvent
    expected_tool_s: float | None = None
    forks: tuple[SessionPlan, ...] = ()


class SessionBuilder:
    """Builds one SessionPlan call by call. Mutable; `build()` returns the frozen plan."""

    def __init__(
        self,
        session_id: str,
        kind: str,
        ids: IdSource,
        head: Sequence[Segment],
        *,
        parent_session_id: str | None = None,
    ) -> None:
        self.session_id = session_id
        self.kind = kind
        self.ids = ids
        self.parent_session_id = parent_session_id
        self._items = [_Item(s, ItemKind.HEAD) for s in head]
        self._segments = list(head)
        """The items' segments, kept alongside: each call copies them (100s of items)."""
        self._num_head_items = len(self._items)
        self._num_tokens = sum(s.num_tokens for s in head)
        self._drafts: list[_Draft] = []
        self._event = ContextEvent.APPEND

    @property
    def num_context_tokens(self) -> int:
        """Tokens the next call's prompt holds so far (head, history, staged items)."""
        return self._num_tokens

    @property
    def num_calls(self) -> int:
        return len(self._drafts)

    @property
    def last_output(self) -> Segment:
        draft = self._drafts[-1]
        return Segment(draft.output_content_id, draft.num_output_tokens)

    def count(self, kind: ItemKind) -> int:
        return sum(1 for item in self._items if item.kind is kind)

    def add(self, kind: ItemKind, num_tokens: int) -> Segment:
        """Stage new content of a fresh id for the next call; returns its segment."""
        segment = Segment(self.ids.fresh(), num_tokens)
        self.add_segment(segment, kind)
        return segment

    def add_segment(self, segment: Segment, kind: ItemKind) -> None:
        """Stage existing content (shared text, a sub-agent's output) for the next call."""
        self._items.append(_Item(segment, kind))
        self._segments.append(segment)
        self._num_tokens += segment.num_tokens

    def call(
        self,
        num_output_tokens: int,
        think_s: float,
        *,
        previous_tool_hint_s: float | None = None,
    ) -> Segment:
        """Send the context as a call; its output joins the context. Returns the output.

        `think_s` is the wait before this call (tool or human time); a client that knew it
        hints it on the previous call as `previous_tool_hint_s`.
        """
        if self._drafts:
            event = self._event
            if previous_tool_hint_s is not None:
                self._drafts[-1].expected_tool_s = previous_tool_hint_s
        else:
            event = ContextEvent.FORK if self.parent_session_id else ContextEvent.START
        output = Segment(self.ids.fresh(), num_output_tokens)
        segments = tuple(self._segments)
        self._drafts.append(_Draft(segments, num_output_tokens, output.content_id, think_s, event))
        self._items.append(_Item(output, ItemKind.OUTPUT))
        self._segments.append(output)
        self._num_tokens += num_output_tokens
        self._event = ContextEvent.APPEND
        return output

    def compact(self, summary: Segment) -> None:
        """Replace all history after the head by `summary` (usually the output of a
        summarisation call); the next call is a COMPACT."""
        self._items = [*self._items[: self._num_head_items], _Item(summary, ItemKind.SUMMARY)]
        self._segments = [item.segment for item in self._items]
        self._num_tokens = sum(item.segment.num_tokens for item in self._items)
        self._mark(ContextEvent.COMPACT)

    def truncate(self, kind: ItemKind, keep_last: int, drop_chunk: int = 1) -> int:
        """Drop the oldest items of `kind` once there are `keep_last + drop_chunk` of them,
        keeping the last `keep_last` (dropping in chunks breaks the prefix less often).
        Returns the number of items dropped; the next call is a TRUNCATE if any were."""
        positions = [i for i, item in enumerate(self._items) if item.kind is kind]
        if len(positions) < keep_last + max(drop_chunk, 1):
            return 0
        dropped = set(positions[: len(positions) - keep_last])
        kept = [item for i, item in enumerate(self._items) if i not in dropped]
        self._num_tokens -= sum(self._items[i].segment.num_tokens for i in dropped)
        self._items = kept
        self._segments = [item.segment for item in kept]
        self._mark(ContextEvent.TRUNCATE)
        return len(dropped)

    def fork(self, session_id: str, ids: IdSource) -> SessionBuilder:
        """A sub-agent whose head is this session's whole context (prompt and output of the
        last call, plus anything staged since)."""
        if not self._drafts:
            raise ValueError("fork needs a finished call to fork from")
        head = [item.segment for item in self._items]
        return SessionBuilder(session_id, self.kind, ids, head, parent_session_id=self.session_id)

    def join(self, children: Sequence[SessionPlan]) -> None:
        """Attach sub-agents to the last call (they start when it finishes) and stage each
        one's final output for the next call, which is a JOIN."""
        if not self._drafts:
            raise ValueError("join needs a call to attach the sub-agents to")
        self._drafts[-1].forks = tuple(children)
        for child in children:
            last = child.calls[-1]
            self.add_segment(
                Segment(last.output_content_id, last.num_output_tokens), ItemKind.SUMMARY
            )
        self._mark(ContextEvent.JOIN)

    def build(self) -> SessionPlan:
        if not self._drafts:
            raise ValueError(f"session {self.session_id} has no calls")
        calls = tuple(
            Call(
                segments=d.segments,
                num_output_tokens=d.num_output_tokens,
                output_content_id=d.output_content_id,
                think_s=d.think_s,
                context_event=d.context_event,
                expected_tool_s=d.expected_tool_s,
                forks=d.forks,
            )
            for d in self._drafts
        )
        return SessionPlan(self.session_id, self.kind, calls, self.parent_session_id)

    def _mark(self, event: ContextEvent) -> None:
        if _EVENT_RANK[event] > _EVENT_RANK[self._event]:
            self._event = event
