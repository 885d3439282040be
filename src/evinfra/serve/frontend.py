"""The HTTP frontend: OpenAI-compatible completions and chat (streaming and not), models,
health, Prometheus metrics, and admin endpoints, over a `LocalCluster`.

The cluster starts in the background when the app starts, so `/health` answers 503
("starting") while the workers load their models and 200 ("ready") once they serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from evinfra.core.types import Role
from evinfra.serve.executors import ModelInfo
from evinfra.serve.openai_api import (
    ApiError,
    ChatBody,
    CompletionBody,
    RoleBody,
    agent_hints,
    parse_body,
    requested_max_tokens,
    usage,
)
from evinfra.serve.protocol import FinishReason, Sampling
from evinfra.serve.requests import RequestHandle
from evinfra.serve.runtime import LocalCluster
from evinfra.serve.text import TextStream

DISCONNECT_POLL_S = 0.25


class Frontend:
    def __init__(self, cluster: LocalCluster, model: ModelInfo) -> None:
        self.cluster = cluster
        self.model = model
        self.max_context_tokens = min(
            model.max_position_tokens, cluster.config.num_blocks * cluster.config.block_size
        )
        self.start_error: str | None = None
        self._start_task: asyncio.Task[None] | None = None

    async def _start(self) -> None:
        try:
            await self.cluster.start()
        except Exception as exc:
            self.start_error = str(exc)
            raise

    # -- helpers ---------------------------------------------------------------------------
    def _check_ready(self) -> None:
        if not self.cluster.is_ready:
            raise ApiError("the server is starting", status=503, kind="service_unavailable")

    def _check_model(self, name: str) -> None:
        if name not in self.model.aliases:
            raise ApiError(
                f"The model `{name}` does not exist; this server serves `{self.model.name}`.",
                "model",
                code="model_not_found",
            )

    def _prompt_ids(self, prompt: str | list[int] | list[str] | list[list[int]]) -> list[int]:
        if isinstance(prompt, str):
            ids = self.model.tokenizer.encode(prompt)
        elif prompt and all(isinstance(p, int) for p in prompt):
            ids = [int(p) for p in prompt]  # type: ignore[arg-type]
        elif len(prompt) == 1 and isinstance(prompt[0], str):
            ids = self.model.tokenizer.encode(prompt[0])
        elif len(prompt) == 1 and isinstance(prompt[0], list):
            ids = [int(p) for p in prompt[0]]
        elif not prompt:
            ids = []
        else:
            raise ApiError("only one prompt per request is supported", "prompt")
        if not ids:
            raise ApiError("the prompt is empty", "prompt")
        bad = [t for t in ids if not 0 <= t < self.model.vocab_size]
        if bad:
            raise ApiError(f"token ids {bad[:3]} are outside the vocabulary", "prompt")
        return ids

    def _chat_ids(self, body: ChatBody) -> list[int]:
        messages = [
            {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            for m in body.messages
        ]
        try:
            return self.model.tokenizer.encode_chat(messages)
        except ValueError as exc:
            raise ApiError(str(exc), "messages") from None

    def _launch(self, body: CompletionBody | ChatBody, ids: list[int], request: Request) -> Any:
        if body.n != 1:
            raise ApiError("only n=1 is supported", "n")
        hints = agent_hints(body.agent, request.headers.get("x-session-id"))
        max_tokens = requested_max_tokens(body, len(ids), self.max_context_tokens)
        stops = frozenset() if body.ignore_eos else self.model.tokenizer.stop_token_ids
        sampling = Sampling(body.temperature, body.top_p, body.seed or 0)
        return self.cluster.generate(
            ids, max_tokens, stop_token_ids=stops, sampling=sampling, hints=hints
        )

    # -- endpoints -------------------------------------------------------------------------
    async def completions(self, request: Request) -> Response:
        body = parse_body(CompletionBody, await _json(request))
        self._check_model(body.model)
        ids = self._prompt_ids(body.prompt)
        self._check_ready()
        handle = self._launch(body, ids, request)
        return await self._respond(handle, body, request, chat=False)

    async def chat(self, request: Request) -> Response:
        body = parse_body(ChatBody, await _json(request))
        self._check_model(body.model)
        ids = self._chat_ids(body)
        self._check_ready()
        handle = self._launch(body, ids, request)
        return await self._respond(handle, body, request, chat=True)

    async def _respond(
        self, handle: RequestHandle, body: CompletionBody | ChatBody, request: Request, chat: bool
    ) -> Response:
        meta = _Meta(handle, self.model.name, chat, streaming=body.stream)
        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            stream = self._stream(handle, body, meta, include_usage)
            return StreamingResponse(stream, media_type="text/event-stream")
        return await self._collect(handle, body, meta, request)

    async def _collect(
        self, handle: RequestHandle, body: CompletionBody | ChatBody, meta: _Meta, request: Request
    ) -> Response:
        text = TextStream(self.model.tokenizer, body.stop_strings())
        finish: FinishReason | None = None
        try:
            while finish is None:
                try:
                    event = await asyncio.wait_for(handle.events.get(), DISCONNECT_POLL_S)
                except TimeoutError:
                    if await request.is_disconnected():
                        return Response(status_code=499)
                    continue
                if event.error is not None:
                    raise ApiError(event.error, status=500, kind="server_error")
                text.push(event.token_ids)
                finish = FinishReason.STOP if text.stopped else event.finish
        finally:
            handle.abort()
        choice = meta.choice(text.text, finish, body.return_token_ids, text.token_ids)
        payload = meta.envelope([choice])
        payload["usage"] = meta.usage(text.num_tokens)
        return JSONResponse(payload)

    async def _stream(
        self,
        handle: RequestHandle,
        body: CompletionBody | ChatBody,
        meta: _Meta,
        include_usage: bool,
    ) -> AsyncIterator[str]:
        text = TextStream(self.model.tokenizer, body.stop_strings())
        try:
            if meta.chat:
                yield _sse(meta.envelope([meta.choice("", None, False, (), role=True)]))
            async for event in handle.stream():
                if event.error is not None:
                    err = ApiError(event.error, status=500, kind="server_error")
                    yield _sse(err.body())
                    break
                delta_ids = event.token_ids
                delta = text.push(delta_ids)
                finish = FinishReason.STOP if text.stopped else event.finish
                if finish is not None:
                    delta += text.finish()
                choice = meta.choice(delta, finish, body.return_token_ids, delta_ids)
                chunk = meta.envelope([choice])
                if finish is not None:
                    use = meta.usage(text.num_tokens)
                    chunk["usage"] = use
                    yield _sse(chunk)
                    if include_usage:
                        yield _sse(meta.envelope([]) | {"usage": use})
                    break
                yield _sse(chunk)
            yield "data: [DONE]\n\n"
        finally:
            handle.abort()  # a client that went away frees its KV

    async def models(self) -> dict[str, Any]:
        card = {
            "id": self.model.name,
            "object": "model",
            "created": 0,
            "owned_by": "evinfra",
            "vocab_size": self.model.vocab_size,
            "max_model_len": self.max_context_tokens,
        }
        return {"object": "list", "data": [card]}

    async def health(self) -> Response:
        c = self.cluster
        nodes = [
            {"node": n.node_id, "role": n.role.value, "alive": n.alive, "serving": n.is_serving}
            for n in c.nodes
        ]
        if self.start_error is not None:
            body = {"status": "failed", "error": self.start_error}
            return JSONResponse(body, status_code=503)
        if not c.is_ready:
            return JSONResponse({"status": "starting"}, status_code=503)
        status = "ready" if all(n.alive for n in c.nodes) else "degraded"
        return JSONResponse({"status": status, "system": c.system, "nodes": nodes})

    async def metrics(self) -> Response:
        text = self.cluster.metrics.render(self.cluster.nodes)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    async def admin_role(self, request: Request) -> Response:
        body = parse_body(RoleBody, await _json(request))
        self._check_ready()
        if not 0 <= body.node < len(self.cluster.nodes):
            raise ApiError(f"no node {body.node}", "node")
        changed = self.cluster.set_role(body.node, Role(body.role))
        return JSONResponse({"node": body.node, "role": body.role, "changed": changed})

    async def admin_nodes(self) -> Response:
        self._check_ready()
        nodes = []
        for n in self.cluster.nodes:
            s = n.stats
            nodes.append(
                {
                    "node": n.node_id,
                    "role": n.role.value,
                    "alive": n.alive,
                    "serving": n.is_serving,
                    "waiting": s.num_waiting_requests,
                    "running": s.num_running_decodes,
                    "used_blocks": s.num_used_blocks,
                    "cached_blocks": len(s.cached_hashes),
                    "steps": s.num_steps,
                    "pid": self.cluster.worker_pids[n.node_id],
                }
            )
        return JSONResponse({"nodes": nodes, "live_requests": self.cluster.num_live_requests})

    async def admin_integrity(self) -> Response:
        self._check_ready()
        reports = await self.cluster.check_integrity()
        body = [
            {
                "node": r.node_id,
                "ok": r.ok,
                "message": r.message,
                "used_blocks": r.num_used_blocks,
                "idle": r.is_idle,
            }
            for r in reports
        ]
        return JSONResponse({"ok": all(r.ok for r in reports), "nodes": body})


class _Meta:
    """The id, timestamps and shapes of one response's JSON."""

    def __init__(self, handle: RequestHandle, model: str, chat: bool, streaming: bool) -> None:
        self.handle = handle
        self.model = model
        self.chat = chat
        self.streaming = streaming
        prefix = "chatcmpl" if chat else "cmpl"
        self.id = f"{prefix}-{handle.request_id}"
        self.created = int(time.time())

    def usage(self, num_completion: int) -> dict[str, Any]:
        h = self.handle
        return usage(
            h.num_prompt_tokens, num_completion, h.num_cached_tokens,
            h.num_transfer_bytes, h.num_pulled_bytes,
        )  # fmt: skip

    def choice(
        self,
        text: str,
        finish: FinishReason | None,
        with_ids: bool,
        token_ids: tuple[int, ...] | list[int],
        role: bool = False,
    ) -> dict[str, Any]:
        out: dict[str, Any] = {"index": 0, "finish_reason": finish.value if finish else None}
        if self.chat:
            key = "delta" if self.streaming else "message"
            content: dict[str, Any] = {"content": text}
            if role or key == "message":
                content["role"] = "assistant"
            out[key] = content
        else:
            out["text"] = text
            out["logprobs"] = None
        if with_ids:
            out["token_ids"] = list(token_ids)
        return out

    def envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        if not self.chat:
            kind = "text_completion"
        else:
            kind = "chat.completion.chunk" if self.streaming else "chat.completion"
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


