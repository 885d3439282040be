"""One run of evinfra and NVIDIA Dynamo side by side on the same workloads, one after the
other, then the simulator's predictions and an aiperf cross-check. Meant to run inside a
private network namespace (`run_side_by_side.sh` does `unshare -n`): every server binds
127.0.0.1 there, and some Dynamo sockets bind 0.0.0.0, which stays private.

    python side_by_side.py --out runs/dynamo-side-by-side [--quick] [--duration-s 20]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import decode_probe  # noqa: E402
from launch import (  # noqa: E402
    Deployment,
    EngineShape,
    RunningServer,
    dynamo_commands,
    evinfra_command,
    start_server,
    stop_server,
)
from matrix import (  # noqa: E402
    AIPERF_TOKENIZER_REPO,
    Limits,
    WorkloadRun,
    aiperf_argv,
    aiperf_env,
    default_deployments,
    default_workloads,
    make_hf_cache,
    replay_argv,
    sim_config,
    with_max_context,
    write_crosscheck_trace,
    write_sim_config,
)
from probe import (  # noqa: E402
    ProbeTrace,
    excess,
    fixed_costs,
    measured_rows,
    probe_deployments,
    probe_sim_config,
    simulated_rows,
    table,
)
from report import (  # noqa: E402
    aiperf_metrics,
    build_results,
    measured_metrics,
    report_text,
)

REPO = HERE.parent.parent
BASE_PORT = 18000


def log(msg: str) -> None:
    print(f"[side-by-side {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_bounded(
    argv: list[str], timeout_s: float, log_path: Path, env: dict[str, str] | None = None
) -> int:
    """Run a client to completion, killed (by its PID's group) past `timeout_s`."""
    with log_path.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env=None if env is None else {**os.environ, **env})  # fmt: skip
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            return -9


def with_agent_blocks(run: WorkloadRun, num_blocks: int) -> WorkloadRun:
    """The closed-loop agent workloads with another KV pool size (the same for the mocker,
    evinfra and the simulator); the trace keeps its own."""
    if run.trace is not None:
        return run
    return replace(run, shape=replace(run.shape, num_blocks=num_blocks))


def with_kv_allocation(run: WorkloadRun, allocation: str) -> WorkloadRun:
    """evinfra's KV allocation (serve and sim) for every workload; Dynamo keeps its own."""
    return replace(run, shape=replace(run.shape, kv_allocation=allocation))


def with_concurrency(run: WorkloadRun, concurrency: int) -> WorkloadRun:
    """The closed-loop agent workloads with another number of sessions kept running."""
    return run if run.trace is not None else replace(run, concurrency=concurrency)


def evinfra_server_stats(url: str) -> dict[str, Any]:
    """What evinfra's frontend counted over the run: role switches ordered, KV bytes moved
    between nodes, and per node the steps run and the executor's busy seconds."""
    import httpx

    try:
        text = httpx.get(f"{url}/metrics", timeout=5.0).text
        nodes = httpx.get(f"{url}/admin/nodes", timeout=5.0).json()["nodes"]
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        return {"server_stats_error": f"{type(exc).__name__}: {exc}"}
    values: dict[str, Any] = {}
    busy: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        if name.endswith("_role_switches_total"):
            values["server_role_switches"] = float(value)
        elif name.endswith("_kv_transfer_bytes_total"):
            values["server_kv_transfer_bytes"] = float(value)
        elif name.endswith("_kv_prefix_pulls_total"):
            values["server_prefix_pulls"] = float(value)
        elif name.endswith("_kv_score_messages_total"):
            values["server_kv_score_messages"] = float(value)
        elif name.endswith("_kv_scored_hashes_total"):
            values["server_kv_scored_hashes"] = float(value)
        elif "_node_busy_seconds{" in name:
            busy[name.split('node="')[1].split('"')[0]] = float(value)
    values["server_node_steps"] = [n.get("steps") for n in nodes]
    values["server_node_busy_s"] = [busy.get(str(n.get("node"))) for n in nodes]
    return values


def sim_argv(evinfra_bin: str, run: WorkloadRun, cfg_path: Path, out: Path) -> list[str]:
    """`evinfra sim` on the run's config, or `sim_cut.py` when the replays cut every call
    to a context limit: the simulator is given the calls the servers were sent."""
    if run.max_context_tokens is None:
        return [evinfra_bin, "sim", "--config", str(cfg_path), "--quiet", "--out", str(out)]
    return [sys.executable, str(HERE / "sim_cut.py"), "--config", str(cfg_path),
            "--max-context-tokens", str(run.max_context_tokens), "--out", str(out)]  # fmt: skip


