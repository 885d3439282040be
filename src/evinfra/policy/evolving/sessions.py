"""The session table: what each agent session is doing, what it owns, and when it will
call again. Filled from explicit hints or, without hints, inferred from prompt prefixes.

Inference: every block of a session's latest context (prompt plus output) records its
owner. A request whose prompt extends a session's context is that session's next turn; a
request that shares only the start of it (past the blocks other sessions share) and then
diverges is a compaction or truncation of it: the blocks after the divergence are dead.
A request that extends the context of a session that is still generating is a fork.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import repeat

from evinfra.core.blocks import common_prefix_len
from evinfra.core.types import ContextEvent, Request, SessionState

TIER_AWAY = -2.0
TIER_ACTIVE = -1.0
TIER_SHARED = 0.0

DEFAULT_GAP_S = 5.0
"""Prior for the gap before a session's next call, before any is observed."""


@dataclass(slots=True)
class SessionEntry:
    session_id: str
    state: SessionState = SessionState.GENERATING
    parent_id: str | None = None
    context_hashes: tuple[int, ...] = ()
    """Block hashes of the latest context: prompt plus the output's full blocks."""
    node_id: int | None = None
    """Where the latest context was decoded (where its KV lives)."""
    nodes: set[int] = field(default_factory=set)
    """Every node a request of this session was placed on (where its blocks may be)."""
    last_finish_s: float = 0.0
    expected_gap_s: float = DEFAULT_GAP_S
    gap_ewma_s: float | None = None
    new_blocks_ewma: float = 0.0
    """Uncached prompt blocks per call (what a return will need prefilled)."""
    output_tokens_ewma: float = 0.0
    num_turns: int = 0
    num_inflight: int = 0
    num_children_running: int = 0
    is_last_turn: bool = False

    def expected_return_s(self) -> float:
        return self.last_finish_s + self.expected_gap_s


@dataclass(frozen=True, slots=True)
class Arrival:
    """What the table concluded about an arriving request."""

    session_id: str
    event: ContextEvent
    dead_hashes: tuple[int, ...]
    """Blocks of the session's previous context that this prompt no longer contains."""


