"""Stand-ins for prime-rl's orchestrator and trainer in the end-to-end pods, using what the
operator injects the way prime-rl does (``python -m payloadrun.testing.roles COMMAND``).

- ``trainer``: rendezvous of every rank at ``MASTER_ADDR:MASTER_PORT`` over TCP (rank 0 listens
  and answers the world it saw, as torch.distributed's TCP store does), each rank's rank from
  ``RANK`` (its Indexed Job index) and the world from ``WORLD_SIZE``; then, with
  ``--orchestrator-port``, one connection to the orchestrator by its DNS name
  (``PAYLOADRUN_ORCHESTRATOR_HOST``); then it trains until ``--done-file`` appears (exit 0) or
  ``--fail-file`` does (exit 3, a crashed rank). Each event prints one JSON line.
- ``orchestrator``: answers TCP connections on ``--port`` (prime-rl's ZMQ ports) with its
  hostname, until stopped.
- ``idle``: waits, until stopped (SIGTERM exits it at once, not after the grace period) or, with
  ``--until FILE``, until that file exists (exit 0): an orchestrator or trainer that does nothing.
- ``update-weights DIR``: what prime-rl's orchestrator does on a weight update
  (``prime_rl/utils/client.py``): ``POST /pause?mode=keep&clear_cache=false`` on every replica of
  ``PAYLOADRUN_INFERENCE_ADMIN_URLS`` (``/v1`` stripped, admin routes are at the root), then
  ``POST /update_weights {"weight_dir": DIR}``, then ``POST /resume``; prints each answer.

Standard library and payloadrun.helptext only: the sidecar image runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from payloadrun.helptext import HelpFormatter, plain

FAIL_EXIT = 3


def say(**fields: Any) -> None:
    print(json.dumps(fields, sort_keys=True), flush=True)


def _connect(host: str, port: int, deadline: float) -> socket.socket:
    last: OSError | None = None
    while time.monotonic() < deadline:
        try:
            return socket.create_connection((host, port), timeout=5)
        except OSError as exc:  # DNS not there yet, or the peer not listening yet
            last = exc
            time.sleep(0.5)
    raise TimeoutError(f"could not reach {host}:{port}: {last}")


def _read_line(sock: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.decode().strip()


def rendezvous(rank: int, world: int, master: str, port: int, timeout: float) -> list[int]:
    """Every rank's number, as rank 0 saw them arrive; raises when the world does not fill."""
    deadline = time.monotonic() + timeout
    if rank == 0:
        server = socket.create_server(("0.0.0.0", port), reuse_port=False)
        server.settimeout(timeout)
        peers: list[socket.socket] = []
        ranks = [0]
        try:
            while len(ranks) < world:
                conn, _ = server.accept()
                ranks.append(int(json.loads(_read_line(conn))["rank"]))
                peers.append(conn)
            answer = json.dumps({"world": world, "ranks": sorted(ranks)}).encode() + b"\n"
            for conn in peers:
                conn.sendall(answer)
                conn.close()
        finally:
            server.close()
        return sorted(ranks)
    sock = _connect(master, port, deadline)
    with sock:
        sock.sendall(json.dumps({"rank": rank}).encode() + b"\n")
        sock.settimeout(max(deadline - time.monotonic(), 1))
        answer = json.loads(_read_line(sock))
    if answer["world"] != world:
        raise RuntimeError(f"rank 0 counts a world of {answer['world']}, this rank {world}")
    return list(answer["ranks"])


def trainer(args: argparse.Namespace) -> int:
    env = os.environ
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    master, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    ranks = rendezvous(rank, world, master, port, args.timeout)
    say(event="rendezvous", rank=rank, world=world, ranks=ranks, master=master)
    if args.orchestrator_port:
        host = env["PAYLOADRUN_ORCHESTRATOR_HOST"]
        deadline = time.monotonic() + args.timeout
        with _connect(host, args.orchestrator_port, deadline) as sock:
            say(event="orchestrator", host=host, answer=_read_line(sock), rank=rank)
    while True:
        if args.fail_file and Path(args.fail_file).exists():
            say(event="failing", rank=rank)
            return FAIL_EXIT
        if args.done_file and Path(args.done_file).exists():
            say(event="done", rank=rank)
            return 0
        time.sleep(0.5)


