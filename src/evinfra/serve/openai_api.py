"""OpenAI request schemas (pydantic, at the edge only), agent hints, and error bodies.

A request that fails validation gets HTTP 400 with OpenAI's error shape, and `param`
names the offending field (`max_tokens`, `agent.expected_tool_s`, ...).
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evinfra.core.types import AgentHints, ContextEvent

T = TypeVar("T", bound=BaseModel)

DEFAULT_MAX_TOKENS = 256
"""Output cap when a request names none (OpenAI's chat default is the rest of the context)."""


class ApiError(Exception):
    """An error to return as an OpenAI error body."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        status: int = 400,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.code = code
        self.kind = kind

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


class AgentBody(BaseModel):
    """The `agent` object: hints a client sends about the call's session."""

    model_config = ConfigDict(extra="forbid", strict=True)

    session_id: str | None = None
    parent_session_id: str | None = None
    turn: int | None = Field(default=None, ge=0)
    expected_tool_s: float | None = Field(default=None, ge=0)
    context_event: Literal["start", "append", "compact", "truncate", "fork", "join"] | None = None
    is_last_turn: bool | None = None
    priority: int | None = None
    expected_output_tokens: int | None = Field(default=None, ge=0)


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = None
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    seed: int | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    """vLLM's extension: generate exactly `max_tokens` (benchmarks and replay)."""
    return_token_ids: bool = False
    """Extension: add the output token ids to each choice."""
    agent: AgentBody | None = None

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        return [s for s in stops if s]


class CompletionBody(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatBody(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None


class RoleBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    node: int
    role: Literal["prefill", "decode", "mixed"]


def parse_body(model: type[T], body: Any) -> T:
    """Validate a decoded JSON body; raises ApiError naming the first bad field."""
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err["loc"] if not _is_union_branch(p)]
        param = ".".join(loc) or None
        raise ApiError(f"{param}: {err['msg']}" if param else err["msg"], param) from None


def _is_union_branch(part: Any) -> bool:
    # pydantic names the union member it tried ('str', 'list[int]', 'function-after[...]')
    return isinstance(part, str) and ("[" in part or part in ("str", "int", "float", "bool"))


def agent_hints(agent: AgentBody | None, header_session_id: str | None) -> AgentHints | None:
    """The core hints of a request: the body's `agent` object, and the `X-Session-Id`
    header as the session id when the body names none."""
    session_id = (agent.session_id if agent is not None else None) or header_session_id
    if session_id is None:
        if agent is not None and agent.model_dump(exclude_none=True):
            raise ApiError(
                "agent.session_id is required with other agent hints", "agent.session_id"
            )
        return None
    if agent is None:
        return AgentHints(session_id=session_id)
    return AgentHints(
        session_id=session_id,
        parent_session_id=agent.parent_session_id,
        turn=agent.turn,
        expected_tool_s=agent.expected_tool_s,
        context_event=ContextEvent(agent.context_event) if agent.context_event else None,
        is_last_turn=agent.is_last_turn,
        priority=agent.priority,
        expected_output_tokens=agent.expected_output_tokens,
    )


def requested_max_tokens(body: _Common, prompt_len: int, max_context_tokens: int) -> int:
    """The output cap, checked against the context; raises ApiError."""
    requested = body.max_tokens
    if isinstance(body, ChatBody) and body.max_completion_tokens is not None:
        requested = body.max_completion_tokens
    param = "max_completion_tokens" if isinstance(body, ChatBody) else "max_tokens"
    if requested is not None and requested <= 0:
        raise ApiError(f"{param} must be at least 1, got {requested}", param)
    if prompt_len >= max_context_tokens:
        raise ApiError(
            f"This model's maximum context length is {max_context_tokens} tokens; the prompt "
            f"has {prompt_len}.",
            "messages" if isinstance(body, ChatBody) else "prompt",
            code="context_length_exceeded",
        )
    room = max_context_tokens - prompt_len
    if requested is None:
        return min(DEFAULT_MAX_TOKENS, room)
    if requested > room:
        raise ApiError(
            f"This model's maximum context length is {max_context_tokens} tokens. However, you "
            f"requested {prompt_len + requested} tokens ({prompt_len} in the prompt, "
            f"{requested} for the completion).",
            param,
            code="context_length_exceeded",
        )
    return requested


def usage(
    num_prompt: int,
    num_completion: int,
    num_cached: int,
    num_transfer_bytes: int = 0,
    num_pulled_bytes: int = 0,
) -> dict[str, Any]:
    """OpenAI's usage object, plus evinfra's `kv_transfer_details`: the KV bytes moved
    between nodes for the request, split into the hand-off from its prefill node to its
    decode node and a prefix pulled from another node before its prefill (a client that
    does not know the field ignores it; `evinfra replay` sums it)."""
    return {
        "prompt_tokens": num_prompt,
        "completion_tokens": num_completion,
        "total_tokens": num_prompt + num_completion,
        "prompt_tokens_details": {"cached_tokens": num_cached},
        "kv_transfer_details": {
            "handed_off_bytes": num_transfer_bytes - num_pulled_bytes,
            "pulled_bytes": num_pulled_bytes,
        },
    }
