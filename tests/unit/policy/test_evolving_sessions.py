"""Session inference from prompt prefixes, and expected-next-use ordering."""

from hypothesis import given, settings
from hypothesis import strategies as st

from evinfra.core.types import AgentHints, ContextEvent, Request, SessionState
from evinfra.policy.evolving.sessions import TIER_ACTIVE, TIER_AWAY, TIER_SHARED, SessionTable


def req(rid: int, prompt: list[int], output: list[int], hints: AgentHints | None = None) -> Request:
    return Request(rid, tuple(prompt), len(prompt) * 16, 32, tuple(output), hints)


SYSTEM = [1, 2]  # a system prompt every session shares


def test_next_turn_is_inferred_from_prefix_without_hints() -> None:
    table = SessionTable()
    a1 = req(1, [*SYSTEM, 10, 11], [12])
    b1 = req(2, [*SYSTEM, 20, 21], [22])
    first = table.on_arrival(a1, 0.0)
    other = table.on_arrival(b1, 0.0)
    assert first.event is ContextEvent.START and other.event is ContextEvent.START
    assert first.session_id != other.session_id
    table.on_finish(a1, node_id=3, now_s=1.0)
    table.on_finish(b1, node_id=4, now_s=1.0)
    a2 = req(3, [*SYSTEM, 10, 11, 12, 13], [14])
    arrival = table.on_arrival(a2, 2.0)
    assert arrival.session_id == first.session_id
    assert arrival.event is ContextEvent.APPEND
    assert arrival.dead_hashes == ()
    # the gap between the finish and the next call is learnt as the tool time
    table.on_finish(a2, node_id=3, now_s=3.0)
    assert table.sessions[first.session_id].expected_gap_s == 1.0


def test_compaction_is_inferred_and_frees_the_dead_tail_only() -> None:
    # steady state: two sessions hold the system prompt (with one session alone, a new
    # session sharing only the system prompt cannot be told from a compaction)
    table = SessionTable()
    a1 = req(1, [*SYSTEM, 10, 11, 12], [13])
    b1 = req(2, [*SYSTEM, 20], [21])
    sid = table.on_arrival(a1, 0.0).session_id
    assert table.on_arrival(b1, 0.5).session_id != sid
    table.on_finish(a1, 0, 1.0)
    table.on_finish(b1, 0, 1.5)
    # the summary replaces history after the task block 10
    a2 = req(3, [*SYSTEM, 10, 99], [98])
    arrival = table.on_arrival(a2, 2.0)
    assert arrival.session_id == sid
    assert arrival.event is ContextEvent.TRUNCATE
    # blocks 11, 12, 13 are dead; the shared system prompt survives (session b holds it)
    assert arrival.dead_hashes == (11, 12, 13)
    assert table.num_holders(1) == 2


def test_extending_a_generating_context_is_a_fork() -> None:
    table = SessionTable()
    p1 = req(1, [*SYSTEM, 10], [11])
    parent = table.on_arrival(p1, 0.0).session_id
    table.on_finish(p1, 0, 1.0)
    p2 = req(2, [*SYSTEM, 10, 11, 12], [13])
    table.on_arrival(p2, 1.0)
    child = table.on_arrival(req(3, [*SYSTEM, 10, 11, 12, 50], [51]), 1.1)
    assert child.event is ContextEvent.FORK
    assert table.sessions[child.session_id].parent_id == parent


def test_hints_take_precedence_and_last_turn_ends_reuse() -> None:
    table = SessionTable()
    h = AgentHints("s1", expected_tool_s=7.0, context_event=ContextEvent.START)
    r = req(1, [5, 6], [7], h)
    table.on_arrival(r, 0.0)
    entry = table.on_finish(r, 2, 10.0)
    assert entry is not None
    assert entry.state is SessionState.WAITING_TOOL
    assert entry.expected_return_s() == 17.0
    assert table.keep_score(6, node_id=2, now_s=10.0) == TIER_ACTIVE
    # a block no live session claims is unknown, not dead
    assert table.keep_score(12345, node_id=2, now_s=10.0) == TIER_ACTIVE
    last = AgentHints("s1", is_last_turn=True)
    r2 = req(2, [5, 6, 7, 8], [9], last)
    table.on_arrival(r2, 17.0)
    table.on_finish(r2, 2, 18.0)
    # a last turn's blocks rank low but are not thrown away (others may share them)
    assert table.keep_score(8, node_id=2, now_s=18.0) == TIER_AWAY


def test_a_shared_prefix_stays_shared_when_its_last_writer_ends() -> None:
    """Three sessions hold the system prompt; the one that wrote it last ends. The two
    left still share it, so it scores SHARED (read from a live holder), and when one of
    them ends too it is the other's alone: scored by that session's state."""
    table = SessionTable()
    for rid, sid in enumerate(("a", "b", "c")):
        r = req(rid, [*SYSTEM, 10 * (rid + 1)], [10 * (rid + 1) + 1], AgentHints(sid))
        table.on_arrival(r, 0.0)
        table.on_finish(r, 0, 1.0)
    assert table.owner[1] == "c" and table.keep_score(1, 0, 2.0) == TIER_SHARED
    table.end("c")
    assert table.owner[1] in ("a", "b") and table.num_holders(1) == 2
    assert table.keep_score(1, 0, 2.0) == TIER_SHARED
    table.end("b")
    assert table.owner[1] == "a" and table.num_holders(1) == 1
    table.sessions["a"].is_last_turn = True  # waiting, and said it will not be back
    assert table.keep_score(1, 0, 2.0) == TIER_AWAY
    table.end("a")
    assert 1 not in table.owner and 1 in table.orphans


def test_overdue_sessions_rank_by_idle_time() -> None:
    table = SessionTable()
    r = req(1, [5, 6], [7], AgentHints("s", expected_tool_s=1.0))
    table.on_arrival(r, 0.0)
    table.on_finish(r, 0, 0.0)
    # expected back at 1 s: active until it is 30 s overdue, then away
    assert table.keep_score(5, node_id=0, now_s=10.0) == TIER_ACTIVE
    assert table.keep_score(5, node_id=0, now_s=40.0) == TIER_AWAY


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.booleans(),
            st.integers(0, 3),
            st.lists(st.integers(0, 11), min_size=1, max_size=6, unique=True),
            st.booleans(),
        ),
        max_size=24,
    )
)
def test_holders_count_the_live_contexts_holding_a_block(
    steps: list[tuple[bool, int, list[int], bool]],
) -> None:
    """Turns of four sessions (named by hints, or inferred from the prompt) and session
    ends in any order, prompts over a few shared blocks: each block's holder count is the
    number of live contexts that hold it, and it has an owner exactly when one does: a
    live session that holds it (the last writer, or when that one let go, the latest of
    the others), never one that ended or moved on while another holder lives."""
    table = SessionTable()
    for rid, (ends, slot, blocks, named) in enumerate(steps):
        sid = f"s{slot}"
        if ends:
            table.end(sid)
        else:
            prompt = [*SYSTEM, *(b + 10 for b in blocks)]
            hints = AgentHints(sid) if named else None
            request = req(rid, prompt, [100 + rid], hints)
            table.on_arrival(request, float(rid))
            table.on_finish(request, 0, float(rid) + 0.5)
        held = {h for e in table.sessions.values() for h in e.context_hashes}
        for h in held | set(table.owner) | set(table.shared):
            holders = [s for s, e in table.sessions.items() if h in e.context_hashes]
            assert table.num_holders(h) == len(holders)
            assert (h in table.owner) == bool(holders)
            if holders:
                assert table.owner[h] in holders
