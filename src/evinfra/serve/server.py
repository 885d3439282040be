"""Building and running the server: settings -> cluster -> frontend -> uvicorn.

`run_server` blocks until SIGINT or SIGTERM (uvicorn's handlers), then stops the workers.
`ServerThread` runs the same server in a background thread (the demo and benchmarks).
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

import uvicorn

from evinfra.core.allocation import Allocation
from evinfra.serve.executors import ExecutorSpec, ModelInfo, describe_model, node_cost_model
from evinfra.serve.frontend import Frontend, create_app
from evinfra.serve.runtime import ClusterConfig, LocalCluster

LOCALHOST = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class ServeSettings:
    executor: ExecutorSpec
    num_nodes: int = 2
    system: str | None = None
    system_options: dict[str, object] = field(default_factory=dict)
    host: str = LOCALHOST
    port: int = 8000
    num_blocks: int = 512
    block_size: int = 16
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64
    allocation: Allocation = Allocation.PROMPT
    check_integrity: bool = False
    log_level: str = "warning"


def silent_token_ids(model: ModelInfo) -> frozenset[int]:
    """Ids the timed executor's pseudo-tokens avoid: stop and control tokens, and every id
    that does not print on its own (a reserved token, a byte that is half a character).
    Each streamed token then carries visible text, as a real model's mostly do: a client
    that times the first token by the first text (aiperf, OpenAI's) would otherwise count
    it several steps late."""
    tok = model.tokenizer
    silent = {t for t in range(model.vocab_size) if not _prints(tok.decode([t]))}
    return frozenset(tok.stop_token_ids | {1} | silent)


def _prints(text: str) -> bool:
    return bool(text) and text.isprintable() and "\ufffd" not in text


def build_frontend(settings: ServeSettings) -> Frontend:
    model = describe_model(settings.executor)
    executor = settings.executor
    if executor.kind == "timed":
        executor = replace(executor, avoid_token_ids=silent_token_ids(model))
    config = ClusterConfig(
        executor=executor,
        num_nodes=settings.num_nodes,
        system=settings.system,
        system_options=dict(settings.system_options),
        num_blocks=settings.num_blocks,
        block_size=settings.block_size,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        max_num_seqs=settings.max_num_seqs,
        allocation=settings.allocation,
        check_integrity=settings.check_integrity,
        kv_bytes_per_token=model.kv_bytes_per_token,
        cost_model=node_cost_model(executor, settings.block_size),
    )
    return Frontend(LocalCluster(config), model)


def _uvicorn_config(frontend: Frontend, settings: ServeSettings) -> uvicorn.Config:
    return uvicorn.Config(
        create_app(frontend),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        lifespan="on",
        timeout_graceful_shutdown=5,
    )


def run_server(frontend: Frontend, settings: ServeSettings) -> None:
    """Serve until SIGINT/SIGTERM; the app's shutdown stops the workers."""
    uvicorn.Server(_uvicorn_config(frontend, settings)).run()


class ServerThread:
    """The server on a background thread, for the demo and benchmarks."""

    def __init__(self, frontend: Frontend, settings: ServeSettings) -> None:
        self.frontend = frontend
        self.settings = settings
        self.server = uvicorn.Server(_uvicorn_config(frontend, settings))
        self._thread = threading.Thread(target=self._run, name="evinfra-server", daemon=True)
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.settings.port}"

    def _run(self) -> None:
        try:
            asyncio.run(self.server.serve())
        except BaseException as exc:
            self._error = exc

    def start(self, timeout_s: float = 300.0) -> None:
        """Start serving and wait until the cluster is ready (raises on failure)."""
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.frontend.start_error is not None or self._error is not None:
                raise RuntimeError(f"server failed: {self.frontend.start_error or self._error}")
            if self.server.started and self.frontend.cluster.is_ready:
                return
            if not self._thread.is_alive():
                raise RuntimeError("server thread exited")
            time.sleep(0.05)
        raise TimeoutError(f"server not ready after {timeout_s} s")

    def stop(self, timeout_s: float = 30.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout_s)

    def __enter__(self) -> ServerThread:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