def context_note(runs: list[WorkloadRun]) -> str:
    """The report's line on the context limit the calls were cut to."""
    cut = ", ".join(f"{r.name} {r.max_context_tokens:,}" for r in runs if r.max_context_tokens)
    if not cut:
        return "Calls cut to each server's own listed max_model_len (evinfra: its KV)."
    return f"Every system's calls (and the simulator's) cut to at most: {cut} tokens."


def git_head() -> str:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


def num_tiny_device_blocks(block_size: int) -> int:
    from evinfra.sim.config import load_config
    from evinfra.sim.runner import build_node_spec

    node = {"model": "tiny", "gpu": "h200", "num_gpus": 1, "gpus_per_node": 1}
    cfg = load_config(None, {**node, "block_size": block_size})
    return build_node_spec(cfg).num_device_blocks


def workload_runs(args: argparse.Namespace) -> list[WorkloadRun]:
    """The workloads the run measures and simulates, with the script's flags applied; the
    context limit last, since `kv` reads each run's final KV pool."""
    runs = default_workloads(Path(args.shared_dir), quick=args.quick)
    if args.agent_num_blocks is not None:
        runs = [with_agent_blocks(r, args.agent_num_blocks) for r in runs]
    if args.workloads:
        runs = [r for r in runs if r.name in args.workloads.split(",")]
    if args.agent_concurrency is not None:
        runs = [with_concurrency(r, args.agent_concurrency) for r in runs]
    if args.kv_allocation is not None:
        runs = [with_kv_allocation(r, args.kv_allocation) for r in runs]
    if args.workload_param:
        params = tuple(tuple(p.split("=", 1)) for p in args.workload_param)
        runs = [r if r.trace is not None else replace(r, params=params) for r in runs]
    return [with_max_context(r, args.max_context_tokens) for r in runs]


