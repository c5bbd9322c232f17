"""NCCL's bootstrap, as prime-rl's NCCL weight broadcast makes it, over plain sockets.

prime-rl's ``weight_broadcast.type = "nccl"`` puts trainer rank 0 and every inference worker in
one group: rank 0 hosts the rendezvous store (vLLM's ``StatelessProcessGroup``, torch's TCPStore,
on port 29501) and the workers join it as ranks 1 and up. NCCL's bootstrap then connects on ports
the kernel picks: rank 0 publishes its root listener's address through the store; every rank
opens two listeners of its own and sends their addresses to the root; the root connects back to
each rank with the address of the next rank's ring listener; each rank connects to that ring
listener, and the ring carries an all-gather. So inference pods connect to each other, to the
trainer and back. The images have no torch: a small JSON-lines key/value store stands for the
TCPStore, and the ranks exchange addresses through it as NCCL does.

- ``rank --rank R --world N --store-host HOST``: one rank (rank 0 also serves the store and the
  root). Each step prints a JSON line; ``{"event": "complete", ...}`` names every address the
  group used (rank 0's line: all ranks'). Then every listener stays open, each with a UDP echo
  socket beside it, until SIGTERM, so a test can try them from elsewhere; a step that fails
  prints ``{"event": "failed", "step": ...}`` and the rank waits the same way.
  ``--rank-from-hostname K``: the rank is K plus the number that ends the hostname (a
  StatefulSet pod's ordinal). ``--after FILE``: start once FILE exists (rank 0 serves the store
  at once), so a test starts the group when the policies are in place; the deadline
  (``--timeout``) counts from then.
- ``reach TARGETS``: one attempt per target ``[name, proto, host, port]`` (a JSON list), proto
  ``tcp`` (``connected`` or the error's name) or ``udp`` (``echoed`` when the echo comes back,
  else the error's name or ``timeout``), all at once; prints ``{name: outcome}``.

Standard library only: the sidecar image runs it.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

STORE_PORT = 29501  # prime-rl's NCCL weight broadcast's rendezvous port
ROOT_KEY = "bootstrap/root"
UDP_TIMEOUT = 2.0


def say(**fields: Any) -> None:
    print(json.dumps(fields, sort_keys=True), flush=True)


class StepFailed(Exception):
    """A step of the bootstrap did not complete: ``step`` names it."""

    def __init__(self, step: str, error: str) -> None:
        super().__init__(f"{step}: {error}")
        self.step = step
        self.error = error


# --- JSON lines ---------------------------------------------------------------------------


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(json.dumps(message).encode() + b"\n")


class Lines:
    """JSON messages read one line at a time from a socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def read(self) -> dict[str, Any]:
        while b"\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the peer closed the connection")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return json.loads(line)


def remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("deadline passed")
    return left


def connect(address: str, deadline: float) -> tuple[socket.socket, int]:
    """A connection to ``host:port``, retried (as TCPStore and NCCL retry) until ``deadline``;
    and how many attempts it took."""
    host, _, port = address.rpartition(":")
    attempts = 0
    while True:
        attempts += 1
        try:
            sock = socket.create_connection((host, int(port)), timeout=min(5, remaining(deadline)))
            sock.settimeout(remaining(deadline))
            return sock, attempts
        except OSError as exc:  # refused, unreachable, not resolvable yet
            if time.monotonic() + 0.5 >= deadline:
                raise TimeoutError(f"{address}: {attempts} attempts, the last: {exc!r}") from None
            time.sleep(0.5)


def accept(listener: socket.socket, deadline: float) -> tuple[socket.socket, str]:
    listener.settimeout(remaining(deadline))
    conn, (host, _port) = listener.accept()
    conn.settimeout(remaining(deadline))
    return conn, host


def listen(bind: str, port: int = 0) -> socket.socket:
    """A TCP listener on ``bind``'s ``port`` (0: one the kernel picks)."""
    return socket.create_server((bind, port))


def port_of(sock: socket.socket) -> int:
    return sock.getsockname()[1]


# --- the store (torch's TCPStore, in short) -----------------------------------------------


