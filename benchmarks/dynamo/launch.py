"""Start and stop the servers of a side-by-side run: NVIDIA Dynamo (frontend with the KV
router and `mocker` workers, aggregated or prefill/decode disaggregated, file discovery,
TCP request plane) and `evinfra serve` with the timed executor.

Every process is started here in its own session (process group) and stopped here by its
PID: SIGTERM to its group, then SIGKILL after a grace period. Nothing else is signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

HOST = "127.0.0.1"
MOCKER_MODEL_NAME = "mock"
MOCKER_KV_ALLOCATION = "chunk-when-prompt-fits"
"""How the mocker's vLLM scheduler (aisimulate-core 0.13, Dynamo 1.6.1) gives a prefill
its KV, in evinfra's terms (`evinfra.core.allocation`): a waiting request is admitted
only when its whole known sequence fits the blocks no running request holds
(`decide_waiting_admission_with_cost`), then blocks are allocated chunk by chunk
(`schedule_request`: `allocate_native` up to the chunk's end), the newest running request
preempted while short, and nothing admitted in a pass that preempted."""


@dataclass(frozen=True, slots=True)
class EngineShape:
    """One engine (node) as both systems see it: the mocker's flags and evinfra's."""

    block_size: int = 16
    num_blocks: int = 8192
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    speedup_ratio: float = 1.0
    utilisation_source: str = "decode_context"
    """What the decode polynomial's KV utilisation counts on evinfra's side: the decoding
    sequences' contexts, as Dynamo 1.6.1's mocker does (measured: see the docs)."""
    kv_allocation: str = MOCKER_KV_ALLOCATION
    """evinfra's `--kv-allocation` (and its simulation's): by default the mocker's."""

    @property
    def kv_capacity_tokens(self) -> int:
        return self.block_size * self.num_blocks


@dataclass(frozen=True, slots=True)
class Deployment:
    """A server under test. kind: `evinfra`, `dynamo-agg` or `dynamo-disagg`."""

    kind: str
    num_nodes: int = 2
    system: str = "evolving"
    """evinfra only: the policy bundle."""
    system_options: tuple[tuple[str, str], ...] = ()
    """evinfra only: `--system-option KEY=VALUE` pairs (the simulator gets them too)."""

    @property
    def sends_hints(self) -> bool:
        """Dynamo 1.6.1's frontend rejects the `agent` body field (HTTP 400)."""
        return self.kind == "evinfra"

    @property
    def leading_extra_chunk(self) -> bool:
        """evinfra's disaggregated runtime streams an empty chunk at the prefill handoff,
        before the first token; Dynamo's extra chunk (finish_reason alone) trails."""
        return self.kind == "evinfra"

    @property
    def label(self) -> str:
        if self.kind == "evinfra":
            return f"evinfra-{self.system}"
        return self.kind


@dataclass(slots=True)
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path


@dataclass(slots=True)
class RunningServer:
    deployment: Deployment
    url: str
    model: str
    procs: list[Proc] = field(default_factory=list)


def mocker_flags(shape: EngineShape) -> list[str]:
    return [
        "--block-size", str(shape.block_size),
        "--num-gpu-blocks-override", str(shape.num_blocks),
        "--max-num-seqs", str(shape.max_num_seqs),
        "--max-num-batched-tokens", str(shape.max_num_batched_tokens),
        "--speedup-ratio", str(shape.speedup_ratio),
        "--kv-transfer-bandwidth", "0",  # evinfra's timed KV moves through a pipe: no delay
    ]  # fmt: skip


def dynamo_commands(
    dep: Deployment, shape: EngineShape, python: str, model_dir: Path, port: int
) -> list[tuple[str, list[str]]]:
    """(name, argv) of the frontend and the mocker processes."""
    planes = ["--discovery-backend", "file", "--request-plane", "tcp"]
    frontend = [
        python, "-m", "dynamo.frontend", "--http-host", HOST, "--http-port", str(port),
        "--router-mode", "kv", *planes,
    ]  # fmt: skip
    base = [
        python, "-m", "dynamo.mocker", "--model-path", str(model_dir),
        "--model-name", MOCKER_MODEL_NAME, *planes, *mocker_flags(shape),
    ]  # fmt: skip
    if dep.kind == "dynamo-agg":
        return [("frontend", frontend), ("mocker", [*base, "--num-workers", str(dep.num_nodes)])]
    if dep.kind != "dynamo-disagg":
        raise ValueError(f"not a Dynamo deployment: {dep.kind}")
    num_prefill = dep.num_nodes // 2
    num_decode = dep.num_nodes - num_prefill
    return [
        ("frontend", frontend),
        ("prefill", [*base, "--disaggregation-mode", "prefill", "--num-workers", str(num_prefill)]),
        ("decode", [*base, "--disaggregation-mode", "decode", "--num-workers", str(num_decode)]),
    ]


