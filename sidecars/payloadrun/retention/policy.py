"""The retention rules as pure functions: which files go when, and which requests are refused.

Why these rules are safe (from the seed): a file belongs to one trace and a trace's samples ship
together in one batch, so a file is owned by at most one batch and needs no reference count. The
trainer reads batch ``s`` in full before it publishes policy ``v{s}``, so once ``policy_updated(s)``
arrives every batch ``<= s`` is consumed. Batch ``b`` only ships rollouts whose group started at
``min_fresh_version(b, m)`` or later, and a rollout's directory ``v<k>`` is its own dispatch
version, never older than its group's start; so after ``policy_updated(s)`` no future batch
(``b >= s + 1``) can read a file in ``v<k>`` with ``k < min_fresh_version(s + 1, m)``: that is the
backstop bound.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum


class Disposition(StrEnum):
    """What happens to a recorded batch's files when it arrives."""

    PENDING = "pending"  # kept until a policy update consumes the batch
    CONSUMED = "consumed"  # the trainer already published a policy >= step: delete now
    DISCARDED = "discarded"  # empty batch or past max_steps: no trainer reads it, delete now


def min_fresh_version(step: int, max_off_policy_steps: int) -> int:
    """The oldest policy version batch ``step`` may train on: ``(step - 1) - m``.

    The same formula as prime-rl's staleness bound; it may be negative early in a run (then
    nothing is stale yet).
    """
    if max_off_policy_steps < 0:
        raise ValueError(
            f"max_off_policy_steps must be >= 0, got {max_off_policy_steps}: it is the trainer's "
            "staleness bound"
        )
    return (step - 1) - max_off_policy_steps


def backstop_bound(policy_step: int, max_off_policy_steps: int) -> int:
    """Version directories ``v<k>`` with ``k`` below this can go after ``policy_updated(step)``."""
    return min_fresh_version(policy_step + 1, max_off_policy_steps)


def backstop_versions(
    versions: Iterable[int], policy_step: int | None, max_off_policy_steps: int
) -> list[int]:
    """The present versions the backstop removes at ``policy_step`` (none before any update)."""
    if policy_step is None:
        return []
    bound = backstop_bound(policy_step, max_off_policy_steps)
    return sorted(k for k in versions if k < bound)


def settled_steps(pending_steps: Iterable[int], policy_step: int) -> list[int]:
    """The recorded batches a ``policy_updated(policy_step)`` consumes: every step ``<=`` it."""
    return sorted(s for s in pending_steps if s <= policy_step)


def batch_disposition(
    step: int, *, empty: bool, policy_step: int | None, max_steps: int | None
) -> Disposition:
    """Whether a batch recorded now is kept, or its files go at once (and why).

    An empty batch ships no sample and a batch past ``max_steps`` is never trained on: no trainer
    reads either. A batch at or below the current policy step was already read (the trainer
    publishes ``v{s}`` only after reading batch ``s``); it arrives late only through a race
    between the orchestrator's two calls, and its files are consumed.
    """
    if empty or (max_steps is not None and step > max_steps):
        return Disposition.DISCARDED
    if policy_step is not None and step <= policy_step:
        return Disposition.CONSUMED
    return Disposition.PENDING


def discard_conflicts(files: Iterable[str], owner: Mapping[str, int]) -> dict[str, int]:
    """The files of ``files`` that a pending (unconsumed) batch holds, with that batch's step.

    Deleting one would lose data a trainer is about to read, so the whole discard is refused:
    it is a caller bug (the file was recorded in a batch and also given up).
    """
    return {f: owner[f] for f in files if f in owner}
