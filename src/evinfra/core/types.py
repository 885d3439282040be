"""Core value types shared by the policy core and every runtime."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Role(enum.Enum):
    """What a node admits. The KV pool belongs to the node, not to the role."""

    PREFILL = "prefill"
    DECODE = "decode"
    MIXED = "mixed"


class Tier(enum.Enum):
    DEVICE = "device"
    HOST = "host"


class ContextEvent(enum.Enum):
    """The agent context-management operation that built a prompt."""

    START = "start"
    APPEND = "append"
    COMPACT = "compact"
    TRUNCATE = "truncate"
    FORK = "fork"
    JOIN = "join"


class SessionState(enum.Enum):
    GENERATING = "generating"
    WAITING_TOOL = "waiting_tool"
    IDLE = "idle"
    FINISHED = "finished"


@dataclass(frozen=True, slots=True)
class AgentHints:
    """What a well-behaved agent client tells the server about a call.

    Every field is optional except the session id: a client may send only that.
    """

    session_id: str
    parent_session_id: str | None = None
    turn: int | None = None
    expected_tool_s: float | None = None
    context_event: ContextEvent | None = None
    is_last_turn: bool | None = None
    priority: int | None = None
    expected_output_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Request:
    """One call, as the policy core sees it.

    `prompt_hashes` are the chained hashes of the prompt's full blocks. `output_hashes`
    are the hashes of the full blocks that generation completes, continuing the prompt
    (block `len(prompt_hashes)` onwards); the simulator knows them in advance, a server
    learns them as tokens are generated and may leave this empty.
    """

    request_id: int
    prompt_hashes: tuple[int, ...]
    num_prompt_tokens: int
    max_output_tokens: int
    output_hashes: tuple[int, ...] = ()
    hints: AgentHints | None = None

    @property
    def session_id(self) -> str | None:
        return self.hints.session_id if self.hints is not None else None


@dataclass(frozen=True, slots=True)
class Route:
    """Where a request's prefill and decode run.

    `prefill_node` equal to `decode_node` means the prefill runs locally on the decode
    node (aggregated, or conditional disaggregation choosing local prefill).
    `pull_from_node` names a node whose cached prefix the prefill node should pull
    instead of recomputing it (None: recompute what is not local).
    """

    prefill_node: int
    decode_node: int
    pull_from_node: int | None = None

    @property
    def is_disaggregated(self) -> bool:
        return self.prefill_node != self.decode_node


class SwitchMode(enum.Enum):
    """How a role change is carried out."""

    IN_PLACE = "in_place"  # evinfra: the scheduler setting changes, KV is kept
    RESTART = "restart"  # Dynamo: stop the worker (KV lost), start it again after a cold start


@dataclass(frozen=True, slots=True)
class RoleChange:
    node_id: int
    new_role: Role
    mode: SwitchMode = SwitchMode.IN_PLACE
