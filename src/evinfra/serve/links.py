"""The `local` runtime's message links: one queue per (sender, receiver) pair.

A multiprocessing queue is written under a lock that lives in shared memory. A process
killed while its feeder thread holds that lock (in the middle of a write, or blocked on a
full pipe) leaves it held forever, and a message cut short leaves the pipe mid-frame. Had
the nodes shared one queue towards the frontend, or written into each other's inboxes,
one node's death would silence the survivors. Here every queue has exactly one writing
process, so a death can break only the dead node's own links; the receiving end reads
each of its links on a thread of its own, so a link broken mid-frame stalls no other.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass(slots=True)
class NodeLinks:
    """What node `node_id` is handed at start: its inbox from the frontend, its outbox to
    the frontend, and one queue from and one to every other node (None at its own index)."""

    node_id: int
    inbox: Any
    outbox: Any
    peers_in: list[Any]
    peers_out: list[Any]


class LocalLinks:
    """All the queues of a cluster of `num_nodes` worker processes, made with `ctx`."""

    def __init__(self, ctx: Any, num_nodes: int) -> None:
        self.inboxes = [ctx.Queue() for _ in range(num_nodes)]
        """Frontend -> node; only the frontend writes."""
        self.outboxes = [ctx.Queue() for _ in range(num_nodes)]
        """Node -> frontend; only that node writes."""
        self.peer = [
            [None if src == dst else ctx.Queue() for dst in range(num_nodes)]
            for src in range(num_nodes)
        ]
        """`peer[src][dst]`: node src -> node dst; only src writes."""
        self.readers: OutboxReaders | None = None

    def start_readers(self, deliver: Callable[[Any], None]) -> None:
        """Read every outbox on a thread of its own, handing each batch to `deliver`."""
        self.readers = OutboxReaders(self.outboxes, deliver)

    def for_node(self, node_id: int) -> NodeLinks:
        n = len(self.inboxes)
        return NodeLinks(
            node_id,
            self.inboxes[node_id],
            self.outboxes[node_id],
            [self.peer[src][node_id] for src in range(n)],
            list(self.peer[node_id]),
        )

    def all_queues(self) -> list[Any]:
        peers = [q for row in self.peer for q in row if q is not None]
        return [*self.inboxes, *self.outboxes, *peers]

    def close(self, alive: Sequence[bool], timeout_s: float) -> None:
        """Stop the readers (`OutboxReaders.stop`), then close every queue without waiting
        for unsent data (its reader may be gone)."""
        if self.readers is not None:
            self.readers.stop(alive, timeout_s)
        for q in self.all_queues():
            q.close()
            q.cancel_join_thread()


def pump(source: Any, deliver: Callable[[Any], None]) -> None:
    """Hand every message read from `source` to `deliver` until it is closed or sends
    None; a thread's body, one per link."""
    while True:
        try:
            msg = source.get()
        except (EOFError, OSError, ValueError):
            return  # closed
        except Exception:  # a frame cut short by a writer that died: drop the link
            log.warning("a link broke mid-message; its writer is presumed dead")
            return
        if msg is None:
            return
        deliver(msg)


class Mailbox:
    """One receiver's links merged into one local queue, each link read on its own daemon
    thread, so a link whose writer died mid-frame stalls only its own thread.

    Has the `get(timeout=)` / `get_nowait()` of a queue, and `put()` for messages a node
    sends itself, which need no pickling and no pipe."""

    def __init__(self, sources: Sequence[Any], name: str) -> None:
        self._merged: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for i, source in enumerate(sources):
            if source is None:
                continue
            thread = threading.Thread(
                target=pump, args=(source, self._merged.put), name=f"{name}-link-{i}", daemon=True
            )
            thread.start()

    def get(self, timeout: float | None = None) -> Any:
        return self._merged.get(timeout=timeout)

    def get_nowait(self) -> Any:
        return self._merged.get_nowait()

    def put(self, msg: Any) -> None:
        self._merged.put(msg)


class OutboxReaders:
    """The frontend's end of the nodes' outboxes: one daemon thread per node hands each
    batch it reads to `deliver` (called on that thread)."""

    def __init__(self, outboxes: Sequence[Any], deliver: Callable[[Any], None]) -> None:
        self._outboxes = list(outboxes)
        self._threads = [
            threading.Thread(
                target=pump, args=(q, deliver), name=f"evinfra-outbox-{i}", daemon=True
            )
            for i, q in enumerate(self._outboxes)
        ]
        for thread in self._threads:
            thread.start()

    def stop(self, alive: Sequence[bool], timeout_s: float) -> None:
        """Wake and join the readers of the nodes still alive (they exited on request). A
        dead node's reader may be stuck in a frame the node never finished: a daemon
        thread, it is left to end with the process."""
        live = [i for i, thread in enumerate(self._threads) if i >= len(alive) or alive[i]]
        for i in live:
            self._outboxes[i].put(None)
        for i in live:
            self._threads[i].join(timeout_s)


def node_mailbox(links: NodeLinks) -> tuple[Mailbox, list[Any]]:
    """The node's merged inbox, and its queues to every node (its own mailbox at its own
    index, so a message to itself never crosses a pipe)."""
    mailbox = Mailbox([links.inbox, *links.peers_in], f"evinfra-node-{links.node_id}")
    peers: list[Any] = list(links.peers_out)
    peers[links.node_id] = mailbox
    return mailbox, peers
