"""Which add-on APIs the cluster serves (:data:`kinds.OPTIONAL`: LeaderWorkerSet, Kueue's),
learnt once, at the operator's start, from the API server's discovery documents.

Once at start, not as the cluster changes: the follower's watches of the add-ons' kinds
(observed/watching.py) are made once, from what this found, when its cache is first filled, as
kopf resolves the runs' resource once (the operator turns kopf's scanning off,
``settings.scanning.disabled``, since a running scan watches every CustomResourceDefinition in
the cluster, and for a namespaced operator every Namespace, which would need cluster-wide RBAC
that nothing else needs). :meth:`Discovery.discover` runs in the login handler, before the
follower lists anything, so an API the operator uses is one it watches. An API installed later
is used after the operator's next start (``kubectl rollout restart``): runs created meanwhile
are reconciled then, as every run is at start.

Discovery documents are readable by every authenticated user (the ``system:discovery``
ClusterRole): this needs no RBAC of its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

import aiohttp

from payloadrun_operator.api.addons import ADDONS
from payloadrun_operator.api.kinds import OPTIONAL, Kind
from payloadrun_operator.platform.kube import KubeApiError, KubeClient

log = logging.getLogger("payloadrun.discovery")
RETRY_SECONDS = 2.0  # after a discovery request that failed (the API server unreachable)
NEEDED_VERBS = frozenset({"list", "watch", "patch"})  # followed (list, watch) and applied


def group_versions(group: dict | None) -> tuple[str, ...]:
    """The versions an ``APIGroup`` document (``GET /apis/<group>``; None: 404) says are served."""
    return tuple(v["version"] for v in (group or {}).get("versions") or [] if v.get("version"))


def served_by(kind: Kind, resources: dict | None) -> bool:
    """Whether an ``APIResourceList`` (the answer of ``GET /apis/<group>/<version>``; None: 404)
    serves ``kind`` as the operator uses it: listed, watched and applied."""
    if not resources:
        return False
    for resource in resources.get("resources") or []:
        if resource.get("name") == kind.plural:
            return set(resource.get("verbs") or []) >= NEEDED_VERBS
    return False


def missing_fields(document: dict | None, kind: Kind, fields: Iterable[str]) -> tuple[str, ...]:
    """The dotted ``fields`` (``spec.networkConfig.subdomainPolicy``) that ``kind``'s schema in an
    OpenAPI v3 document (``GET /openapi/v3/apis/<group>/<version>``) lacks: an older release of
    its add-on. Nothing when the document has no schema of the kind (nothing to tell)."""
    wanted = {"group": kind.group, "version": kind.version, "kind": kind.kind}
    schemas = ((document or {}).get("components") or {}).get("schemas") or {}
    for schema in schemas.values():
        if wanted in (schema.get("x-kubernetes-group-version-kind") or []):
            break
    else:
        return ()
    missing = []
    for field in fields:
        node = schema
        for name in field.split("."):
            node = (node.get("properties") or {}).get(name)
            if node is None:
                missing.append(field)
                break
    return tuple(missing)


class Discovery:
    """The add-on kinds the cluster serves, as found at the operator's start."""

    def __init__(self, kinds: Iterable[Kind] = OPTIONAL) -> None:
        self.kinds = tuple(kinds)
        self._served: frozenset[Kind] = frozenset()
        # for a kind not served: the versions its API group is served at (an older release)
        self._group_versions: dict[Kind, tuple[str, ...]] = {}
        self.done = asyncio.Event()
        self._asking = asyncio.Lock()
        # the first failure is logged, not every retry (a refused connection and a reset one
        # alternate while an API server starts), nor a later caller's once the first's was
        # cancelled (kopf's login handler at a stop, with the follower's start waiting behind)
        self._failed = False

    def serves(self, kind: Kind) -> bool:
        """Whether ``kind``'s API was served when the operator started (False before
        :meth:`discover`, and for a kind that is not optional: ask only about add-ons)."""
        return kind in self._served

    def group_versions(self, kind: Kind) -> tuple[str, ...]:
        """For a kind not served: the versions of its API group the cluster serves, an older
        release of its add-on than the operator needs (none: the add-on is not installed)."""
        return self._group_versions.get(kind, ())

    def mark(
        self, served: Iterable[Kind], group_versions: dict[Kind, tuple[str, ...]] | None = None
    ) -> None:
        """Record what the cluster serves (tests; :meth:`discover` calls it)."""
        self._served = frozenset(served)
        self._group_versions = dict(group_versions or {})
        self.done.set()

    async def discover(self, client: KubeClient) -> None:
        """Ask the API server once which of :attr:`kinds` it serves (retried until it answers);
        a call while it is asked waits for the answer, and later calls do nothing (kopf's login
        handler runs again on expired credentials)."""
        async with self._asking:  # the login handler and the follower's start ask at once
            if not self.done.is_set():
                await self._discover(client)

    async def _discover(self, client: KubeClient) -> None:
        while True:
            try:
                answers = {}  # one request per group version (Kueue's kinds share one)
                for kind in self.kinds:
                    if kind.api_version not in answers:
                        answers[kind.api_version] = await client.discover(kind)
                served = [k for k in self.kinds if served_by(k, answers[k.api_version])]
                groups = {}  # what an add-on's group serves instead: an older release's API
                for kind in self.kinds:
                    if kind not in served and kind.group not in groups:
                        groups[kind.group] = group_versions(await client.discover_group(kind.group))
                older = {
                    k: others
                    for k in self.kinds
                    if (others := tuple(v for v in groups.get(k.group, ()) if v != k.version))
                }
                # served at the version, but by a release without fields the operator sets
                for kind in list(served):
                    addon = ADDONS.get(kind)
                    if addon and addon.required_fields:
                        try:
                            document = await client.openapi(kind)
                        except KubeApiError as exc:  # no schema to read (403): nothing to tell
                            log.info("%s's schema could not be read: %s", kind.kind, exc)
                            document = None
                        if lacking := missing_fields(document, kind, addon.required_fields):
                            served.remove(kind)
                            older[kind] = (f"{kind.version} without {', '.join(lacking)}",)
                break
            except (KubeApiError, aiohttp.ClientError, OSError, TimeoutError) as exc:
                if not self._failed:
                    log.warning(
                        "discovering the cluster's APIs failed: %s; retrying every %g s",
                        exc,
                        RETRY_SECONDS,
                    )
                    self._failed = True
                else:
                    log.debug("discovering the cluster's APIs failed again: %s", exc)
                await asyncio.sleep(RETRY_SECONDS)
        if self._failed:
            log.info("discovering the cluster's APIs: the API server answers again")
        for kind in self.kinds:
            addon = ADDONS.get(kind)
            if kind not in served and addon and older.get(kind):
                log.warning(
                    "%s %s: not served; %s, and runs that need it wait",
                    kind.kind,
                    kind.api_version,
                    addon.not_served(older[kind]),
                )
                continue
            log.info(
                "%s %s: %s",
                kind.kind,
                kind.api_version,
                "served: followed" if kind in served else "not served: runs that need it wait",
            )
        self.mark(served, older)