@dataclass(slots=True)
class SessionTable:
    use_hints: bool = True
    gap_alpha: float = 0.3
    long_wait_s: float = 30.0
    """A session not expected back within this long (or this long overdue) is away."""
    sessions: dict[str, SessionEntry] = field(default_factory=dict)
    owner: dict[int, str] = field(default_factory=dict)
    """Block hash -> a live session whose context holds it (the last writer; when it lets
    go while others still hold the block, the latest of those): every block some live
    session holds."""
    shared: dict[int, dict[str, None]] = field(default_factory=dict)
    """Block hash -> the other live sessions whose contexts hold it, oldest writer first
    (shared prefixes only: one holder is the rule and is not stored, so the per-block
    reads of eviction scoring look in this small dict instead of one as large as
    `owner`). An ordered set: a system prompt's blocks have as many holders as there are
    live sessions (about a thousand at 64 GPUs), and one of them lets go in O(1)."""
    request_session: dict[int, str] = field(default_factory=dict)
    orphans: OrderedDict[int, None] = field(default_factory=OrderedDict)
    """Blocks whose last holder ended (oldest first, at most `max_orphans`). Ordered: a
    plain dict's first key is found in time growing with the keys deleted before it."""
    max_orphans: int = 1 << 20
    num_inferred_sessions: int = 0
    num_inferred_dead_blocks: int = 0
    output_tokens_ewma: float = 256.0
    """Across sessions: the prior for a session whose outputs are not yet known."""

    # -- arrivals -----------------------------------------------------------------------
    def on_arrival(self, request: Request, now_s: float) -> Arrival:
        hints = request.hints if self.use_hints else None
        if hints is not None:
            sid = hints.session_id
            entry = self.sessions.get(sid)
            if entry is None:
                entry = SessionEntry(sid, parent_id=hints.parent_session_id)
                self.sessions[sid] = entry
                if entry.parent_id in self.sessions:
                    self.sessions[entry.parent_id].num_children_running += 1
            event = hints.context_event or ContextEvent.APPEND
            if hints.is_last_turn is not None:
                entry.is_last_turn = hints.is_last_turn
        else:
            entry, event = self._infer(request)
            sid = entry.session_id
        dead: tuple[int, ...] = ()
        keep = common_prefix_len(entry.context_hashes, request.prompt_hashes)
        if keep < len(entry.context_hashes) and event is not ContextEvent.FORK:
            # the prompt no longer holds the tail of the previous context: it is dead
            dead = self._release(entry.context_hashes[keep:], sid)
            entry.context_hashes = entry.context_hashes[:keep]
            if hints is None:
                self.num_inferred_dead_blocks += len(dead)
                event = ContextEvent.COMPACT if keep <= 2 else ContextEvent.TRUNCATE
        if entry.num_turns and entry.state is SessionState.WAITING_TOOL:
            gap = now_s - entry.last_finish_s
            entry.gap_ewma_s = (
                gap
                if entry.gap_ewma_s is None
                else (1 - self.gap_alpha) * entry.gap_ewma_s + self.gap_alpha * gap
            )
        new_blocks = len(request.prompt_hashes) - keep
        entry.new_blocks_ewma = 0.7 * entry.new_blocks_ewma + 0.3 * new_blocks
        entry.state = SessionState.GENERATING
        entry.num_inflight += 1
        entry.num_turns += 1
        self.request_session[request.request_id] = sid
        return Arrival(sid, event, dead)

    def _infer(self, request: Request) -> tuple[SessionEntry, ContextEvent]:
        # the deepest prompt block that exactly one live session holds names the session
        owner: str | None = None
        held, shared = self.owner, self.shared
        for h in reversed(request.prompt_hashes):
            if h in held and h not in shared:
                owner = held[h]
                break
        if owner is not None and owner in self.sessions:
            entry = self.sessions[owner]
            if entry.num_inflight > 0:
                # extends a context that is still generating: a sub-agent fork
                return self._new_session(parent=owner), ContextEvent.FORK
            return entry, ContextEvent.APPEND
        return self._new_session(parent=None), ContextEvent.START

    def _new_session(self, parent: str | None) -> SessionEntry:
        self.num_inferred_sessions += 1
        sid = f"inferred-{self.num_inferred_sessions}"
        entry = SessionEntry(sid, parent_id=parent)
        self.sessions[sid] = entry
        if parent is not None:
            self.sessions[parent].num_children_running += 1
        return entry

    # -- finishes -----------------------------------------------------------------------
    def on_finish(self, request: Request, node_id: int, now_s: float) -> SessionEntry | None:
        sid = self.request_session.pop(request.request_id, None)
        if sid is None or sid not in self.sessions:
            return None
        entry = self.sessions[sid]
        entry.num_inflight -= 1
        out = float(request.max_output_tokens)
        first = entry.output_tokens_ewma == 0.0
        entry.output_tokens_ewma = out if first else 0.7 * entry.output_tokens_ewma + 0.3 * out
        self.output_tokens_ewma = 0.95 * self.output_tokens_ewma + 0.05 * out
        context = request.prompt_hashes + request.output_hashes
        # the common prefix with the previous context is already held: only the tails
        # change hands (an append has no old tail at all)
        keep = common_prefix_len(entry.context_hashes, context)
        old_tail = entry.context_hashes[keep:]
        new_tail = context[keep:]
        if old_tail:
            new_set = set(new_tail)
            self._release(tuple(h for h in old_tail if h not in new_set), sid)
        old_set = set(old_tail)
        orphans, shared, owner = self.orphans, self.shared, self.owner
        for h in new_tail:
            previous = owner.get(h)
            if h in old_set:  # held by this session already: it becomes the last writer
                if previous != sid and previous is not None:
                    others = shared[h]
                    del others[sid]
                    others[previous] = None
            elif previous is not None:  # held already: one more holder
                shared.setdefault(h, {})[previous] = None
            orphans.pop(h, None)
            owner[h] = sid
        entry.context_hashes = context
        entry.node_id = node_id
        entry.last_finish_s = now_s
        hints = request.hints if self.use_hints else None
        if hints is not None and hints.expected_tool_s is not None:
            entry.expected_gap_s = hints.expected_tool_s
        elif entry.gap_ewma_s is not None:
            entry.expected_gap_s = entry.gap_ewma_s
        entry.state = SessionState.GENERATING if entry.num_inflight else SessionState.WAITING_TOOL
        return entry

    def end(self, sid: str) -> tuple[int, ...]:
        """The session is over: returns the blocks only it held, which become orphans
        (kept at low priority: a later session may share them)."""
        entry = self.sessions.pop(sid, None)
        if entry is None:
            return ()
        entry.state = SessionState.FINISHED
        if entry.parent_id in self.sessions:
            self.sessions[entry.parent_id].num_children_running -= 1
        released = self._release(entry.context_hashes, sid)
        orphans = self.orphans
        orphans.update(zip(released, repeat(None)))
        while len(orphans) > self.max_orphans:
            orphans.popitem(last=False)
        return released

    def _release(self, hashes: tuple[int, ...], sid: str) -> tuple[int, ...]:
        """Session `sid` lets go of these blocks; returns those no live session holds now.
        A shared block `sid` owned passes to the latest of its other holders, so that its
        score and the inference of sessions read a live session, not an ended one."""
        dead = []
        shared, owner = self.shared, self.owner
        for h in hashes:
            others = shared.get(h)
            if others is None:  # its last holder (or none)
                owner.pop(h, None)
                dead.append(h)
                continue
            if owner.get(h) == sid:
                owner[h] = others.popitem()[0]  # the latest writer of the others
            else:
                del others[sid]
            if not others:
                del shared[h]
        return tuple(dead)

    def num_holders(self, block_hash: int) -> int:
        """How many live session contexts hold the block."""
        if block_hash not in self.owner:
            return 0
        return 1 + len(self.shared.get(block_hash, ()))

    def note_route(self, request_id: int, node_ids: tuple[int, ...]) -> None:
        sid = self.request_session.get(request_id)
        if sid is not None and sid in self.sessions:
            self.sessions[sid].nodes.update(node_ids)

    def keep_score(self, block_hash: int, node_id: int, now_s: float) -> float:
        """How much a cached copy of `block_hash` on `node_id` is worth keeping; the lowest
        is evicted first, and equal scores go least recently freed first (LRU).

        Scores are tiers, not predicted times. Fine-grained next-use predictions (Belady
        by expected return) and demoting copies away from a session's home node both lost
        to LRU in our pressure runs (docs/evolving.md): a block is often read where and
        when a single predicted return does not say. What the signals tell reliably:

        - AWAY: blocks of a session that has ended or said this was its last turn (not
          dropped: another session may share the prefix, as requests of a trace do),
          and of a session not expected back within `long_wait_s` (a human pause, a
          long tool), or silent that long past its expected return;
        - ACTIVE: everything else, including blocks no session claims yet (a request
          still in flight): unknown is not dead;
        - SHARED: a prefix several live sessions hold.

        `node_id` is unused today: the tiers are the same on every node.
        """
        sid = self.owner.get(block_hash)
        entry = self.sessions.get(sid) if sid is not None else None
        if entry is None:
            return TIER_AWAY if block_hash in self.orphans else TIER_ACTIVE
        busy = entry.state is SessionState.GENERATING or entry.num_children_running > 0
        if entry.is_last_turn and not busy:
            return TIER_AWAY
        if block_hash in self.shared:
            return TIER_SHARED
        if busy:
            return TIER_ACTIVE
        ret = entry.expected_return_s()
        if ret - now_s > self.long_wait_s or now_s - ret > self.long_wait_s:
            return TIER_AWAY
        return TIER_ACTIVE
