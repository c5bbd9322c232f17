"""The retention sidecar's in-memory model: the policy step and the recorded, unconsumed batches.

No I/O here. Every event (record, policy update, discard) changes this model and returns the
files it makes deletable; the service journals the event first and unlinks those files later.
Replaying a journal runs the same methods, so a restart rebuilds exactly the state that was
acknowledged. Files are keys ``"v<k>/<name>"`` relative to the payload root.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from payloadrun.retention.policy import (
    Disposition,
    batch_disposition,
    discard_conflicts,
    settled_steps,
)


@dataclass(frozen=True, slots=True)
class Settled:
    """What a policy update consumed: the batch steps and the files that may now go."""

    steps: tuple[int, ...]
    files: tuple[str, ...]


@dataclass
class RetentionState:
    """Pending batches (step -> files), each file's owning batch, the last policy step."""

    policy_step: int | None = None
    # the highest step recorded, whatever its disposition: how far the orchestrator has got
    recorded_step: int | None = None
    # step -> its files, in the order they were recorded (a dict as an ordered set): unlinking in
    # recorded order, which is about creation order, is faster than in hash order, since a
    # directory's entries are then removed roughly in the order the file system laid them out.
    pending: dict[int, dict[str, None]] = field(default_factory=dict)
    owner: dict[str, int] = field(default_factory=dict)

    @property
    def pending_files(self) -> int:
        return len(self.owner)

    @property
    def oldest_pending_step(self) -> int | None:
        return min(self.pending, default=None)

    def is_protected(self, key: str) -> bool:
        """True while a batch that holds ``key`` is recorded and not yet consumed."""
        return key in self.owner

    def protected(self, keys: Iterable[str]) -> set[str]:
        """Those of ``keys`` that :meth:`is_protected` (one set operation, in C)."""
        return self.owner.keys() & keys

    def disposition(self, step: int, *, empty: bool, max_steps: int | None) -> Disposition:
        return batch_disposition(
            step, empty=empty, policy_step=self.policy_step, max_steps=max_steps
        )

    def record(self, step: int, files: Iterable[str], disposition: Disposition) -> list[str]:
        """Apply a recorded batch; returns the files to delete now (none when it is pending).

        Recording the same step twice adds to it (a client's retry is harmless). A file already
        held by another pending batch stays until the later of the two is consumed, so a caller
        that lists a file twice never loses it early.
        """
        unique = list(dict.fromkeys(files))
        if self.recorded_step is None or step > self.recorded_step:
            self.recorded_step = step
        if disposition is not Disposition.PENDING:
            return [f for f in unique if f not in self.owner]
        batch = self.pending.setdefault(step, {})
        for f in unique:
            prev = self.owner.get(f)
            if prev is None:
                self.owner[f] = step
                batch[f] = None
            elif prev < step:
                del self.pending[prev][f]
                self.owner[f] = step
                batch[f] = None
        return []

    def policy_updated(self, step: int) -> Settled:
        """Consume every pending batch ``<= step``; an older or repeated step changes nothing."""
        if self.policy_step is not None and step <= self.policy_step:
            return Settled((), ())
        self.policy_step = step
        steps = settled_steps(self.pending, step)
        files: list[str] = []
        for s in steps:
            for f in self.pending.pop(s):
                del self.owner[f]
                files.append(f)
        return Settled(tuple(steps), tuple(files))

    def conflicts(self, files: Iterable[str]) -> dict[str, int]:
        """Files of a discard that a pending batch holds (the discard must be refused)."""
        return discard_conflicts(files, self.owner)