class Store:
    """Rank 0's key/value store: ``set`` and a blocking ``get``, one JSON line each way."""

    def __init__(self, bind: str, port: int) -> None:
        self.server = listen(bind, port)
        self.data: dict[str, Any] = {}
        self.changed = threading.Condition()
        self.clients: set[str] = set()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            conn, (host, _port) = self.server.accept()
            with self.changed:
                self.clients.add(host)
            threading.Thread(target=self._client, args=(conn,), daemon=True).start()

    def _client(self, conn: socket.socket) -> None:
        lines = Lines(conn)
        with conn:
            try:
                while True:
                    request = lines.read()
                    key = request["key"]
                    if request["op"] == "set":
                        with self.changed:
                            self.data[key] = request["value"]
                            self.changed.notify_all()
                        send(conn, {"ok": True})
                    else:  # get: waits for the key, as TCPStore's does
                        send(conn, self._get(key, request["timeout"]))
            except (ConnectionError, OSError, ValueError):
                return

    def _get(self, key: str, timeout: float) -> dict[str, Any]:
        with self.changed:
            found = self.changed.wait_for(lambda: key in self.data, timeout)
            return {"ok": found, "value": self.data.get(key)}


class StoreClient:
    def __init__(self, address: str, deadline: float) -> None:
        self.sock, self.attempts = connect(address, deadline)
        self.lines = Lines(self.sock)
        self.deadline = deadline

    def set(self, key: str, value: Any) -> None:
        send(self.sock, {"op": "set", "key": key, "value": value})
        self.lines.read()

    def get(self, key: str) -> Any:
        send(self.sock, {"op": "get", "key": key, "timeout": remaining(self.deadline)})
        answer = self.lines.read()
        if not answer["ok"]:
            raise TimeoutError(f"the store has no {key!r}")
        return answer["value"]


# --- the bootstrap ------------------------------------------------------------------------


def serve_root(root: socket.socket, world: int, deadline: float, report: dict[str, Any]) -> None:
    """NCCL's bootstrap root: every rank sends its listeners' addresses; then the root connects
    back to each rank's root listener with the address of the next rank's ring listener."""
    try:
        hellos: dict[int, dict[str, Any]] = {}
        while len(hellos) < world:
            conn, host = accept(root, deadline)
            with conn:
                hello = Lines(conn).read()
            hellos[hello["rank"]] = {**hello, "from": host}
        report["hellos"] = [hellos[r] for r in sorted(hellos)]
        report["connected_back"] = []
        for rank in range(world):
            following = hellos[(rank + 1) % world]
            sock, _ = connect(hellos[rank]["root_listener"], deadline)
            with sock:
                send(sock, {"next_rank": following["rank"], "next": following["ring_listener"]})
            report["connected_back"].append(hellos[rank]["root_listener"])
    except (OSError, ValueError, KeyError) as exc:
        report["error"] = repr(exc)


