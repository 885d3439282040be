"""Messages between the frontend and the node workers, and between workers.

Every worker has one inbox (a multiprocessing queue) that the frontend and the other
workers write to; the workers share one outbox to the frontend. Queues never block a
writer, so two workers that send each other KV at the same time cannot deadlock. All
messages are frozen dataclasses that pickle; none holds a tensor (KV travels as bytes).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from evinfra.core.types import Request, Role
from evinfra.policy.base import DropBlocks, KVAction, OffloadBlocks, ScoreBlocks


class FinishReason(enum.Enum):
    STOP = "stop"  # a stop token
    LENGTH = "length"  # max_tokens reached


@dataclass(frozen=True, slots=True)
class Sampling:
    """Sampling settings as plain numbers (the frontend never imports torch)."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0


@dataclass(frozen=True, slots=True)
class Generation:
    """What a worker needs to run one request besides the core Request."""

    prompt_ids: tuple[int, ...]
    stop_token_ids: frozenset[int]
    sampling: Sampling


# -- frontend -> worker --------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Submit:
    """Prefill `request` here; decode here too unless `decode_node` is another node."""

    request: Request
    generation: Generation
    decode_node: int
    submit_seq: int
    """Per-node counter: stats echo the last one seen, so the frontend knows which of its
    submissions a snapshot already counts."""
    pull_from: int | None = None
    """A node holding more of the prompt's prefix than this one: pull those blocks' KV
    from it (`PrefixPull`) before the prefill, instead of computing them again."""


@dataclass(frozen=True, slots=True)
class Abort:
    request_id: int


@dataclass(frozen=True, slots=True)
class SetRole:
    role: Role
    restart: bool = False
    """Dynamo-style: stop serving, drain, lose the KV, serve again after `cold_start_s`."""
    cold_start_s: float = 0.0
    control_seq: int = 0
    """Echoed by the node's stats, so the frontend knows when a snapshot reflects it."""


class KVActionKind(enum.Enum):
    DROP = "drop"
    OFFLOAD = "offload"
    PREFETCH = "prefetch"


@dataclass(frozen=True, slots=True)
class ApplyKV:
    kind: KVActionKind
    hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SetBlockScores:
    """The KV manager's keep-score for these hashes on this node (`policy.base.ScoreBlocks`),
    for an eviction strategy that takes published scores (`policy.published.ScoreSink`)."""

    score: float
    hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CheckIntegrity:
    token: int


@dataclass(frozen=True, slots=True)
class Shutdown:
    pass


# -- worker -> worker (disaggregation) -----------------------------------------------------
@dataclass(frozen=True, slots=True)
class HandoffOffer:
    """Prefill node -> decode node: a prefilled request whose KV waits on `src_node`."""

    src_node: int
    request: Request
    generation: Generation
    generated_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class KVPull:
    """Decode node -> prefill node: send blocks [first_block, first_block + num_blocks)."""

    dst_node: int
    request_id: int
    first_block: int
    num_blocks: int


@dataclass(frozen=True, slots=True)
class KVPayload:
    """Prefill node -> decode node: the bytes of the pulled blocks (None: the prefill node no
    longer holds the request, so the decode node must drop it). Also the answer to a
    `PrefixPull`, from the holder to the prefill node."""

    src_node: int
    request_id: int
    first_block: int
    data: bytes | None


@dataclass(frozen=True, slots=True)
class PrefixPull:
    """Prefill node -> the node the router named in `Submit.pull_from`: send the bytes of
    the leading blocks of `hashes` you hold on device, as a `KVPayload` with first block 0
    (the receiver knows the hashes it asked for; the payload's length says how many)."""

    dst_node: int
    request_id: int
    hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class HandoffCancel:
    """Decode node -> prefill node: the request was aborted, release its handoff."""

    request_id: int


# -- worker -> frontend --------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class WorkerReady:
    node_id: int
    num_blocks: int
    block_size: int
    kv_bytes_per_token: int
    vocab_size: int


@dataclass(frozen=True, slots=True)
class WorkerFailed:
    """The worker could not start (or crashed with a Python error it could report)."""

    node_id: int
    message: str


@dataclass(frozen=True, slots=True)
class TokensOut:
    """New output tokens of one request (the stop token excluded), and its end if it ended.

    `num_cached_tokens` (prompt tokens served from this node's cache) rides on the first
    message of a request from its prefill node; `num_transfer_bytes` on the message of the
    node that received KV for it (a hand-off, or a prefix pulled before its prefill, which
    `num_pulled_bytes` names)."""

    node_id: int
    request_id: int
    token_ids: tuple[int, ...]
    finish: FinishReason | None = None
    num_cached_tokens: int | None = None
    num_transfer_bytes: int = 0
    num_pulled_bytes: int = 0
    num_preemptions: int = 0


@dataclass(frozen=True, slots=True)
class RequestFailed:
    node_id: int
    request_id: int
    message: str


@dataclass(frozen=True, slots=True)
class NodeStats:
    """A snapshot of one node: everything `policy.base.NodeView` reads, plus counters."""

    node_id: int
    role: Role
    is_serving: bool
    block_size: int
    num_device_blocks: int
    num_free_blocks: int
    num_used_blocks: int
    num_waiting_prefill_tokens: int
    num_waiting_requests: int
    num_running_decodes: int
    num_decode_blocks: int
    num_decode_context_tokens: int
    cached_hashes: frozenset[int]
    last_submit_seq: int
    last_control_seq: int
    num_prompt_tokens_seen: int
    num_prompt_tokens_cached: int
    num_preemptions: int
    num_steps: int
    num_pending_incoming: int
    busy_s: float
    last_step_s: float = 0.0
    """How long the node's last step ran (0 before its first): the frontend reads where a
    busy node's steps stand from it and the snapshot's arrival (`ClusterState`)."""


@dataclass(frozen=True, slots=True)
class IntegrityReport:
    node_id: int
    token: int
    ok: bool
    message: str
    num_used_blocks: int
    is_idle: bool


WorkerMessage = (
    Submit | Abort | SetRole | ApplyKV | SetBlockScores | CheckIntegrity | Shutdown
    | HandoffOffer | KVPull | KVPayload | HandoffCancel | PrefixPull
)  # fmt: skip
FrontendMessage = (
    WorkerReady | WorkerFailed | TokensOut | RequestFailed | NodeStats | IntegrityReport
)


def kv_messages(action: KVAction, num_nodes: int) -> list[tuple[int, WorkerMessage]]:
    """The KV manager's action as (node id, message) pairs."""
    if isinstance(action, ScoreBlocks):
        return [(action.node_id, SetBlockScores(action.score, action.hashes))]
    if isinstance(action, DropBlocks):
        targets = range(num_nodes) if action.node_id is None else [action.node_id]
        return [(n, ApplyKV(KVActionKind.DROP, action.hashes)) for n in targets]
    kind = KVActionKind.OFFLOAD if isinstance(action, OffloadBlocks) else KVActionKind.PREFETCH
    return [(action.node_id, ApplyKV(kind, action.hashes))]