async def _json(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(f"could not parse the JSON body: {exc}") from None


def create_app(frontend: Frontend, manage_cluster: bool = True) -> FastAPI:
    """The FastAPI app. With `manage_cluster`, app startup starts the cluster in the
    background and app shutdown stops it."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(frontend._start()) if manage_cluster else None
        try:
            yield
        finally:
            if task is not None:
                if not task.done():
                    task.cancel()
                with contextlib.suppress(BaseException):
                    await task
                await frontend.cluster.stop()

    app = FastAPI(title="evinfra", lifespan=lifespan)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        return JSONResponse(exc.body(), status_code=exc.status)

    app.add_api_route("/v1/completions", frontend.completions, methods=["POST"])
    app.add_api_route("/v1/chat/completions", frontend.chat, methods=["POST"])
    app.add_api_route("/v1/models", frontend.models, methods=["GET"])
    app.add_api_route("/health", frontend.health, methods=["GET"])
    app.add_api_route("/metrics", frontend.metrics, methods=["GET"])
    app.add_api_route("/admin/role", frontend.admin_role, methods=["POST"])
    app.add_api_route("/admin/nodes", frontend.admin_nodes, methods=["GET"])
    app.add_api_route("/admin/integrity", frontend.admin_integrity, methods=["GET"])
    return app
