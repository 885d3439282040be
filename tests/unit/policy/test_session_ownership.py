"""The session table's ownership counts after finishes, in C-level passes, against the
per-hash loop they replace: same owners, counts and orphans (dict order included)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from evinfra.core.blocks import common_prefix_len
from evinfra.core.types import AgentHints, Request
from evinfra.policy.evolving.sessions import SessionEntry, SessionTable


class LoopTable(SessionTable):
    """`on_finish`'s ownership update as first written: one hash at a time."""

    def on_finish(self, request: Request, node_id: int, now_s: float) -> SessionEntry | None:
        sid = self.request_session.pop(request.request_id, None)
        if sid is None or sid not in self.sessions:
            return None
        entry = self.sessions[sid]
        entry.num_inflight -= 1
        context = request.prompt_hashes + request.output_hashes
        keep = common_prefix_len(entry.context_hashes, context)
        old_tail, new_tail = entry.context_hashes[keep:], context[keep:]
        if old_tail:
            new_set = set(new_tail)
            self._release(tuple(h for h in old_tail if h not in new_set))
        old_set = set(old_tail)
        for h in new_tail:
            if h not in old_set:
                self.num_owners[h] = self.num_owners.get(h, 0) + 1
                self.orphans.pop(h, None)
            self.owner[h] = sid
        entry.context_hashes = context
        return entry


def state(table: SessionTable) -> tuple[object, ...]:
    return (
        list(table.owner.items()),
        list(table.num_owners.items()),
        list(table.orphans),
    )


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["call", "call", "end"]),
            st.integers(0, 3),  # session
            st.lists(st.integers(0, 12), max_size=8),  # prompt hashes (repeats allowed)
            st.lists(st.integers(0, 12), max_size=3),  # output hashes
        ),
        max_size=40,
    )
)
def test_finish_updates_ownership_as_the_per_hash_loop(
    ops: list[tuple[str, int, list[int], list[int]]],
) -> None:
    tables = (SessionTable(max_orphans=6), LoopTable(max_orphans=6))
    for rid, (op, session, prompt, output) in enumerate(ops):
        sid = f"s{session}"
        for table in tables:
            if op == "end":
                table.end(sid)
                continue
            hints = AgentHints(session_id=sid)
            request = Request(rid, tuple(prompt), 16 * len(prompt), 32, tuple(output), hints)
            table.on_arrival(request, float(rid))
            table.on_finish(request, 0, float(rid) + 0.5)
        assert state(tables[0]) == state(tables[1])
