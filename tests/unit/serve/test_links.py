"""Links between the local runtime's processes: one writer per queue, so a writer killed
mid-message breaks only its own link (`serve.links`)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import signal
import time
from typing import Any

from evinfra.serve.links import LocalLinks, Mailbox, node_mailbox


def _write_forever(q: Any, tag: str, size: int) -> None:
    payload = b"x" * size
    while True:
        q.put((tag, payload))
        if size < 1024:
            time.sleep(0.005)


def test_each_queue_has_one_writer() -> None:
    ctx = multiprocessing.get_context("spawn")
    links = LocalLinks(ctx, 3)
    try:
        mine = [links.for_node(i) for i in range(3)]
        written = [
            *links.inboxes,  # by the frontend
            *(q for n in mine for q in [n.outbox, *n.peers_out] if q is not None),
        ]
        assert len({id(q) for q in written}) == len(written) == len(links.all_queues())
        assert mine[1].peers_in[0] is mine[0].peers_out[1]
        assert mine[1].peers_in[1] is None and mine[1].peers_out[1] is None
    finally:
        links.close([], 1.0)


def test_a_node_sends_itself_messages_through_its_mailbox() -> None:
    ctx = multiprocessing.get_context("spawn")
    links = LocalLinks(ctx, 2)
    try:
        mailbox, peers = node_mailbox(links.for_node(1))
        assert peers[1] is mailbox and peers[0] is links.peer[1][0]
        peers[1].put("self")
        links.inboxes[1].put("frontend")
        got = {mailbox.get(timeout=5.0), mailbox.get(timeout=5.0)}
        assert got == {"self", "frontend"}
    finally:
        links.close([], 1.0)


def test_a_writer_killed_mid_message_does_not_stall_the_other_links() -> None:
    ctx = multiprocessing.get_context("spawn")
    big, small = ctx.Queue(), ctx.Queue()
    mailbox = Mailbox([big, small], "test")
    writers = [
        ctx.Process(target=_write_forever, args=(big, "big", 4 << 20), daemon=True),
        ctx.Process(target=_write_forever, args=(small, "small", 16), daemon=True),
    ]
    for proc in writers:
        proc.start()
    try:
        seen: set[str] = set()
        start = time.monotonic()
        while seen != {"big", "small"} and time.monotonic() < start + 60.0:
            with contextlib.suppress(queue.Empty):
                seen.add(mailbox.get(timeout=5.0)[0])
        alive = [p.is_alive() for p in writers]
        assert seen == {"big", "small"}, f"heard {seen} in 60 s; writers alive: {alive}"
        os.kill(int(writers[0].pid or 0), signal.SIGKILL)  # most likely mid-message: 4 MiB each
        writers[0].join()
        while True:  # drop what arrived before the kill
            try:
                mailbox.get_nowait()
            except queue.Empty:
                break
        tags = [mailbox.get(timeout=10.0)[0] for _ in range(20)]
        assert tags.count("small") >= 19
    finally:
        for proc in writers:
            proc.kill()
            proc.join()
        for q in (big, small):
            q.close()
            q.cancel_join_thread()
