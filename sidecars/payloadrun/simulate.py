"""``payloadrun simulate``: an RL loop (inference, orchestrator, trainer) against a payload root
(the directory that holds the ``v<k>`` payload directories).

It plays prime-rl's parts with files instead of models, to show what a retention policy does to
the payload directory:

- inference dispatches groups of rollouts at the current policy version; each rollout is
  multi-turn and agentic (:mod:`payloadrun.agentic`: turns per rollout uniform from 1 to
  ``--turns``, each turn a tool result or a user's reply and the model's answer, some turns
  forking off an earlier node, some bridged on the previous answer), its turns spread over the
  steps until it finishes (stragglers take many steps), and each turn writes one file into
  ``v<k>``, ``k`` the policy version the turn was dispatched at (never older than its group's);
- the orchestrator waits for whole groups, drops some (``--drop-rate``: zero-advantage groups, the
  files discarded), sweeps groups older than ``min_fresh_version(step, m)`` (finished ones
  discarded; cancelled in-flight ones leave their files for the backstop), and records each
  batch's files: every file any turn of its rollouts wrote, each once
  (:attr:`payloadrun.traces.TracePayload.files`), a turn no branch reads included;
- the trainer reads batch ``s - lag``, every branch of every rollout
  (:func:`payloadrun.traces.branch_segments`; every file a branch points into, and every file
  of the batch, must still exist: a missing one is a retention bug and is counted) and publishes
  ``v{s - lag}``: ``policy_updated``.

Under ``--policy delete-on-consume`` it drives a retention sidecar over HTTP (its own child process
on a free loopback port, or ``--url``). Under ``--policy version-sweep`` it does what public
prime-rl does: ``rmtree`` of ``v<k>`` for ``k < min_fresh_version(step + 1, m)`` and nothing else.
The workload is a function of ``--seed`` only, so both policies see the same rollouts.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from payloadrun.agentic import Rollout, Shape, Turn, completion
from payloadrun.helptext import HelpFormatter, plain
from payloadrun.paths import PayloadRoot, payload_dir, version_dir_name
from payloadrun.reasons import Deletion
from payloadrun.retention.policy import backstop_bound, min_fresh_version
from payloadrun.segments import ROUTED_EXPERTS, Segment, files_of
from payloadrun.store import FILE_SUFFIX

DELETE_ON_CONSUME = "delete-on-consume"
VERSION_SWEEP = "version-sweep"
POLICIES = (DELETE_ON_CONSUME, VERSION_SWEEP)


@dataclass(frozen=True)
class Workload:
    """The simulated run; the same workload (and seed) gives the same rollouts under any policy."""

    batch_size: int = 512
    group_size: int = 16
    rollout: Shape = field(default_factory=Shape)  # each rollout's turns (payloadrun.agentic)
    row_bytes: int = 64  # a token's routing row in the files written without a writer
    max_off_policy_steps: int = 8  # the operator's default spec.maxOffPolicySteps
    steps: int = 24
    drop_rate: float = 0.1
    straggler_rate: float = 0.03
    trainer_lag: int = 1
    inflight_batches: float = 0.5
    seed: int = 0

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.group_size < 1 or self.batch_size % self.group_size:
            raise ValueError(
                f"batch size {self.batch_size} must be a positive multiple of the group size "
                f"{self.group_size}"
            )
        if self.row_bytes < 1:
            raise ValueError(f"a routing row is at least 1 byte, got {self.row_bytes}")
        if self.steps < 1 or self.max_off_policy_steps < 0 or self.trainer_lag < 0:
            raise ValueError("steps must be >= 1; max_off_policy_steps and lag >= 0")
        if not 0 <= self.drop_rate < 1 or not 0 <= self.straggler_rate <= 1:
            raise ValueError("drop rate must be in [0, 1), straggler rate in [0, 1]")

    @property
    def groups_per_batch(self) -> int:
        return self.batch_size // self.group_size


@dataclass
class StepRecord:
    """The payload directory around one step's policy update."""

    step: int
    policy_step: int | None
    batch_rollouts: int
    written_files: int
    high_bytes: int  # before the policy update (the step's high-water mark)
    high_files: int
    after_bytes: int  # after its deletions finished
    after_files: int
    seconds: float
    batch_bytes: int  # a batch's payload bytes (mean rollout so far x batch size)


