"""What the retention service refuses, and why: each error with the HTTP status it is answered
with (payloadrun.retention.app) and the words its client raises it in."""

from __future__ import annotations

from payloadrun.paths import PayloadPathError
from payloadrun.retention import client


class BadRequestError(ValueError):
    """A request the service refuses as sent (a step that is not an integer, files that are not
    a list, a path outside the root): the client's to fix, answered 400 by the HTTP API.

    Only this type is a client error; any other exception from the service is the service's
    own failure (500, or 503 when it is not running or cannot journal).
    """


class ServiceUnavailableError(RuntimeError):
    """The service is not running (not started yet, or closing): answered 503, retry later."""


# what a 503 for a hung volume says in its body's "reason": the clients raise
# RetentionVolumeHungError on it (the client module keeps its own copy: it imports no service)
VOLUME_HUNG = client.VOLUME_HUNG


class VolumeHungError(ServiceUnavailableError):
    """A call was not answered within ``call_deadline_s`` because the journal's volume hangs,
    or the journal is fenced after such a call: answered 503 with ``reason: volume_hung``."""

    def __init__(self, message: str, *, waited_s: float, deadline_s: float, fenced: bool) -> None:
        super().__init__(message)
        self.waited_s = waited_s
        self.deadline_s = deadline_s
        self.fenced = fenced

    def body(self) -> dict:
        return {
            "reason": VOLUME_HUNG,
            "waited_s": round(self.waited_s, 3),
            "deadline_s": self.deadline_s,
            "fenced": self.fenced,
        }


class RefusedPathError(BadRequestError, PayloadPathError):
    """A file in a request is not ``<root>/v<k>/<name>``; ``path`` is the value as sent."""

    def __init__(self, path: object, message: str) -> None:
        super().__init__(message)
        self.path = path


class DiscardRefusedError(RuntimeError):
    """A discard named files that recorded, unconsumed batches hold: nothing was deleted.

    The HTTP API answers it with 409, which the client raises as ``DiscardConflictError``.
    """

    def __init__(self, conflicts: dict[str, int]) -> None:
        shown = ", ".join(f"{f!r} (batch {s})" for f, s in list(conflicts.items())[:5])
        more = f" and {len(conflicts) - 5} more" if len(conflicts) > 5 else ""
        super().__init__(
            f"refused to discard {len(conflicts)} file(s) that recorded batches not yet "
            f"consumed will read: {shown}{more}; leave them to the batch (they are deleted when "
            "the policy update consumes it) and discard only files no batch holds"
        )
        self.conflicts = conflicts
