"""kopf's records of a run, kept where they cost no write of their own.

kopf tells a change of a run from its own writes by comparing the run's "essence" (its spec, its
labels and annotations but kopf's own) with the one it handled last, which its annotation storage
keeps whole in an annotation (``payloadrun.dev/last-handled-configuration``): a second copy of
the spec, pod templates included, in every write and watch event of every run, and a merge
patch of the run after every reconcile, which the API server validates against the whole schema.
The operator's handlers read the run, never kopf's diff, so a digest of the essence says all they
need (changed or not), and the reconcile writes it into the status it writes anyway
(``status.observedDigest``, beside ``observedGeneration``): one write a pass, not two
(:class:`StatusDigestDiffBaseStorage`).

kopf's progress records (an annotation per handler, while a handler is retried) are purged once
the handlers succeed; kopf's marker of its annotation prefix (``payloadrun.dev/kopf-managed``) is
written only with a record that stays, and goes with the last one (:class:`QuietProgressStorage`),
so a run handled at the first try gets no metadata patch at all.

A run handled by an older operator keeps its annotation, whole or digest: it is read as its
digest until the status has one, so the upgrade sees no change where there is none, and the
annotation is dropped with the next change the run gets.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from typing import Any

import kopf

DIGEST = "digest"  # the record's one key
MARKER = "kopf-managed"  # kopf's marker of its annotation prefix (conventions._store_marker)


def digest_of(essence: Any) -> dict[str, str]:
    """The record of ``essence``: a SHA-256 of its canonical JSON (keys sorted, no spaces)."""
    encoded = json.dumps(essence, sort_keys=True, separators=(",", ":")).encode()
    return {DIGEST: hashlib.sha256(encoded).hexdigest()}


# What kopf's essence leaves out of a body besides metadata (DiffBaseStorage.build).
NOT_IN_ESSENCE = frozenset({"apiVersion", "kind", "metadata", "status"})
KUBECTL_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


class DigestDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's annotation diff-base storage with a digest of the essence in the annotation."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> Any:
        if extra_fields or self.ignored_fields:  # kopf's own build knows those: no shortcut
            essence = super().build(body=body, extra_fields=extra_fields)
            return digest_of(self._without_own_annotations(essence))
        return digest_of(self.essence(body))

    def essence(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """kopf's essence of ``body`` less the operator's own annotations, as
        :meth:`_without_own_annotations` leaves kopf's, without copying the body: kopf's build
        deep-copies the whole run, pod templates included, to drop its metadata and status,
        which was a sixth of the operator's CPU at 1,000 runs (py-spy). Only the digest is kept,
        so the essence shares the body's values; a test holds the two equal."""
        essence = {k: v for k, v in body.items() if k not in NOT_IN_ESSENCE}
        meta = body.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        ignored = {self.prefix, *self._detect_marked_prefixes(annotations)}
        own_keys = set(self.make_keys(self.key, body=kopf.Body(body)))
        kept = {
            key: value
            for key, value in annotations.items()
            if key not in own_keys
            and key != KUBECTL_LAST_APPLIED
            and not any(key.startswith(f"{prefix}/") for prefix in ignored)
        }
        picked = {"labels": meta.get("labels"), "annotations": kept}
        picked = {k: v for k, v in picked.items() if v}
        if picked:
            essence["metadata"] = picked
        return essence

    def fetch(self, *, body: kopf.Body) -> Any:
        stored = super().fetch(body=body)
        if stored is None or set(stored) == {DIGEST}:
            return stored
        return digest_of(self._without_own_annotations(copy.deepcopy(dict(stored))))

    def digest(self, body: Mapping[str, Any]) -> str:
        """The digest of ``body``'s essence, as :meth:`build` records it."""
        return str(self.build(body=kopf.Body(body))[DIGEST])

    def _without_own_annotations(self, essence: Any) -> Any:
        """What kopf compares: the essence without the annotations under the operator's prefix
        (its progress records), which kopf drops from both sides before it compares them."""
        own = f"{self.prefix}/"
        annotations = essence.get("metadata", {}).get("annotations", {})
        self.remove_annotations(essence, {key for key in annotations if key.startswith(own)})
        self.remove_empty_stanzas(essence)
        return essence


class StatusDigestDiffBaseStorage(DigestDiffBaseStorage):
    """The digest read from the status field ``field`` (``observedDigest``), which the reconcile
    writes with the rest of its status (:mod:`reconcile`'s pass): kopf's own write of the
    record is none. A run whose status has no digest yet is read from the annotation an older
    operator wrote (None: never handled, a creation)."""

    def __init__(self, *, prefix: str, key: str, field: str) -> None:
        super().__init__(prefix=prefix, key=key)
        self.field = field

    def fetch(self, *, body: kopf.Body) -> Any:
        observed = (body.get("status") or {}).get(self.field)
        if isinstance(observed, str) and observed:
            return {DIGEST: observed}
        return super().fetch(body=body)

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: Any) -> None:
        """Nothing: the status holds the record. An older operator's annotation is dropped with
        the next change (kopf stores only after a change), so it never contradicts the status."""
        annotations = body.get("metadata", {}).get("annotations") or {}
        for key in self.make_keys(self.key, body=body):
            if key in annotations:
                patch.meta.annotations[key] = None


class QuietProgressStorage(kopf.AnnotationsProgressStorage):
    """kopf's annotation progress storage, without a marker of its prefix on a run that keeps
    no record: kopf writes the marker with every record and purges the records once the
    handlers succeed, which left a patch of the marker alone after every first reconcile, and
    the marker on the run for good after a retry."""

    def purge(self, *, key: Any, body: kopf.Body, patch: kopf.Patch) -> None:
        super().purge(key=key, body=body, patch=patch)
        own = f"{self.prefix}/"
        marker = f"{own}{MARKER}"
        written = patch.get("metadata", {}).get("annotations") or {}
        existing = body.get("metadata", {}).get("annotations") or {}
        after = {**existing, **written}
        kept = {k for k, v in after.items() if k.startswith(own) and v is not None}
        if not kept <= {marker}:
            return  # a record of kopf's stays: the marker marks it
        if marker in written:
            drop(patch, ["metadata", "annotations", marker])
        elif marker in existing and patch:  # the records purged in this write: the marker too
            patch.meta.annotations[marker] = None


def drop(patch: dict[str, Any], path: list[str]) -> None:
    """Remove ``path`` from ``patch`` with the parents it leaves empty (an empty patch is no
    request: kopf sends one only when something is left)."""
    parents = [patch]
    for key in path[:-1]:
        parents.append(parents[-1][key])
    del parents[-1][path[-1]]
    for parent, key in zip(reversed(parents[:-1]), reversed(path[:-1]), strict=True):
        if parent[key]:
            break
        del parent[key]