class Rank:
    """One rank's bootstrap, step by step (:meth:`run`); ``done`` records every address used."""

    def __init__(self, args: argparse.Namespace, rank: int, host: str, store: Store | None):
        self.rank, self.world, self.host, self.store_server = rank, args.world, host, store
        self.deadline = time.monotonic() + args.timeout
        self.store_address = f"{args.store_host}:{args.store_port}"
        self.done: dict[str, Any] = {
            "rank": rank,
            "world": self.world,
            "host": host,
            "store": self.store_address,
        }
        self.root_report: dict[str, Any] = {}
        self.bind = args.bind
        self.root_listener, self.ring_listener = listen(self.bind), listen(self.bind)
        self.mine = {
            "rank": rank,
            "root_listener": f"{host}:{port_of(self.root_listener)}",
            "ring_listener": f"{host}:{port_of(self.ring_listener)}",
        }

    def step(self, name: str, action: Any) -> Any:
        try:
            return action()
        except (OSError, ValueError, KeyError) as exc:
            raise StepFailed(name, repr(exc)) from None

    def run(self) -> dict[str, Any]:
        listeners = [self.root_listener, self.ring_listener]
        root_thread = None
        if self.rank == 0:
            root = listen(self.bind)
            listeners.append(root)
            self.done["root"] = f"{self.host}:{port_of(root)}"
            root_thread = threading.Thread(
                target=serve_root,
                args=(root, self.world, self.deadline, self.root_report),
                daemon=True,
            )
            root_thread.start()
        store = self.join_store()
        root_address = self.step("read the root's address", lambda: store.get(ROOT_KEY))
        self.done |= {k: v for k, v in self.mine.items() if k != "rank"}
        self.done["root_attempts"] = self.step("reach the root", lambda: self.hello(root_address))
        say(event="reached the root", rank=self.rank, root=root_address)
        told = self.step("the root connects back", self.from_root)
        self.done |= {"next_rank": told["next_rank"], "next": told["next"]}
        say(event="the root connected back", rank=self.rank, **told)
        self.ring(told["next"])
        if root_thread is not None:
            root_thread.join(remaining(self.deadline))
            if "error" in self.root_report or "connected_back" not in self.root_report:
                error = self.root_report.get("error", "not finished")
                raise StepFailed("the root connects back to every rank", error)
            self.done["root_connected_back"] = self.root_report["connected_back"]
        self.done["udp"] = keep_open(listeners, self.bind)
        self.step("report", lambda: store.set(f"bootstrap/done/{self.rank}", self.done))
        if self.rank == 0:
            self.done["ranks"] = [
                self.step("every rank reports", lambda r=r: store.get(f"bootstrap/done/{r}"))
                for r in range(self.world)
            ]
            assert self.store_server is not None
            self.done["store_clients"] = sorted(self.store_server.clients)
        return self.done

    def join_store(self) -> StoreClient:
        store = self.step("join the store", lambda: StoreClient(self.store_address, self.deadline))
        self.done["store_attempts"] = store.attempts
        say(event="joined the store", rank=self.rank, attempts=store.attempts)
        if self.rank == 0:
            self.step("publish the root", lambda: store.set(ROOT_KEY, self.done["root"]))
        return store

    def hello(self, root_address: str) -> int:
        """Send this rank's listeners to the root; how many attempts it took."""
        sock, attempts = connect(root_address, self.deadline)
        with sock:
            send(sock, self.mine)
        return attempts

    def from_root(self) -> dict[str, Any]:
        conn, peer = accept(self.root_listener, self.deadline)
        with conn:
            return {**Lines(conn).read(), "root_from": peer}

    def ring(self, following: str) -> None:
        """Connect to the next rank, take the previous one's connection, all-gather around."""
        outgoing, attempts = self.step(
            "reach the next rank", lambda: connect(following, self.deadline)
        )
        self.done["ring_attempts"] = attempts
        send(outgoing, {"rank": self.rank})
        incoming, prev_from = self.step(
            "the previous rank connects", lambda: accept(self.ring_listener, self.deadline)
        )
        lines = Lines(incoming)
        prev = self.step("the previous rank connects", lines.read)["rank"]
        if prev != (self.rank - 1) % self.world:
            expected = (self.rank - 1) % self.world
            raise StepFailed("the previous rank connects", f"rank {prev} came, not {expected}")
        self.done |= {"prev_rank": prev, "prev_from": prev_from}
        say(event="ring", rank=self.rank, next=following, prev=prev, prev_from=prev_from)
        # the all-gather NCCL's bootstrap runs over the ring: every rank's listeners, everywhere
        known = {str(self.rank): self.mine}
        for _ in range(self.world - 1):
            send(outgoing, known)
            known |= self.step("all-gather over the ring", lines.read)
        if sorted(map(int, known)) != list(range(self.world)):
            raise StepFailed("all-gather over the ring", f"gathered ranks {sorted(known)}")
        self.done["gathered"] = len(known)
        outgoing.close()
        incoming.close()


def keep_open(listeners: list[socket.socket], bind: str, drain: bool = True) -> dict[str, int]:
    """Keep accepting on ``listeners`` (each connection closed at once; ``drain`` False: their
    own thread accepts) and echo UDP beside each, on the same port number where free, else one
    the kernel picks: the addresses a test tries after the bootstrap. Returns the UDP port of
    each TCP port."""
    udp_ports: dict[str, int] = {}
    for listener in listeners:
        if drain:
            listener.settimeout(None)
            threading.Thread(target=_drain, args=(listener,), daemon=True).start()
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            udp.bind((bind, port_of(listener)))
        except OSError:
            udp.bind((bind, 0))
        udp_ports[str(port_of(listener))] = port_of(udp)
        threading.Thread(target=_echo, args=(udp,), daemon=True).start()
    return udp_ports


def _drain(listener: socket.socket) -> None:
    while True:
        conn, _ = listener.accept()
        conn.close()


def _echo(udp: socket.socket) -> None:
    while True:
        data, peer = udp.recvfrom(2048)
        udp.sendto(data, peer)