class SideBySide:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out).resolve()
        self.limits = Limits(args.duration_s, args.drain_s, args.seed)
        bin_dir = Path(sys.executable).parent
        self.evinfra = str(bin_dir / "evinfra")
        self.dynamo_python = str(Path(args.dynamo_venv) / "bin" / "python")
        self.aiperf = str(Path(args.dynamo_venv) / "bin" / "aiperf")
        self.model_dir = Path(args.model_dir).resolve()
        self.port = BASE_PORT
        self.measured: dict[str, dict[str, dict[str, Any]]] = {}
        self.simulated: dict[str, dict[str, dict[str, Any]]] = {}
        self.commands: list[str] = []
        self.failures: list[str] = []

    def _start(self, dep: Deployment, run: WorkloadRun, tag: str) -> RunningServer:
        self.port += 1
        log_dir = self.out / "logs" / f"{tag}-{dep.label}"
        if dep.kind == "evinfra":
            argvs = [evinfra_command(dep, run.shape, self.evinfra, self.port)]
        else:
            argvs = [a for _, a in dynamo_commands(dep, run.shape, self.dynamo_python,
                                                   self.model_dir, self.port)]  # fmt: skip
        self.commands.extend(" ".join(a) for a in argvs)
        return start_server(
            dep, run.shape, port=self.port, log_dir=log_dir, dynamo_python=self.dynamo_python,
            evinfra_bin=self.evinfra, model_dir=self.model_dir,
        )  # fmt: skip

    def measure(self, run: WorkloadRun, dep: Deployment) -> None:
        log(f"{run.name}: starting {dep.label}")
        server = self._start(dep, run, run.name)
        try:
            out = self.out / "measured" / run.name / dep.label
            argv = replay_argv(self.evinfra, server.url, server.model, run, self.limits,
                               dep.label, out, hints=dep.sends_hints)  # fmt: skip
            self.commands.append(" ".join(argv))
            log(f"{run.name}: replaying against {dep.label}")
            budget = self.limits.duration_s + self.limits.drain_s + 60
            rc = run_bounded(argv, budget, self.out / "logs" / f"replay-{run.name}-{dep.label}.log")
            if rc != 0 or not (out / "summary.json").is_file():
                raise RuntimeError(f"replay of {run.name} on {dep.label} failed (rc {rc})")
            metrics = measured_metrics(out, dep.leading_extra_chunk, self.limits.duration_s)
            if dep.kind == "evinfra":
                metrics.update(evinfra_server_stats(server.url))
            self.measured.setdefault(run.name, {})[dep.label] = metrics
        finally:
            stop_server(server)
            log(f"{run.name}: stopped {dep.label}")

    def simulate(self, run: WorkloadRun, dep: Deployment) -> None:
        """`evinfra sim` on the config that matches the measured run."""
        cfg = sim_config(dep, run, self.limits, num_tiny_device_blocks(run.shape.block_size))
        cfg_path = self.out / "sim" / run.name / f"{dep.label}.yaml"
        write_sim_config(cfg_path, cfg)
        out = self.out / "sim" / run.name / dep.label
        argv = sim_argv(self.evinfra, run, cfg_path, out)
        self.commands.append(" ".join(argv))
        if run_bounded(argv, 300, self.out / "logs" / f"sim-{run.name}-{dep.label}.log") == 0:
            summary = json.loads((out / "summary.json").read_text())
            self.simulated.setdefault(run.name, {})[dep.label] = summary

    def crosscheck(self) -> dict[str, dict[str, dict[str, Any]]]:
        """The same small trace through `evinfra replay` and `aiperf` against evinfra and
        aggregated Dynamo."""
        trace = self.out / "crosscheck" / "trace.jsonl"
        write_crosscheck_trace(trace)
        run = WorkloadRun("crosscheck", trace=trace, max_requests=100)
        limits = Limits(duration_s=30.0, drain_s=20.0, seed=self.limits.seed)
        rows: dict[str, dict[str, dict[str, Any]]] = {}
        for dep in (Deployment("evinfra"), Deployment("dynamo-agg")):
            by_client: dict[str, dict[str, Any]] = {}
            for client in ("evinfra replay", "aiperf"):
                server = self._start(dep, run, f"crosscheck-{client.split()[-1]}")
                try:
                    by_client[client] = self._crosscheck_one(client, server, run, limits, trace)
                finally:
                    stop_server(server)
            rows[dep.label] = by_client
        return rows

    def _crosscheck_one(self, client: str, server: RunningServer, run: WorkloadRun,
                        limits: Limits, trace: Path) -> dict[str, Any]:  # fmt: skip
        label = server.deployment.label
        if client == "aiperf":
            out = self.out / "crosscheck" / "aiperf" / label
            hf_home = self.out / "crosscheck" / "hf_home"
            make_hf_cache(hf_home, self.model_dir)
            argv = aiperf_argv(self.aiperf, server.url, server.model, trace,
                               AIPERF_TOKENIZER_REPO, out)  # fmt: skip
            env = aiperf_env(hf_home)
            self.commands.append(" ".join([*(f"{k}={v}" for k, v in env.items()), *argv]))
            log(f"crosscheck: aiperf against {label}")
            env_log = self.out / "logs" / f"aiperf-{label}.log"
            rc = run_bounded(argv, 180, env_log, env)
            metrics = aiperf_metrics(out)
            if rc != 0 and "error" not in metrics:
                metrics["note"] = f"aiperf exited {rc}"
            if rc != 0 and "error" in metrics:
                tail = env_log.read_text(errors="replace").strip().splitlines()[-3:]
                metrics["error"] = f"aiperf exited {rc}: {' / '.join(tail)[:300]}"
            return metrics
        out = self.out / "crosscheck" / "replay" / label
        argv = replay_argv(
            self.evinfra,
            server.url,
            server.model,
            run,
            limits,
            label,
            out,
            hints=server.deployment.sends_hints,
        )
        self.commands.append(" ".join(argv))
        log(f"crosscheck: evinfra replay against {label}")
        rc = run_bounded(argv, 120, self.out / "logs" / f"crosscheck-replay-{label}.log")
        if rc != 0:
            return {"error": f"replay exited {rc}"}
        return measured_metrics(out, leading_extra=server.deployment.leading_extra_chunk)

    def _replay_alone(
        self, dep: Deployment, run: WorkloadRun, limits: Limits, tag: str, timeout_s: float
    ) -> Path | None:
        """Start `dep`, replay `run` against it into OUT/<tag>/<label>, stop it; the
        replay's folder, or None (and a failure recorded) when the replay failed."""
        server = self._start(dep, run, tag)
        try:
            out = self.out / tag / dep.label
            argv = replay_argv(self.evinfra, server.url, server.model, run, limits,
                               dep.label, out, hints=dep.sends_hints)  # fmt: skip
            self.commands.append(" ".join(argv))
            log(f"{tag}: replaying against {dep.label}")
            rc = run_bounded(argv, timeout_s, self.out / "logs" / f"{tag}-{dep.label}.log")
        finally:
            stop_server(server)
        if rc != 0:
            self.failures.append(f"{tag} on {dep.label}: replay exited {rc}")
            return None
        return out

    def probe(self) -> int:
        """The fixed per-request costs at zero load (`probe.py`): writes probe.json."""
        self.out.mkdir(parents=True, exist_ok=True)
        trace = ProbeTrace()
        path = self.out / "probe" / "trace.jsonl"
        trace.write(path)
        agent_shape = default_workloads(Path(self.args.shared_dir))[0].shape
        run = WorkloadRun("probe", trace=path, shape=agent_shape, max_requests=100)
        limits = Limits(duration_s=trace.duration_s, drain_s=10.0, seed=self.limits.seed)
        num_blocks = num_tiny_device_blocks(run.shape.block_size)
        results: dict[str, dict[str, Any]] = {}
        for dep in probe_deployments(self.args.num_nodes):
            out = self._replay_alone(dep, run, limits, "probe", timeout_s=120)
            if out is None:
                continue
            cfg = probe_sim_config(dep, run, limits, num_blocks)
            measured = measured_rows(out, dep.leading_extra_chunk)
            results[dep.label] = excess(measured, simulated_rows(cfg), trace.burst_size)
        costs = fixed_costs(results)
        payload = {"results": results, "fixed_costs": costs, "commit": git_head(),
                   "trace": asdict(trace), "failures": self.failures,
                   "commands": self.commands}  # fmt: skip
        (self.out / "probe.json").write_text(json.dumps(payload, indent=2))
        print(table(results))
        print(json.dumps(costs, indent=2))
        return 0 if not self.failures else 1

    def run_decode_probe(self) -> int:
        """What the mocker's decode polynomial counts as active KV (`decode_probe.py`):
        one engine each, dynamo-agg and evinfra; writes decode_probe.json."""
        self.out.mkdir(parents=True, exist_ok=True)
        trace = decode_probe.DecodeProbeTrace()
        path = self.out / "decode-probe" / "trace.jsonl"
        trace.write(path)
        shape = EngineShape(num_blocks=self.args.agent_num_blocks or 2048)
        run = WorkloadRun("decode-probe", trace=path, shape=shape, max_requests=100)
        limits = Limits(duration_s=trace.duration_s, drain_s=15.0, seed=self.limits.seed)
        measured: dict[str, list[float | None]] = {}
        budget_s = limits.duration_s + limits.drain_s + 60
        for dep in (Deployment("dynamo-agg", num_nodes=1), Deployment("evinfra", num_nodes=1)):
            out = self._replay_alone(dep, run, limits, "decode-probe", timeout_s=budget_s)
            if out is not None:
                gaps = decode_probe.measured_gaps_ms(out, trace, dep.leading_extra_chunk)
                measured[dep.label] = gaps
        rows = decode_probe.results(trace, shape.kv_capacity_tokens, measured)
        payload = {"cases": rows, "kv_capacity_tokens": shape.kv_capacity_tokens,
                   "commit": git_head(), "trace": asdict(trace), "failures": self.failures,
                   "commands": self.commands}  # fmt: skip
        (self.out / "decode_probe.json").write_text(json.dumps(payload, indent=2))
        print(decode_probe.table(rows))
        return 0 if not self.failures else 1

    def main(self) -> int:
        if self.args.probe:
            return self.probe()
        if self.args.decode_probe:
            return self.run_decode_probe()
        self.out.mkdir(parents=True, exist_ok=True)
        runs = workload_runs(self.args)
        systems = tuple(self.args.evinfra_systems.split(","))
        deps = default_deployments(self.args.num_nodes, systems)
        if self.args.evinfra_option:
            opts = tuple(tuple(o.split("=", 1)) for o in self.args.evinfra_option)
            deps = [replace(d, system_options=opts) if d.kind == "evinfra" else d for d in deps]
        if self.args.deployments:
            deps = [d for d in deps if d.label in self.args.deployments.split(",")]
        started = time.monotonic()
        commit = git_head()
        for run in runs:
            for dep in deps:
                try:
                    self.measure(run, dep)
                except (RuntimeError, TimeoutError) as exc:
                    self.failures.append(f"{run.name} on {dep.label}: {exc}")
                    log(f"FAILED: {self.failures[-1]}")
        for run in runs:
            for dep in deps:
                if dep.label in self.measured.get(run.name, {}):
                    self.simulate(run, dep)
        results = build_results(self.measured, self.simulated)
        crosscheck = {} if self.args.no_aiperf else self.crosscheck()
        wall_s = time.monotonic() - started
        commit_end = git_head()
        payload = {
            "results": results, "crosscheck": crosscheck, "wall_s": wall_s,
            "limits": asdict(self.limits), "failures": self.failures,
            "commit": commit, "commit_at_end": commit_end,
            "workloads": {r.name: {"shape": asdict(r.shape), "concurrency": r.concurrency,
                                   "trace": str(r.trace) if r.trace else None,
                                   "max_context_tokens": r.max_context_tokens} for r in runs},
            "commands": self.commands,
        }  # fmt: skip
        (self.out / "results.json").write_text(json.dumps(payload, indent=2, default=float))
        header = (
            "# evinfra and NVIDIA Dynamo 1.6.1 side by side\n\n"
            f"One run, {wall_s:.0f} s wall, {self.args.num_nodes} nodes each; "
            f"{self.limits.duration_s:.0f} s of load per run, {self.limits.drain_s:.0f} s drain;"
            f" evinfra at {commit}"
            + ("" if commit_end == commit else f" (HEAD moved to {commit_end} during the run)")
            + ". "
            + context_note(runs)
        )
        text = report_text(results, header, self.failures, crosscheck)
        (self.out / "report.md").write_text(text)
        print(text)
        log(f"wrote {self.out}/report.md and results.json ({wall_s:.0f} s)")
        return 0


