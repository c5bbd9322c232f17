"""The retention sidecar: deletes payload files once the trainer has consumed them.

It runs beside the orchestrator. The orchestrator tells it which files each batch holds
(``record_batch``), when the trainer has read batches (``policy_updated``) and which files no
batch will read (``discard``); the sidecar journals each event durably, acknowledges it at once
and unlinks in the background. A version sweep stays as a backstop for files nobody claims.

Modules: ``policy`` (pure rules), ``state`` (the in-memory model the rules act on), ``journal``
(the record format and its durable file), ``deleter`` (unlinking below a descriptor of the root),
``queue`` (the background deletion queue and the directory accounting), ``config`` (settings),
``service`` (run identity, events, status), ``app`` (HTTP), ``client`` (sync and async clients
for the orchestrator), ``metrics`` and ``cli``.

The clients and their errors are the orchestrator's, so ``import payloadrun`` exports them too
(``payloadrun.RetentionClient``); they are importable from here as before.
"""

from payloadrun.retention.client import (
    AsyncRetentionClient,
    DiscardConflictError,
    RetentionClient,
    RetentionError,
    RetentionUnavailableError,
    RetentionVolumeHungError,
)
from payloadrun.retention.policy import min_fresh_version

__all__ = [
    "AsyncRetentionClient",
    "DiscardConflictError",
    "RetentionClient",
    "RetentionError",
    "RetentionUnavailableError",
    "RetentionVolumeHungError",
    "min_fresh_version",
]