def rank_of(args: argparse.Namespace) -> int:
    if args.rank is not None:
        return args.rank
    name = socket.gethostname()
    try:
        return args.rank_from_hostname + int(name.rsplit("-", 1)[-1])
    except ValueError:
        raise SystemExit(
            f"--rank-from-hostname: hostname {name!r} does not end in -<number>"
        ) from None


def wait_for_file(path: str) -> bool:
    """Wait until ``path`` exists (True), or until SIGTERM or SIGINT comes (False)."""
    say(event="waiting", file=path)
    while not os.path.exists(path):
        if signal.sigtimedwait({signal.SIGTERM, signal.SIGINT}, 0.2) is not None:
            return False
    return True


def rank_command(args: argparse.Namespace) -> int:
    rank = rank_of(args)
    # the pod's address (the kubelet's /etc/hosts maps the hostname to it)
    host = args.advertise or socket.gethostbyname(socket.gethostname())
    store = None
    if rank == 0:
        store = Store(args.bind, args.store_port)
        udp = keep_open([store.server], args.bind, drain=False)
        say(event="serving the store", port=args.store_port, udp=udp)
    if args.after and not wait_for_file(args.after):
        return 0  # stopped while waiting
    try:
        done = Rank(args, rank, host, store).run()
        say(event="complete", **done)
    except StepFailed as exc:
        say(event="failed", rank=rank, step=exc.step, error=exc.error)
    except TimeoutError as exc:
        say(event="failed", rank=rank, step="timeout", error=repr(exc))
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    return 0


# --- reach --------------------------------------------------------------------------------


def try_tcp(host: str, port: int) -> str:
    try:
        socket.create_connection((host, port), timeout=3).close()
        return "connected"
    except OSError as error:
        return _named(error)


def try_udp(host: str, port: int) -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(UDP_TIMEOUT)
        try:
            sock.connect((host, port))
            sock.send(b"ping")
            return "echoed" if sock.recv(2048) == b"ping" else "garbled"
        except TimeoutError:
            return "timeout"
        except OSError as error:
            return _named(error)


def _named(error: OSError) -> str:
    name = type(error).__name__
    if type(error) is OSError and error.errno:
        name += " " + errno.errorcode.get(error.errno, str(error.errno))
    return name


def reach_command(args: argparse.Namespace) -> int:
    """Every target tried at once, each on a thread of its own: a refused or unanswered try
    waits out its own timeout (2 s for UDP, 3 s for TCP) beside the others, not after them (a
    pod's two dozen tries took 20 s one after another)."""
    targets = json.loads(args.targets)
    with ThreadPoolExecutor(max_workers=max(1, len(targets))) as pool:
        tries = {
            name: pool.submit(try_udp if proto == "udp" else try_tcp, host, int(port))
            for name, proto, host, port in targets
        }
    print(json.dumps({name: found.result() for name, found in tries.items()}, sort_keys=True))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m payloadrun.testing.bootstrap", description=__doc__.split("\n\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    r = commands.add_parser("rank", help="one rank of the bootstrap (rank 0 serves the store)")
    which = r.add_mutually_exclusive_group(required=True)
    which.add_argument("--rank", type=int, help="this rank's number")
    which.add_argument(
        "--rank-from-hostname", type=int, metavar="K", help="rank K + the hostname's last number"
    )
    r.add_argument("--world", type=int, required=True, help="how many ranks")
    r.add_argument("--store-host", default="127.0.0.1", help="rank 0's address")
    r.add_argument("--store-port", type=int, default=STORE_PORT)
    r.add_argument("--timeout", type=float, default=120.0, help="seconds for the whole bootstrap")
    r.add_argument("--bind", default="0.0.0.0", help="the listeners' address")
    r.add_argument(
        "--after",
        metavar="FILE",
        help="start once FILE exists (rank 0 serves the store at once): a test starts the "
        "group when the network is as it wants it",
    )
    r.add_argument("--advertise", help="this rank's address for the others (default: the host's)")
    r.set_defaults(run=rank_command)
    t = commands.add_parser("reach", help="try TCP and UDP targets once each")
    t.add_argument("targets", help='JSON: [["name", "tcp"|"udp", "host", port], ...]')
    t.set_defaults(run=reach_command)
    args = parser.parse_args(argv)
    if args.command == "rank":
        # the main thread waits for SIGTERM with sigwait: block it everywhere first (threads
        # inherit the mask), so the kubelet's stop ends the rank at once
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