@dataclass
class Summary:
    policy: str
    workload: Workload
    steps: list[StepRecord] = field(default_factory=list)
    written_files: int = 0  # one a turn
    written_bytes: int = 0
    written_rollouts: int = 0  # rollouts whose every turn was written
    rollout_bytes: int = 0  # the bytes of those rollouts
    branches_read: int = 0
    recorded_files: int = 0  # named by record_batch (each batch's files once)
    discarded_files: int = 0  # named by discard
    dropped_groups: int = 0
    stale_groups: int = 0
    cancelled_groups: int = 0
    missing_files: int = 0
    deleted: dict[str, dict[str, int]] = field(default_factory=dict)
    final_bytes: int = 0
    final_files: int = 0
    seconds: float = 0.0

    @property
    def peak_bytes(self) -> int:
        return max((s.high_bytes for s in self.steps), default=0)

    @property
    def peak_files(self) -> int:
        return max((s.high_files for s in self.steps), default=0)

    @property
    def batch_bytes(self) -> int:
        """A batch's payload bytes, from the mean whole rollout written (inference decides its
        size)."""
        if not self.written_rollouts:
            return 0
        return round(self.rollout_bytes / self.written_rollouts * self.workload.batch_size)

    @property
    def peak_batches(self) -> float:
        return self.peak_bytes / self.batch_bytes if self.batch_bytes else 0.0

    def to_json(self) -> dict:
        out = asdict(self)
        out.update(
            batch_bytes=self.batch_bytes,
            peak_bytes=self.peak_bytes,
            peak_files=self.peak_files,
            peak_batches=round(self.peak_batches, 3),
        )
        return out


@dataclass
class _Rollout:
    trace: Rollout
    turn_steps: list[int]  # the step each turn is written at, the last one's when it finishes
    written: int = 0  # turns written
    nbytes: int = 0

    @property
    def done(self) -> bool:
        return self.written == len(self.turn_steps)


@dataclass
class _Group:
    version: int
    rollouts: list[_Rollout]

    @property
    def complete(self) -> bool:
        return all(r.done for r in self.rollouts)

    @property
    def last_step(self) -> int:
        """The step its last turn is written at."""
        return max(r.turn_steps[-1] for r in self.rollouts)

    @property
    def files(self) -> list[str]:
        return [f for r in self.rollouts for f in r.trace.files]


class _Retention:
    """What the loop asks of a retention policy."""

    def record(self, step: int, files: list[str]) -> None: ...
    def discard(self, files: list[str]) -> None: ...
    def policy_updated(self, step: int) -> None: ...
    def drain(self) -> None: ...
    def deleted(self) -> dict[str, dict[str, int]]:
        return {}


class _SidecarRetention(_Retention):
    def __init__(self, client) -> None:  # a RetentionClient
        self.client = client

    def record(self, step: int, files: list[str]) -> None:
        self.client.record_batch(step, files, empty=not files)

    def discard(self, files: list[str]) -> None:
        if files:
            self.client.discard(files)

    def policy_updated(self, step: int) -> None:
        self.client.policy_updated(step)

    def drain(self, timeout: float = 600.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            st = self.client.status()
            if st["queue_files"] == 0 and st["outstanding_jobs"] == 0:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"retention queue not drained after {timeout} s: {st}")
            time.sleep(0.005)

    def deleted(self) -> dict[str, dict[str, int]]:
        return self.client.status()["deleted"]


