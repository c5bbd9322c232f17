"""kopf's record of the last handled spec, kept as a digest instead of a copy.

kopf tells a change of a run from its own writes by comparing the run's "essence" (its spec, its
labels and annotations but kopf's own) with the one it handled last, which its annotation storage
keeps whole in an annotation (``payloadrun.dev/last-handled-configuration``): a second copy of
the spec, pod templates included, in every write and watch event of every run, about as large as
the spec itself. The operator's handlers read the run, never kopf's diff, so a digest of the
essence says all they need (changed or not) in 50 bytes.

A run handled by an older operator keeps the whole essence: it is read as its digest, so the
upgrade sees no change where there is none, and the next write of the record is a digest.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import kopf

DIGEST = "digest"  # the record's one key


def digest_of(essence: Any) -> dict[str, str]:
    """The record of ``essence``: a SHA-256 of its canonical JSON (keys sorted, no spaces)."""
    encoded = json.dumps(essence, sort_keys=True, separators=(",", ":")).encode()
    return {DIGEST: hashlib.sha256(encoded).hexdigest()}


class DigestDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's annotation diff-base storage with a digest of the essence in the annotation."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> Any:
        essence = super().build(body=body, extra_fields=extra_fields)
        return digest_of(self._without_own_annotations(essence))

    def fetch(self, *, body: kopf.Body) -> Any:
        stored = super().fetch(body=body)
        if stored is None or set(stored) == {DIGEST}:
            return stored
        return digest_of(self._without_own_annotations(copy.deepcopy(dict(stored))))

    def _without_own_annotations(self, essence: Any) -> Any:
        """What kopf compares: the essence without the annotations under the operator's prefix
        (its progress records), which kopf drops from both sides before it compares them."""
        own = f"{self.prefix}/"
        annotations = essence.get("metadata", {}).get("annotations", {})
        self.remove_annotations(essence, {key for key in annotations if key.startswith(own)})
        self.remove_empty_stanzas(essence)
        return essence