def context_limit(text: str) -> str:
    """`kv`, `server` or a whole number of tokens (at least 2), else a usage error."""
    from evinfra.serve.replay import check_max_context_tokens

    if text in ("kv", "server"):
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"`kv`, `server` or a number of tokens, not {text!r}"
        ) from None
    try:
        check_max_context_tokens(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(REPO / "runs" / "dynamo-side-by-side"))
    p.add_argument("--duration-s", type=float, default=20.0, help="load per run")
    p.add_argument("--drain-s", type=float, default=20.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="coding only, small (the test)")
    p.add_argument("--workloads", help="comma-separated subset: coding,mixed,mooncake")
    p.add_argument("--no-aiperf", action="store_true")
    p.add_argument("--probe", action="store_true", help="only the zero-load fixed-cost probe")
    p.add_argument(
        "--decode-probe",
        action="store_true",
        help="only the probe of what the mocker's decode time counts as active KV"
        " (one engine of --agent-num-blocks, default 2048)",
    )
    p.add_argument("--num-nodes", type=int, default=2, help="nodes per deployment")
    p.add_argument(
        "--evinfra-option",
        action="append",
        metavar="KEY=VALUE",
        help="a system option for evinfra (serve and sim), repeatable",
    )
    p.add_argument(
        "--agent-num-blocks",
        type=int,
        help="KV blocks per node for coding and mixed, both systems (default 4096)",
    )
    p.add_argument(
        "--agent-concurrency", type=int, help="sessions kept running, coding and mixed (12)"
    )
    p.add_argument(
        "--kv-allocation",
        choices=("prompt", "chunk", "chunk-when-prompt-fits"),
        help="evinfra's KV allocation, served and simulated (default: the mocker's,"
        " chunk-when-prompt-fits)",
    )
    p.add_argument(
        "--workload-param",
        action="append",
        metavar="KEY=VALUE",
        help="a generator parameter for coding and mixed (replay and sim), repeatable",
    )
    p.add_argument(
        "--max-context-tokens",
        type=context_limit,
        default="kv",
        help="the limit every replay (every system's) and the simulator cut each call to:"
        " `kv` (default: a node's KV in tokens, num_blocks x block_size), `server` (each"
        " server's own listed max_model_len: evinfra lists its KV and cuts, Dynamo lists"
        " none and rejects what does not fit), or a number of tokens",
    )
    p.add_argument(
        "--evinfra-systems",
        default="evolving",
        help="evinfra bundles to run, each its own deployment (e.g. evolving,evolving-lru)",
    )
    p.add_argument("--deployments", help="subset: evinfra-evolving,dynamo-agg,dynamo-disagg")
    p.add_argument("--dynamo-venv", default=str(HERE / ".venv"))
    p.add_argument("--model-dir", default=str(HERE / "model"))
    p.add_argument("--shared-dir", default=str(REPO.parent / "shared"))
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(SideBySide(parse_args()).main())