class _VersionSweep(_Retention):
    """Public prime-rl: rmtree of whole old version directories, nothing on consume."""

    def __init__(self, root: PayloadRoot, max_off_policy_steps: int) -> None:
        self.root = root
        self.m = max_off_policy_steps
        self.files = 0
        self.bytes = 0

    def policy_updated(self, step: int) -> None:
        bound = backstop_bound(step, self.m)
        for k, path in self.root.version_dirs().items():
            if k < bound:
                size, n = directory_size([path])
                self.files += n
                self.bytes += size
                shutil.rmtree(path, ignore_errors=True)

    def deleted(self) -> dict[str, dict[str, int]]:
        return {Deletion.BACKSTOP.value: {"files": self.files, "bytes": self.bytes}}


def directory_size(dirs) -> tuple[int, int]:
    """Bytes and files directly inside ``dirs`` (the simulator's own measurement)."""
    size = files = 0
    for d in dirs:
        try:
            with os.scandir(d) as it:
                for e in it:
                    if e.is_file(follow_symlinks=False):
                        size += e.stat(follow_symlinks=False).st_size
                        files += 1
        except FileNotFoundError:
            continue
    return size, files


def measure(root: PayloadRoot) -> tuple[int, int]:
    return directory_size(root.version_dirs().values())


class LocalFiles:
    """Inference as plain file writes: a turn's file holds its routing rows, ``row_bytes`` each
    (one per forwarded token: from the turn's ``routed_experts_prompt_start`` to the last
    forwarded token), as the writer would lay them out."""

    def __init__(self, workload: Workload, root: PayloadRoot) -> None:
        self.w = workload
        self.root = root
        self.noise = memoryview(os.urandom(1 << 16))

    def write(self, turn: Turn, version: int, rng: random.Random) -> tuple[list[int], list]:
        answer = completion(rng, self.w.rollout)
        rows = len(turn.prompt_ids) + len(answer) - 1 - turn.prompt_start
        d = self.root.path / version_dir_name(version)
        d.mkdir(exist_ok=True)
        path = d / f"{uuid.UUID(int=rng.getrandbits(128)).hex}{FILE_SUFFIX}"
        size = rows * self.w.row_bytes
        if size > len(self.noise):  # the rows' bytes, whatever they are: random, made once
            self.noise = memoryview(os.urandom(2 * size))
        data = self.noise[:size]
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        routing = Segment(
            ROUTED_EXPERTS, str(path), 0, turn.prompt_start, rows, "uint8", (self.w.row_bytes,)
        )
        return answer, [routing]


class ThroughWriter:
    """Inference through a writer sidecar: each turn is one tokens-in generate request.

    The request names ``payload_dir = <root>/v<k>``, the rollout's session (``X-Session-ID``)
    and, on a bridged turn, ``routed_experts_prompt_start``; the writer takes the routed experts
    and the sampling mask off the (vLLM-format) response, writes them into one file and returns
    its segments. ``handle_bytes`` counts the response bytes that came back.
    """

    def __init__(self, url: str, root: PayloadRoot, workload: Workload):
        self.url = url.rstrip("/") + "/inference/v1/generate"
        self.root = root
        self.w = workload
        self.handle_bytes = 0

    def write(
        self, turn: Turn, version: int, rng: random.Random, session: str = ""
    ) -> tuple[list[int], list]:
        import urllib.request

        from payloadrun.segments import PAYLOAD_DIR_ARG, choice_segments
        from payloadrun.writer.upstreams import SESSION_HEADER

        body = {
            "model": "simulate",
            "token_ids": turn.prompt_ids,
            "sampling_params": {
                "max_tokens": self.w.rollout.completion_tokens,
                "temperature": 1.0,
                "routed_experts_prompt_start": turn.prompt_start,
                "extra_args": {PAYLOAD_DIR_ARG: payload_dir(self.root.path, version)},
            },
        }
        headers = {"Content-Type": "application/json", SESSION_HEADER: session}
        req = urllib.request.Request(self.url, json.dumps(body).encode(), headers)
        with urllib.request.urlopen(req, timeout=60) as resp:
            raw = resp.read()
        self.handle_bytes += len(raw)
        choice = json.loads(raw)["choices"][0]
        segments = choice_segments(choice)
        if segments is None:
            raise RuntimeError(
                f"the writer at {self.url} answered inline (fallback "
                f"{resp.headers.get('X-Payloadrun-Fallback')!r}): is its payload root "
                f"{str(self.root.path)!r}?"
            )
        return choice["token_ids"], segments


