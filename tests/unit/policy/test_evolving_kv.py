"""The agent-aware KV manager: eviction by expected next use, dead blocks freed at once."""

from evinfra.core.eviction import LRUEviction
from evinfra.core.kv_pool import KVPool
from evinfra.core.tiered_eviction import TieredEviction
from evinfra.core.types import AgentHints, ContextEvent, Request
from evinfra.policy.base import DropBlocks, PrefetchBlocks
from evinfra.policy.evolving.kv_manager import AgentKVManager, KVManagerConfig
from evinfra.policy.evolving.sessions import SessionTable
from tests.unit.policy.dynamo_fakes import cluster


def req(rid: int, sid: str, prompt: list[int], tool_s: float, **kw: object) -> Request:
    hints = AgentHints(sid, expected_tool_s=tool_s, **kw)  # type: ignore[arg-type]
    return Request(rid, tuple(prompt), len(prompt) * 16, 8, (), hints)


def fill(pool: KVPool, hashes: list[int]) -> list[int]:
    ids = pool.try_allocate(len(hashes))
    assert ids is not None
    for i, h in zip(ids, hashes, strict=True):
        pool.commit(i, h)
    return ids


def test_session_back_soon_outlives_one_away_long() -> None:
    kv = AgentKVManager(SessionTable())
    pool = KVPool(6, eviction=kv.eviction_for(0))
    soon = req(1, "soon", [10, 11], tool_s=2.0)
    late = req(2, "late", [20, 21], tool_s=600.0)
    for r in (soon, late):
        kv.on_arrival(r, 0.0)
    ids_soon = fill(pool, [10, 11])
    ids_late = fill(pool, [20, 21])
    # the short-tool session finishes *last*: LRU would evict it last too, so finish it
    # first to make the policies disagree
    pool.free(ids_soon)
    kv.on_finish(soon, 0, 1.0)
    pool.free(ids_late)
    kv.on_finish(late, 0, 1.0)
    assert isinstance(pool.eviction, TieredEviction)
    # the long wait goes first, tail before head among equals; the short wait stays
    got = pool.try_allocate(4)
    assert got is not None
    assert pool.match_prefix([10, 11]).num_device_blocks == 2
    assert pool.match_prefix([20, 21]).num_device_blocks == 0
    pool.check_integrity()


def test_lru_ablation_evicts_the_other_way() -> None:
    kv = AgentKVManager(SessionTable(), KVManagerConfig(agent_eviction=False))
    pool = KVPool(6, eviction=kv.eviction_for(0))
    assert isinstance(pool.eviction, LRUEviction)
    soon = req(1, "soon", [10, 11], tool_s=2.0)
    late = req(2, "late", [20, 21], tool_s=600.0)
    ids_soon, ids_late = fill(pool, [10, 11]), fill(pool, [20, 21])
    pool.free(ids_soon)
    kv.on_finish(soon, 0, 1.0)
    pool.free(ids_late)
    kv.on_finish(late, 0, 1.0)
    assert pool.try_allocate(4) is not None
    assert pool.match_prefix([10, 11]).num_device_blocks == 0


def test_compaction_drops_the_dead_context_at_once() -> None:
    kv = AgentKVManager(SessionTable())
    r1 = Request(1, (1, 2, 3, 4), 64, 8, (5,), AgentHints("s", turn=0))
    kv.on_arrival(r1, 0.0)
    kv.table.note_route(1, (2, 3))
    kv.on_finish(r1, 3, 1.0)
    compacted = Request(
        2, (1, 2, 9), 48, 8, (), AgentHints("s", context_event=ContextEvent.COMPACT)
    )
    actions = kv.on_arrival(compacted, 2.0)
    assert actions == [DropBlocks(2, (3, 4, 5)), DropBlocks(3, (3, 4, 5))]


def test_last_turn_orphans_the_session_and_prefetch_precedes_a_return() -> None:
    kv = AgentKVManager(SessionTable(), KVManagerConfig(prefetch_lead_s=2.0))
    r1 = req(1, "s", [1, 2], tool_s=10.0)
    kv.on_arrival(r1, 0.0)
    kv.table.note_route(1, (0,))
    kv.on_finish(r1, 0, 1.0)
    view = cluster()
    assert kv.on_tick(view, 8.0) == []
    assert kv.on_tick(view, 9.0) == [PrefetchBlocks(0, (1, 2))]
    r2 = req(2, "s", [1, 2, 3], tool_s=1.0, is_last_turn=True)
    kv.on_arrival(r2, 11.0)
    assert kv.on_finish(r2, 0, 12.0) == []
    assert "s" not in kv.table.sessions
    assert set(kv.table.orphans) == {1, 2, 3}
