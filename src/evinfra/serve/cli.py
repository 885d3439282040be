"""`evinfra serve`, `evinfra replay` and `evinfra demo`.

`python -m evinfra.serve.cli {serve,replay,demo}` runs them without the top-level CLI.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evinfra.core.allocation import ALLOCATIONS, parse_allocation
from evinfra.serve.executors import EXECUTORS, ExecutorSpec

DEMO_URL_HINT = """
The server keeps running at {url}  (Ctrl-C stops it). Try it with any OpenAI client:

  curl {url}/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}]}}'

  from openai import OpenAI
  client = OpenAI(base_url="{url}/v1", api_key="unused")
  client.chat.completions.create(model="{model}", messages=[{{"role": "user", "content": "Hi"}}])
"""


def _kv_pairs(items: Sequence[str] | None, flag: str) -> dict[str, Any]:
    """`key=value` flags; values parse as JSON when they can (numbers, booleans)."""
    out: dict[str, Any] = {}
    for item in items or ():
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"{flag} expects key=value, got {item!r}")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


DEMO_PORT = 8000


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# -- serve --------------------------------------------------------------------------------
def _add_server_flags(p: argparse.ArgumentParser, default_executor: str | None) -> None:
    p.add_argument("--system", help="evolving | dynamo | aggregated | ... (default: evolving)")
    p.add_argument("--system-option", action="append", metavar="KEY=VALUE", default=[])
    p.add_argument("--executor", choices=EXECUTORS, default=default_executor)
    p.add_argument(
        "--model",
        help="torch: tiny | smollm2 (default smollm2); timed: a catalog model (default tiny)",
    )
    p.add_argument("--num-nodes", type=int, default=2)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0: a free port")
    p.add_argument("--num-blocks", type=int, default=512, help="KV blocks per node")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument(
        "--kv-allocation", choices=ALLOCATIONS, default="prompt",
        help="when a prefill gets its KV blocks: prompt (all at admission) | chunk (per"
        " chunk, vLLM) | chunk-when-prompt-fits (per chunk, admitted once the whole prompt"
        " fits: Dynamo's mocker)",
    )  # fmt: skip
    p.add_argument("--threads-per-node", type=int, default=1)
    p.add_argument("--seed", type=int, default=0, help="weights of the tiny model")
    p.add_argument("--cost-model", default="dynamo-polynomial", help="timed executor's clock")
    p.add_argument("--cost-option", action="append", metavar="KEY=VALUE", default=[])
    p.add_argument("--gpu", default="h200", help="timed executor: the GPU the cost model prices")
    p.add_argument("--check-integrity", action="store_true", help="debug: check after each step")
    p.add_argument("--log-level", default="warning")


def add_serve_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("serve", help="serve a model on local node workers (OpenAI API)")
    _add_server_flags(p, default_executor="torch")
    p.add_argument(
        "--runtime", choices=("local", "ray"), default="local",
        help="ray: node actors on a Ray cluster (the evinfra[ray] extra)",
    )  # fmt: skip
    from evinfra.serve.ray_runtime.options import add_ray_flags

    add_ray_flags(p)
    p.set_defaults(handler=run_serve_command)


def serve_settings(args: argparse.Namespace) -> Any:
    from evinfra.serve.server import ServeSettings

    kind = args.executor or "torch"
    model = args.model or ("smollm2" if kind == "torch" else "tiny")
    executor = ExecutorSpec(
        kind=kind,
        model=model,
        seed=args.seed,
        num_threads=args.threads_per_node,
        cost_model=args.cost_model,
        gpu=args.gpu,
        cost_options=tuple(_kv_pairs(args.cost_option, "--cost-option").items()),
    )
    port = free_port(args.host) if args.port == 0 else args.port
    return ServeSettings(
        executor=executor,
        num_nodes=args.num_nodes,
        system=args.system,
        system_options=_kv_pairs(args.system_option, "--system-option"),
        host=args.host,
        port=port,
        num_blocks=args.num_blocks,
        block_size=args.block_size,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        allocation=parse_allocation(args.kv_allocation),
        check_integrity=args.check_integrity,
        log_level=args.log_level,
    )


def run_serve_command(args: argparse.Namespace) -> int:
    from evinfra.serve.server import build_frontend, run_server

    try:
        settings = serve_settings(args)
        if getattr(args, "runtime", "local") == "ray":
            from evinfra.serve.ray_runtime.options import ray_options
            from evinfra.serve.ray_runtime.server import build_ray_frontend

            frontend = build_ray_frontend(settings, ray_options(args))
        else:
            frontend = build_frontend(settings)
    except (ValueError, KeyError, FileNotFoundError, ImportError) as exc:
        print(f"evinfra serve: error: {exc}", file=sys.stderr)
        return 2
    url = f"http://{settings.host}:{settings.port}"
    print(
        f"evinfra serve: {frontend.model.name} on {settings.num_nodes} nodes"
        f" ({frontend.cluster.system}, {settings.executor.kind}) at {url}",
        file=sys.stderr,
        flush=True,
    )
    run_server(frontend, settings)
    return 0


# -- replay -------------------------------------------------------------------------------
def _add_replay_flags(p: argparse.ArgumentParser, with_seed: bool = True) -> None:
    p.add_argument("--workload", default="coding", help="coding | math | computer-use | mixed")
    p.add_argument("--trace", help="a Mooncake / Azure / session JSONL file (open-loop rows)")
    p.add_argument("--rate-scale", type=float, default=1.0, help="trace: divides timestamps")
    p.add_argument("--concurrency", type=int, help="sessions kept running (closed loop)")
    p.add_argument("--session-rate", type=float, help="sessions per second")
    p.add_argument("--num-sessions", type=int)
    p.add_argument("--workload-param", action="append", metavar="KEY=VALUE", default=[])
    p.add_argument("--max-requests", type=int, default=100)
    p.add_argument("--max-duration-s", type=float, default=60.0)
    p.add_argument("--drain-s", type=float, default=60.0, help="wait for in-flight calls")
    p.add_argument("--token-scale", type=float, default=1.0, help="shrink prompts and outputs")
    p.add_argument("--vocab-size", type=int, help="default: the server's, else 32000")
    p.add_argument(
        "--max-context-tokens",
        type=_context_tokens,
        help="cut every call to this many prompt + output tokens (the prompt's head, output"
        " at most a quarter), whatever the server lists; it takes precedence over the"
        " server's max_model_len (default: that, else no limit)",
    )
    p.add_argument("--no-hints", dest="hints", action="store_false")
    if with_seed:
        p.add_argument("--seed", type=int, default=0, help="workload seed")
    p.add_argument("--warmup-s", type=float, default=0.0)
    p.add_argument("--num-gpus", type=int, default=1, help="for tokens/s per GPU")
    p.add_argument("--label", help="the column name in the table (default: the model)")
    p.add_argument("--out", help="directory for summary.json and requests.jsonl")


def _context_tokens(text: str) -> int:
    from evinfra.serve.replay import check_max_context_tokens

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of tokens: {text!r}") from None
    try:
        return check_max_context_tokens(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_replay_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("replay", help="replay agent sessions against an OpenAI-compatible URL")
    p.add_argument("--url", required=True, help="the server's base URL (without /v1)")
    p.add_argument("--model", help="default: the first model the server lists")
    _add_replay_flags(p)
    p.set_defaults(handler=run_replay_command)


def build_workload(args: argparse.Namespace) -> Any:
    from evinfra.workloads.factory import load_trace, make_workload

    if args.trace:
        return load_trace(args.trace, rate_scale=args.rate_scale)
    concurrency = args.concurrency
    if concurrency is None and args.session_rate is None:
        concurrency = 4
    return make_workload(
        args.workload,
        seed=args.seed,
        session_rate_per_s=args.session_rate,
        concurrency=concurrency,
        num_sessions=args.num_sessions,
        hints=args.hints,
        params=_kv_pairs(args.workload_param, "--workload-param"),
    )


def replay(args: argparse.Namespace, url: str, model: str | None) -> int:
    from evinfra.serve.replay import ReplaySettings, run_replay
    from evinfra.sim.cli import format_table

    try:
        workload = build_workload(args)
    except (ValueError, KeyError, OSError) as exc:
        print(f"evinfra replay: error: {exc}", file=sys.stderr)
        return 2
    settings = ReplaySettings(
        url=url.rstrip("/"),
        model=model,
        max_requests=args.max_requests,
        max_duration_s=args.max_duration_s,
        drain_s=args.drain_s,
        hints=args.hints,
        token_scale=args.token_scale,
        max_context_tokens=args.max_context_tokens,
        vocab_size=args.vocab_size,
        seed=args.seed,
        warmup_s=args.warmup_s,
        num_gpus=args.num_gpus,
        label=args.label,
    )
    result = run_replay(settings, workload)
    print(format_table([result.summary]))
    errors = [t.error for t in result.traces if t.error]
    if errors:
        print(f"{len(errors)} request(s) failed; first: {errors[0]}", file=sys.stderr)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(result.summary, indent=2, default=float))
        lines = "".join(json.dumps(t.to_json()) + "\n" for t in result.traces)
        (out / "requests.jsonl").write_text(lines)
        print(f"wrote {out}/summary.json and requests.jsonl", file=sys.stderr)
    return 0


def run_replay_command(args: argparse.Namespace) -> int:
    return replay(args, args.url, args.model)


# -- demo ---------------------------------------------------------------------------------
def add_demo_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "demo", help="start the embedded server, replay a short agent workload, keep serving"
    )
    _add_server_flags(p, default_executor=None)
    _add_replay_flags(p, with_seed=False)  # --seed seeds both the tiny model and the workload
    p.add_argument("--exit-after", type=float, help="stop this many seconds after the replay")
    p.set_defaults(
        handler=run_demo_command, port=0, max_requests=24, max_duration_s=120.0,
        token_scale=0.05, num_sessions=6, concurrency=3,
    )  # fmt: skip


def demo_executor(args: argparse.Namespace) -> str:
    """torch with SmolLM2 when the model and torch are installed, else timed."""
    if args.executor:
        return str(args.executor)
    from importlib.util import find_spec

    if find_spec("torch") is None:
        return "timed"
    from evinfra.serve.engine.factory import smollm2_gguf_path

    return "torch" if smollm2_gguf_path() is not None else "timed"


def run_demo_command(args: argparse.Namespace) -> int:
    from evinfra.serve.server import ServerThread, build_frontend

    args.executor = demo_executor(args)
    if args.port == 0:
        args.port = DEMO_PORT if _port_free(args.host, DEMO_PORT) else free_port(args.host)
    settings = serve_settings(args)
    print(f"starting {settings.num_nodes} nodes ({settings.executor.kind} executor) ...")
    frontend = build_frontend(settings)
    server = ServerThread(frontend, settings)
    try:
        server.start()
        print(f"ready: {frontend.model.name} on {server.url} ({frontend.cluster.system})")
        print("replaying a short agent workload ...", flush=True)
        code = replay(args, server.url, frontend.model.name)
        if code:
            return code
        print(DEMO_URL_HINT.format(url=server.url, model=frontend.model.name), flush=True)
        deadline = None if args.exit_after is None else time.monotonic() + args.exit_after
        while deadline is None or time.monotonic() < deadline:
            time.sleep(0.2)
    except KeyboardInterrupt:
        print("stopping ...", file=sys.stderr)
    finally:
        server.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="evinfra")
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_parser(sub)
    add_replay_parser(sub)
    add_demo_parser(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