class _Loop:
    """The simulated inference, orchestrator and trainer, one method per part."""

    def __init__(
        self,
        workload: Workload,
        root: PayloadRoot,
        retention: _Retention,
        policy: str,
        inference: LocalFiles | ThroughWriter | None = None,
    ):
        self.w = workload
        self.root = root
        self.retention = retention
        self.inference = inference or LocalFiles(workload, root)
        self.rng = random.Random(workload.seed)
        self.summary = Summary(policy=policy, workload=workload)
        self.inflight: list[_Group] = []
        self.ready: deque[_Group] = deque()
        self.recorded: dict[int, list[_Group]] = {}
        self.policy_version = 0

    def dispatch(self, step: int) -> None:
        """Inference: keep enough groups in flight for this batch and part of the next."""
        w = self.w
        target = math.ceil(w.groups_per_batch * (1 + w.inflight_batches) / (1 - w.drop_rate))
        soon = sum(1 for g in self.inflight if g.last_step <= step + 1)  # not stragglers
        while soon + len(self.ready) < target:
            soon += 1
            # A group finishes within its step or the next; its rollouts at random before that.
            # A straggler (a long agentic episode) holds its group back for many steps.
            last = self.rng.randint(0, 1)
            done = sorted(step + self.rng.randint(0, last) for _ in range(w.group_size))
            if self.rng.random() < w.straggler_rate:
                done[-1] = step + self.rng.randint(2, 2 * w.max_off_policy_steps + 2)
            rollouts = [self._rollout(step, d) for d in done]
            self.inflight.append(_Group(self.policy_version, rollouts))

    def _rollout(self, step: int, done: int) -> _Rollout:
        """A rollout dispatched at ``step`` whose last turn is written at ``done``: its turns
        evenly spread over the time from the start of ``step`` to the end of ``done``, each
        written in the step it ends in."""
        trace = Rollout(self.w.rollout, random.Random(self.rng.getrandbits(64)))
        turns = self.w.rollout.turns(self.rng)
        steps = [step + ((done - step + 1) * (t + 1) - 1) // turns for t in range(turns)]
        return _Rollout(trace, steps)

    def finish_rollouts(self, step: int) -> int:
        """Turns due by ``step`` write their files; whole groups are dropped or queued."""
        written = 0
        still: list[_Group] = []
        for g in self.inflight:
            for r in g.rollouts:
                while not r.done and r.turn_steps[r.written] <= step:
                    written += self._write_turn(r)
            if not g.complete:
                still.append(g)
            elif self.rng.random() < self.w.drop_rate:
                self.summary.dropped_groups += 1
                self.summary.discarded_files += len(g.files)
                self.retention.discard(g.files)
            else:
                self.ready.append(g)
        self.inflight = still
        return written

    def _write_turn(self, rollout: _Rollout) -> int:
        """One turn, into the directory of the policy it is dispatched at (the current one,
        never older than its group's)."""
        trace = rollout.trace
        turn = trace.next_turn()
        if isinstance(self.inference, ThroughWriter):
            answer, segments = self.inference.write(
                turn, self.policy_version, trace.rng, session=f"rollout-{id(rollout):x}"
            )
        else:
            answer, segments = self.inference.write(turn, self.policy_version, trace.rng)
        trace.commit(turn, answer, segments)
        nbytes = sum(s.nbytes for s in segments)
        rollout.written += 1
        rollout.nbytes += nbytes
        self.summary.written_files += len(files_of(segments))
        self.summary.written_bytes += nbytes
        if rollout.done:
            self.summary.written_rollouts += 1
            self.summary.rollout_bytes += rollout.nbytes
        return len(files_of(segments))

    def build_batch(self, step: int) -> int:
        """Orchestrator: drop stale groups, record the oldest whole groups as batch ``step``."""
        fresh = min_fresh_version(step, self.w.max_off_policy_steps)
        stale = [g for g in self.ready if g.version < fresh]
        if stale:
            self.summary.stale_groups += len(stale)
            self.ready = deque(g for g in self.ready if g.version >= fresh)
            stale_files = [f for g in stale for f in g.files]
            self.summary.discarded_files += len(stale_files)
            self.retention.discard(stale_files)
        cancelled = [g for g in self.inflight if g.version < fresh]
        if cancelled:  # cancelled in flight: nobody claims their files (the backstop does)
            self.summary.cancelled_groups += len(cancelled)
            self.inflight = [g for g in self.inflight if g.version >= fresh]
        count = min(self.w.groups_per_batch, len(self.ready))
        batch = [self.ready.popleft() for _ in range(count)]
        self.recorded[step] = batch
        files = [f for g in batch for f in g.files]
        self.summary.recorded_files += len(files)
        self.retention.record(step, files)
        return count * self.w.group_size

    def train(self, step: int) -> None:
        """Trainer: read batch ``step`` in full, every branch of every rollout (every file a
        branch points into, and every file of the batch, must exist), publish ``v{step}``."""
        for group in self.recorded.pop(step, []):
            for rollout in group.rollouts:
                branches = rollout.trace.branch_segments()
                self.summary.branches_read += len(branches)
                read = {f for segments in branches for f in files_of(segments)}
                for f in read | set(rollout.trace.files):
                    if not os.path.exists(f):
                        self.summary.missing_files += 1
        self.retention.policy_updated(step)
        self.policy_version = step

    def run(self, progress: Callable[[StepRecord], None] | None) -> Summary:
        w, summary = self.w, self.summary
        t_start = time.perf_counter()
        for step in range(1, w.steps + 1):
            t0 = time.perf_counter()
            self.dispatch(step)
            written = self.finish_rollouts(step)
            rollouts = self.build_batch(step)
            high_bytes, high_files = measure(self.root)
            trained = step - w.trainer_lag
            if trained >= 1:
                self.train(trained)
                self.retention.drain()
            after_bytes, after_files = measure(self.root)
            record = StepRecord(
                step,
                trained if trained >= 1 else None,
                rollouts,
                written,
                high_bytes,
                high_files,
                after_bytes,
                after_files,
                time.perf_counter() - t0,
                summary.batch_bytes,
            )
            summary.steps.append(record)
            if progress:
                progress(record)
        for trained in range(max(1, w.steps - w.trainer_lag + 1), w.steps + 1):
            self.train(trained)
        self.retention.drain()
        summary.final_bytes, summary.final_files = measure(self.root)
        summary.deleted = self.retention.deleted()
        summary.seconds = time.perf_counter() - t_start
        return summary


def simulate(
    workload: Workload,
    root: PayloadRoot,
    retention: _Retention,
    *,
    policy: str,
    progress: Callable[[StepRecord], None] | None = None,
    inference: LocalFiles | ThroughWriter | None = None,
) -> Summary:
    """Play the RL loop for ``workload.steps`` batches; returns the per-step directory sizes."""
    return _Loop(workload, root, retention, policy, inference).run(progress)


def run_policy(
    workload: Workload,
    policy: str,
    root: Path,
    *,
    url: str | None = None,
    progress: Callable[[StepRecord], None] | None = None,
    sidecar_args: tuple[str, ...] = (),
    writer_url: str | None = None,
) -> Summary:
    """Run ``workload`` under ``policy`` on ``root`` (starting a sidecar unless ``url``).

    With ``writer_url`` the rollouts' payload files come from that writer sidecar (whose payload
    root must be ``root``) instead of plain file writes.
    """
    from payloadrun.children import SidecarProcess
    from payloadrun.retention.client import RetentionClient

    root.mkdir(parents=True, exist_ok=True)
    payload_root = PayloadRoot(root)
    inference = None
    if writer_url is not None:
        inference = ThroughWriter(writer_url, payload_root, workload)
    play = functools.partial(simulate, policy=policy, progress=progress, inference=inference)
    if policy == VERSION_SWEEP:
        for path in payload_root.version_dirs().values():
            shutil.rmtree(path)
        return play(
            workload, payload_root, _VersionSweep(payload_root, workload.max_off_policy_steps)
        )
    if policy != DELETE_ON_CONSUME:
        raise ValueError(f"unknown policy {policy!r}: use one of {POLICIES}")
    if url is not None:
        with RetentionClient(url) as client:
            served = client.status()["root"]
            if os.path.realpath(served) != str(payload_root.path):
                raise ValueError(
                    f"the sidecar at {url} serves {served!r}, not {str(payload_root.path)!r}: "
                    "pass the same --root"
                )
            return play(workload, payload_root, _SidecarRetention(client))
    args = (
        "--max-off-policy-steps",
        str(workload.max_off_policy_steps),
        "--max-steps",
        str(workload.steps),
        "--scan-interval",
        "1",
        *sidecar_args,
    )
    run_id = f"simulate-{workload.seed}-{uuid.uuid4().hex[:8]}"
    with SidecarProcess(root, run_id, args=args) as sidecar, RetentionClient(sidecar.url) as client:
        return play(workload, payload_root, _SidecarRetention(client))


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def format_step(w: Workload, r: StepRecord) -> str:
    policy = "-" if r.policy_step is None else f"v{r.policy_step}"
    batches = r.high_bytes / r.batch_bytes if r.batch_bytes else 0.0
    return (
        f"step {r.step:>4}/{w.steps}  policy {policy:>5}  wrote {r.written_files:>6} files  "
        f"batch {r.batch_rollouts:>5} rollouts  dir {_mb(r.high_bytes):>11} "
        f"{r.high_files:>7} files ({batches:5.2f} batches) -> "
        f"{_mb(r.after_bytes):>11} {r.after_files:>7} files  {r.seconds * 1e3:7.1f} ms"
    )


def format_summary(s: Summary) -> str:
    w = s.workload
    deleted = ", ".join(f"{k} {v['files']} files/{_mb(v['bytes'])}" for k, v in s.deleted.items())
    return "\n".join(
        [
            f"policy {s.policy}: {w.steps} steps, batch {w.batch_size} rollouts "
            f"({w.groups_per_batch} groups of {w.group_size}), m={w.max_off_policy_steps}, "
            f"seed {w.seed}",
            f"peak directory: {_mb(s.peak_bytes)}, {s.peak_files} files "
            f"({s.peak_batches:.2f} batches of {_mb(s.batch_bytes)})",
            f"final directory: {_mb(s.final_bytes)}, {s.final_files} files",
            f"written: {s.written_files} files (one a turn, {s.written_rollouts} whole rollouts of "
            f"1-{w.rollout.max_turns} turns), {_mb(s.written_bytes)}; groups dropped "
            f"{s.dropped_groups}, stale {s.stale_groups}, cancelled in flight {s.cancelled_groups}",
            f"branches the trainer read: {s.branches_read}",
            f"deleted: {deleted or 'nothing'}",
            f"trainer reads of missing files: {s.missing_files}",
            f"time: {s.seconds:.2f} s",
        ]
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="play an RL loop against a payload root under a retention policy",
        description=plain(__doc__),
        formatter_class=HelpFormatter,
    )
    d = Workload()
    p.add_argument(
        "--policy",
        choices=POLICIES,
        default=DELETE_ON_CONSUME,
        help="delete-on-consume: a retention sidecar deletes each batch's files once trained "
        "on; version-sweep: public prime-rl's rmtree of stale v<k> directories, nothing else",
    )
    p.add_argument(
        "--root",
        type=Path,
        help="the payload root to play against (default: a temporary directory, removed after)",
    )
    p.add_argument("--url", help="use the retention sidecar at this URL instead of starting one")
    p.add_argument(
        "--writer-url",
        help="get each rollout's payload file from this writer sidecar (a tokens-in generate "
        "request with payload_dir) instead of writing files; its payload root must be --root",
    )
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="rollouts per batch")
    p.add_argument("--group-size", type=int, default=d.group_size, help="rollouts per group")
    shape = d.rollout
    p.add_argument(
        "--turns",
        type=int,
        default=shape.max_turns,
        help="turns per rollout: uniform from 1 to this (1: single-turn rollouts)",
    )
    p.add_argument(
        "--fork-rate",
        type=float,
        default=shape.fork_rate,
        help="the share of later turns that fork off an earlier node instead of the latest answer",
    )
    p.add_argument(
        "--bridge-rate",
        type=float,
        default=shape.bridge_rate,
        help="the share of turns on an answer that ask routing from its final token on "
        "(routed_experts_prompt_start); the others re-forward their whole prompt",
    )
    p.add_argument(
        "--prompt-tokens", type=int, default=shape.prompt_tokens, help="the first turn's prompt"
    )
    p.add_argument(
        "--new-tokens",
        type=int,
        default=shape.new_tokens,
        help="the new message of each later turn (a tool result, a user's reply)",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=shape.completion_tokens,
        help="completion tokens of each answer",
    )
    p.add_argument(
        "--row-bytes",
        type=int,
        default=d.row_bytes,
        help="bytes of a token's routing row in the files written without --writer-url "
        "(Qwen3-30B-A3B's: 384)",
    )
    p.add_argument(
        "--max-off-policy-steps",
        type=int,
        default=d.max_off_policy_steps,
        help="the trainer's staleness bound m: rollouts older than min_fresh_version(step, m) "
        "are swept",
    )
    p.add_argument("--steps", type=int, default=d.steps, help="training steps to play")
    p.add_argument("--drop-rate", type=float, default=d.drop_rate, help="groups dropped")
    p.add_argument(
        "--straggler-rate", type=float, default=d.straggler_rate, help="groups with a slow rollout"
    )
    p.add_argument("--trainer-lag", type=int, default=d.trainer_lag, help="batches in flight")
    p.add_argument(
        "--seed",
        type=int,
        default=d.seed,
        help="the workload's random seed (both policies see the same rollouts for one seed)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        workload = Workload(
            batch_size=args.batch_size,
            group_size=args.group_size,
            rollout=Shape(
                prompt_tokens=args.prompt_tokens,
                new_tokens=args.new_tokens,
                completion_tokens=args.max_tokens,
                max_turns=args.turns,
                fork_rate=args.fork_rate,
                bridge_rate=args.bridge_rate,
            ),
            row_bytes=args.row_bytes,
            max_off_policy_steps=args.max_off_policy_steps,
            steps=args.steps,
            drop_rate=args.drop_rate,
            straggler_rate=args.straggler_rate,
            trainer_lag=args.trainer_lag,
            seed=args.seed,
        )
    except ValueError as exc:
        raise SystemExit(f"simulate: {exc}") from exc
    out = sys.stderr if args.json else sys.stdout

    def progress(record: StepRecord) -> None:
        print(format_step(workload, record), file=out, flush=True)

    with tempfile.TemporaryDirectory(prefix="payloadrun-simulate-") as tmp:
        root = args.root or Path(tmp) / "payloads"
        if args.writer_url and not args.root:
            raise SystemExit("simulate: --writer-url needs --root, the writer's payload root")
        summary = run_policy(
            workload,
            args.policy,
            root,
            url=args.url,
            progress=progress,
            writer_url=args.writer_url,
        )
    print(format_summary(summary), file=out)
    if args.json:
        print(json.dumps(summary.to_json()))
    return 1 if summary.missing_files else 0