def orchestrator(args: argparse.Namespace) -> int:
    server = socket.create_server(("0.0.0.0", args.port))
    say(event="listening", port=args.port)
    name = socket.gethostname().encode()
    while True:
        conn, _ = server.accept()
        with conn:
            conn.sendall(b"orchestrator " + name + b"\n")


def idle(args: argparse.Namespace) -> int:
    while not (args.until and Path(args.until).exists()):
        time.sleep(0.5)
    return 0


def admin_post(base: str, path: str, body: dict[str, Any] | None = None) -> Any:
    request = urllib.request.Request(
        base.rstrip("/").removesuffix("/v1") + path,
        data=json.dumps(body or {}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.loads(resp.read())


def update_weights(args: argparse.Namespace) -> int:
    urls = os.environ["PAYLOADRUN_INFERENCE_ADMIN_URLS"].split()
    for url in urls:
        say(url=url, pause=admin_post(url, "/pause?mode=keep&clear_cache=false"))
    try:
        for url in urls:
            say(url=url, update=admin_post(url, "/update_weights", {"weight_dir": args.dir}))
    finally:
        for url in urls:
            say(url=url, resume=admin_post(url, "/resume"))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m payloadrun.testing.roles",
        description=plain(__doc__),
        formatter_class=HelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, help="the role to play")
    t = commands.add_parser(
        "trainer",
        help="rendezvous, reach the orchestrator, train",
        description="Rendezvous of every rank at MASTER_ADDR:MASTER_PORT, with "
        "--orchestrator-port one connection to the orchestrator, then wait until --done-file "
        f"(exit 0) or --fail-file (exit {FAIL_EXIT}, a crashed rank) appears.",
        formatter_class=HelpFormatter,
    )
    t.add_argument(
        "--timeout", type=float, default=120.0, help="seconds to rendezvous and to connect"
    )
    t.add_argument(
        "--orchestrator-port",
        type=int,
        help="connect to the orchestrator (PAYLOADRUN_ORCHESTRATOR_HOST) on this port first",
    )
    t.add_argument("--done-file", metavar="FILE", help="exit 0 once this file exists")
    t.add_argument("--fail-file", metavar="FILE", help=f"exit {FAIL_EXIT} once this file exists")
    t.set_defaults(run=trainer)
    o = commands.add_parser(
        "orchestrator",
        help="answer TCP connections with the hostname",
        description="Answer TCP connections on --port with the hostname, until stopped.",
        formatter_class=HelpFormatter,
    )
    o.add_argument("--port", type=int, required=True, help="the port to listen on (every address)")
    o.set_defaults(run=orchestrator)
    i = commands.add_parser(
        "idle",
        help="wait until stopped, or until a file exists",
        description="Wait until stopped (SIGTERM exits at once) or until --until's file exists.",
        formatter_class=HelpFormatter,
    )
    i.add_argument("--until", metavar="FILE", help="exit 0 once this file exists")
    i.set_defaults(run=idle)
    u = commands.add_parser(
        "update-weights",
        help="prime-rl's weight update on every replica",
        description="Pause, update the weights from DIR, resume: on every inference replica of "
        "PAYLOADRUN_INFERENCE_ADMIN_URLS, as prime-rl's orchestrator does.",
        formatter_class=HelpFormatter,
    )
    u.add_argument("dir", help="the weight directory every replica loads")
    u.set_defaults(run=update_weights)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # PID 1 of a container ignores a signal it has no handler for: stop at once when the
    # kubelet asks, instead of after the grace period
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
