"""The KV manager's run scorer answers as `SessionTable.keep_score` block by block."""

from hypothesis import given, settings
from hypothesis import strategies as st

from evinfra.core.types import SessionState
from evinfra.policy.evolving.kv_manager import run_keep_scores
from evinfra.policy.evolving.sessions import SessionEntry, SessionTable

SESSIONS = ("a", "b", "c")
entries = st.builds(
    SessionEntry,
    st.just(""),
    state=st.sampled_from(list(SessionState)),
    last_finish_s=st.floats(0.0, 100.0),
    expected_gap_s=st.floats(0.0, 100.0),
    num_children_running=st.integers(0, 1),
    is_last_turn=st.booleans(),
)


def make_table(
    live: dict[str, SessionEntry], owners: dict[int, str], shared: set[int], orphans: set[int]
) -> SessionTable:
    table = SessionTable()
    for sid, entry in live.items():
        entry.session_id = sid
        table.sessions[sid] = entry
    table.owner.update(owners)
    table.shared.update({h: {"x": None} for h in shared if h in owners})
    table.orphans.update(dict.fromkeys(orphans))
    return table


@settings(max_examples=500, deadline=None)
@given(
    st.dictionaries(st.sampled_from(SESSIONS), entries),
    st.lists(st.sampled_from(SESSIONS), min_size=16, max_size=16),
    st.sets(st.integers(0, 19)),
    st.sets(st.integers(0, 19)),
    st.lists(st.integers(0, 19), min_size=1, max_size=8),
    st.floats(0.0, 200.0),
)
def test_run_keep_scores_are_keep_scores(
    live: dict[str, SessionEntry],
    owner_of: list[str],
    shared: set[int],
    orphans: set[int],
    hashes: list[int],
    now_s: float,
) -> None:
    """Hashes 0-15 have owners (runs of one session are common: `owner_of` repeats),
    16-19 none; some are shared, some orphans."""
    owners = {h: owner_of[h // 4 * 4] if h % 3 else owner_of[h] for h in range(16)}
    table = make_table(live, owners, shared, orphans)
    expected = [table.keep_score(h, 0, now_s) for h in hashes]
    assert run_keep_scores(table, hashes, 0, now_s) == expected
    run = [h for h in range(16) if owners[h] == owners[hashes[0] % 16]]
    assert run_keep_scores(table, run, 0, now_s) == [table.keep_score(h, 0, now_s) for h in run]
