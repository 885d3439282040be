"""The frontend's estimate of where each node stands in its step: workers report how long
their last step ran, the frontend counts steps back to back from each snapshot's arrival,
and the evolving router (`step_phase_wait`) sends a prefill to the node about to finish."""

from __future__ import annotations

import dataclasses
import queue
from typing import Any

import pytest

from evinfra.core.blocks import hash_token_blocks
from evinfra.core.types import AgentHints, Request, Role
from evinfra.policy.evolving.router import EvolvingRouter, RouterConfig
from evinfra.policy.evolving.sessions import SessionTable
from evinfra.serve.executors import ExecutorSpec
from evinfra.serve.protocol import Generation, NodeStats, Sampling, Submit
from evinfra.serve.timed_executor import TimedExecutor
from evinfra.serve.view import ClusterState, NodeState
from evinfra.serve.worker import NodeWorker, WorkerSpec
from tests.unit.policy.test_evolving_router_planner import RATES
from tests.unit.serve.test_worker_eviction import BLOCK, NoCost


def stats(node_id: int, decodes: int, last_step_s: float) -> NodeStats:
    return NodeStats(
        node_id, Role.MIXED, True, 16, 1000, 1000 - 10 * decodes, 10 * decodes, 0, 0,
        decodes, 10 * decodes, 160 * decodes, frozenset(), 0, 0, 0, 0, 0, 0, 0, 0.0,
        last_step_s,
    )  # fmt: skip


def test_a_worker_reports_how_long_its_last_step_ran() -> None:
    spec = WorkerSpec(0, Role.MIXED, ExecutorSpec(), 10, BLOCK, 64, 8)
    executor = TimedExecutor(NoCost(), 10, BLOCK, 300)  # type: ignore[arg-type]
    inbox: queue.Queue[Any] = queue.Queue()
    worker = NodeWorker(spec, executor, inbox, queue.Queue(), [inbox])
    assert worker.stats().last_step_s == 0.0
    prompt = list(range(8))
    request = Request(1, tuple(hash_token_blocks(prompt, BLOCK)), len(prompt), 4)
    worker.handle(Submit(request, Generation(tuple(prompt), frozenset(), Sampling()), 0, 1))
    assert worker.step()
    assert worker.stats().last_step_s > 0.0


def test_the_frontend_counts_steps_back_to_back_from_the_snapshot() -> None:
    node = NodeState(0, stats(0, 3, 0.0))
    view = ClusterState([node])
    node.update(stats(0, 3, 0.0), received_s=10.0)
    assert view.step_remaining_s(0, 10.005) is None  # not stepped yet: unknown
    node.update(stats(0, 3, 0.020), received_s=10.0)
    assert view.step_remaining_s(0, 10.005) == pytest.approx(0.015)
    assert view.step_remaining_s(0, 10.045) == pytest.approx(0.015)  # the third step
    assert view.step_remaining_s(0, 9.99) == pytest.approx(0.020)  # a stale clock: a step
    node.update(stats(0, 0, 0.020), received_s=10.0)
    assert view.step_remaining_s(0, 10.005) is None  # not decoding


def test_the_router_sends_a_prefill_to_the_node_about_to_finish_its_step() -> None:
    """Two nodes alike (64 decodes, 20 ms steps) but for when their snapshots arrived: at
    10.030, node 0 has 10 ms of its step left, node 1 (a snapshot 9 ms later) 19 ms."""
    nodes = [NodeState(i, stats(i, 64, 0.020)) for i in (0, 1)]
    nodes[0].update(stats(0, 64, 0.020), received_s=10.000)
    nodes[1].update(stats(1, 64, 0.020), received_s=10.009)
    view = ClusterState(nodes)
    req = Request(7, tuple(range(60)), 60 * 16 + 8, 32, (), AgentHints("s"))
    phase = RouterConfig(inflight_step_wait=True, step_phase_wait=True)
    route = EvolvingRouter(SessionTable(), RATES, phase).route(req, view, 10.030)
    assert route.prefill_node == 0
    # later snapshots: node 0 25 ms back (5 ms into its second step, 15 left), node 1
    # 11 ms back (9 left)
    nodes[0] = dataclasses.replace(nodes[0], received_s=10.005)
    nodes[1] = dataclasses.replace(nodes[1], received_s=10.019)
    view = ClusterState(nodes)
    route = EvolvingRouter(SessionTable(), RATES, phase).route(req, view, 10.030)
    assert route.prefill_node == 1