def evinfra_command(dep: Deployment, shape: EngineShape, evinfra: str, port: int) -> list[str]:
    return [
        evinfra, "serve", "--executor", "timed", "--model", "tiny", "--gpu", "h200",
        "--system", dep.system, "--num-nodes", str(dep.num_nodes),
        "--host", HOST, "--port", str(port),
        "--block-size", str(shape.block_size), "--num-blocks", str(shape.num_blocks),
        "--max-num-seqs", str(shape.max_num_seqs),
        "--max-num-batched-tokens", str(shape.max_num_batched_tokens),
        "--cost-model", "dynamo-polynomial",
        "--cost-option", f"speedup_ratio={shape.speedup_ratio}",
        "--cost-option", f"kv_capacity_tokens={shape.kv_capacity_tokens}",
        "--cost-option", f"utilisation_source={shape.utilisation_source}",
        "--kv-allocation", shape.kv_allocation,
        *(a for k, v in dep.system_options for a in ("--system-option", f"{k}={v}")),
    ]  # fmt: skip


def _spawn(name: str, argv: Sequence[str], log_dir: Path, env: dict[str, str]) -> Proc:
    log_path = log_dir / f"{name}.log"
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, start_new_session=True,
        )  # fmt: skip
    return Proc(name, popen, log_path)


def wait_ready(server: RunningServer, timeout_s: float, need_chunks: bool = True) -> None:
    """Poll until the server lists its model and answers a one-token completion."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        for proc in server.procs:
            if proc.popen.poll() is not None:
                tail = proc.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{proc.name} exited ({proc.popen.returncode}):\n{tail}")
        try:
            models = httpx.get(f"{server.url}/v1/models", timeout=2.0).json().get("data", [])
            if any(m.get("id") == server.model for m in models):
                body = {"model": server.model, "prompt": [100, 101, 102], "max_tokens": 2}
                r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=10.0)
                if r.status_code == 200:
                    return
                last = f"HTTP {r.status_code}: {r.text[:200]}"
        except (httpx.HTTPError, ValueError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(0.5)
    raise TimeoutError(f"{server.deployment.label} not ready after {timeout_s} s: {last}")


def start_server(
    dep: Deployment,
    shape: EngineShape,
    *,
    port: int,
    log_dir: Path,
    dynamo_python: str,
    evinfra_bin: str,
    model_dir: Path,
    ready_timeout_s: float = 120.0,
) -> RunningServer:
    log_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    url = f"http://{HOST}:{port}"
    if dep.kind == "evinfra":
        server = RunningServer(dep, url, "timed-tiny")
        server.procs.append(_spawn("evinfra", evinfra_command(dep, shape, evinfra_bin, port),
                                   log_dir, env))  # fmt: skip
    else:
        store = log_dir / "discovery"
        store.mkdir(exist_ok=True)
        env["DYN_FILE_KV"] = str(store)  # file discovery, private to this run
        env["DYN_HTTP_RPC_HOST"] = HOST
        server = RunningServer(dep, url, MOCKER_MODEL_NAME)
        for name, argv in dynamo_commands(dep, shape, dynamo_python, model_dir, port):
            server.procs.append(_spawn(name, argv, log_dir, env))
    try:
        wait_ready(server, ready_timeout_s)
    except BaseException:
        stop_server(server)
        raise
    return server


def stop_server(server: RunningServer, grace_s: float = 10.0) -> None:
    """SIGTERM each started process's group (by its PID), wait, then SIGKILL what is left."""
    for proc in reversed(server.procs):
        if proc.popen.poll() is None:
            _signal_group(proc.popen.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in server.procs:
        try:
            proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(proc.popen.pid, signal.SIGKILL)
            proc.popen.wait(timeout=5.0)
        # children left in the group (evinfra's node workers) once the leader is gone
        _signal_group(proc.popen.pid, signal.SIGKILL)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)  # the group this script created with start_new_session
