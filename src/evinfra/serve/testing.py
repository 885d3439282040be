"""A server in a subprocess, for tests and benchmarks: started on a free port, waited for
through `/health`, stopped by its PID (SIGTERM, then SIGKILL), every step bounded in time."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from evinfra.serve.cli import free_port

HOST = "127.0.0.1"


class ServerProcess:
    """`python -m evinfra.serve.cli serve ARGS --port P` on 127.0.0.1."""

    def __init__(self, args: Sequence[str], ready_timeout_s: float = 120.0) -> None:
        self.port = free_port(HOST)
        self.args = [*args, "--host", HOST, "--port", str(self.port)]
        self.ready_timeout_s = ready_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        fd, path = tempfile.mkstemp(prefix="evinfra-serve-", suffix=".log")
        self._log = os.fdopen(fd, "wb")
        self._log_path = Path(path)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self._log_path

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def start(self) -> ServerProcess:
        cmd = [sys.executable, "-m", "evinfra.serve.cli", "serve", *self.args]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"server not ready in {self.ready_timeout_s} s:\n{self.log_text()}")

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", timeout=30.0, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", timeout=60.0, **kwargs)

    def worker_pids(self) -> list[int]:
        return [int(n["pid"]) for n in self.get("/admin/nodes").json()["nodes"]]

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM, wait, then SIGKILL; also kills worker processes left behind."""
        if self.proc is None:
            return None
        workers: list[int] = []
        if self.proc.poll() is None:
            try:
                workers = self.worker_pids()
            except (httpx.HTTPError, KeyError, ValueError):
                workers = []
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5.0)
        for pid in workers:
            _kill_if_alive(pid)
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie still answers signal 0: read its state
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _kill_if_alive(pid: int) -> None:
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
