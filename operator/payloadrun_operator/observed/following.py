"""What the operator knows of the runs and their children, as controller-runtime's informers
and cached client: a cache kept by watch events, and every event told to the work queue.

kopf watches the runs, the follower's reflectors (:mod:`watching`) the kinds of child the
status reads (:data:`kinds.CHILD_KINDS`); every event goes to :meth:`Follower.observe`, which
keeps the object in a :class:`Cache` and tells the work queue (:mod:`platform.workqueue`) the run
it belongs to (its own name, or a child's ``payloadrun.dev/run`` label), as controller-runtime's
``Owns()`` maps an owned object's event to its owner's key: a pod that becomes ready moves its
StatefulSet's or Job's status, whose event reaches the run's ``Ready`` condition within
milliseconds, and a run whose children did not change costs nothing (no call, no write). Two
kinds of event owe the run its spec side too (:func:`child_event_requeues`): a child deleted, a
Workload whose admission changed.

Children are known by the managed-by label, and an object that carries it but has a controller
other than a run is left out (:func:`controlled_elsewhere`): LeaderWorkerSet copies the labels of
a run's LeaderWorkerSet onto the StatefulSets it makes. LeaderWorkerSets themselves are listed
and watched only where the cluster served their API when the operator started
(:mod:`platform.discovery`).

Neither kopf's watch handler (``on.event``) nor the reflectors put a finalizer on anything. The
cache holds only what the status reads: managed fields and pod templates (a run's and its
workloads') are dropped, so 1,000 runs of 8 children stay small. It is filled by one list of
each kind before the first pass (a run passed over before its children arrive would flap to
not-ready; each kind's watch starts from its list's version), and every
``resync_seconds`` every cached run is queued again: a safety net, as controller-runtime's
``SyncPeriod`` is, that costs no API call.

A pass reads a run's workloads from the same cache once it is synced (:meth:`Follower.live`)
instead of asking the API server for each (three GETs a run), as controller-runtime's cached
client does. What the operator itself writes goes into the cache at once (:meth:`Follower.wrote`:
the API server's answer to an apply), so a pass that follows another sees its writes even
before their watch events arrive; an event older than what is cached (one of those writes'
predecessors), or than the object's deletion, changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import aiohttp

from payloadrun_operator.api.kinds import FOLLOWED, RUN, WORKLOAD, Kind
from payloadrun_operator.api.models import KIND
from payloadrun_operator.api.names import (
    ANNOTATION_PREFIX,
    API_VERSION,
    DIFFBASE_KEY,
    FIELD_MANAGER,
    LABEL_MANAGED_BY,
    LABEL_RUN,
)
from payloadrun_operator.observed import queue
from payloadrun_operator.observed.watching import Reflector, WatchSettings, backoff
from payloadrun_operator.platform.kube import KubeApiError
from payloadrun_operator.platform.runtime import Operator

log = logging.getLogger("payloadrun.following")
RunKey = tuple[str, str]  # (namespace, name)
ChildKey = tuple[str, str, str]  # (namespace, kind, name)
DIFFBASE_ANNOTATION = f"{ANNOTATION_PREFIX}/{DIFFBASE_KEY}"
# A list's items carry no apiVersion: each cached object gets its kind's.
API_VERSIONS = {k.kind: k.api_version for k in (RUN, *FOLLOWED)}
# Deletions remembered (the latest), so that a write's answer older than its object's deletion
# cannot bring it back into the cache. A race of milliseconds: a few thousand are plenty.
TOMBSTONES = 4096


# What the status, the reconcile and a run's end read of a child's spec: whether it has pods,
# how many it wants, its failure limit. The rest (its pod template first) stays out of the cache.
CHILD_SPEC_FIELDS = frozenset({"replicas", "parallelism", "completions", "suspend", "backoffLimit"})
DROPPED_METADATA = frozenset({"managedFields", "ownerReferences"})  # nothing cached reads them
SHORT = 64  # strings up to this long are interned: keys, label values, phases, reasons


# A run's pod templates (each component's ``template``, the inference workers' ``workerTemplate``)
TEMPLATE_FIELDS = frozenset({"template", "workerTemplate"})


def without_template(section: Any) -> Any:
    if isinstance(section, Mapping) and not TEMPLATE_FIELDS.isdisjoint(section):
        return {k: v for k, v in section.items() if k not in TEMPLATE_FIELDS}
    return section


def controlled_elsewhere(obj: Mapping[str, Any]) -> bool:
    """Whether ``obj``'s controller is something other than a PayloadRun. The follower lists
    and watches children by the managed-by label, and LeaderWorkerSet copies its own labels
    (the run's) onto the StatefulSets it makes (``<run>-vllm``, its leaders, controlled by the
    LeaderWorkerSet; ``<run>-vllm-<group>``, each group's workers, controlled by the group's
    leader pod): those are LeaderWorkerSet's, not the run's, and stay out of the cache. A child
    with no controller (a managed claim the run keeps, deletionPolicy Retain) is the run's."""
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("controller") and (ref.get("apiVersion"), ref.get("kind")) != (
            API_VERSION,
            KIND,
        ):
            return True
    return False


def compact(value: Any) -> Any:
    """``value`` with every key and short string interned: the thousand runs and four thousand
    children of a large cache spell the same keys, labels and reasons, each once in memory."""
    if isinstance(value, Mapping):
        return {sys.intern(k): compact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [compact(v) for v in value]
    if isinstance(value, str) and len(value) <= SHORT:
        return sys.intern(value)
    return value


def slim(obj: Mapping[str, Any]) -> dict[str, Any]:
    """``obj`` without what the status never reads, compacted (:func:`compact`): managed fields
    and owner references, kopf's copy of the spec in an annotation, a run's components' pod
    templates (four fifths of the example's run; what needs them reads the run itself), and of
    a child's spec all but :data:`CHILD_SPEC_FIELDS`."""
    meta = {k: v for k, v in obj["metadata"].items() if k not in DROPPED_METADATA}
    annotations = meta.get("annotations")
    if annotations and DIFFBASE_ANNOTATION in annotations:
        meta["annotations"] = {k: v for k, v in annotations.items() if k != DIFFBASE_ANNOTATION}
    slimmed = {**obj, "metadata": meta}
    spec = obj.get("spec")
    if isinstance(spec, Mapping):
        if obj.get("kind") == KIND:
            slimmed["spec"] = {k: without_template(v) for k, v in spec.items()}
        else:
            slimmed["spec"] = {k: v for k, v in spec.items() if k in CHILD_SPEC_FIELDS}
    return compact(slimmed)


def newer(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether ``a`` is a later version of the object than ``b``. resourceVersions are opaque,
    but etcd's are integers that only grow; anything else counts as newer."""
    ra, rb = a["metadata"].get("resourceVersion", ""), b["metadata"].get("resourceVersion", "")
    if ra.isdigit() and rb.isdigit():
        return int(ra) > int(rb)
    return ra != rb


def older(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether ``a`` is known to be an earlier version of the object than ``b`` (etcd's integer
    resourceVersions; with opaque ones nothing is known, and nothing is older)."""
    ra, rb = a["metadata"].get("resourceVersion", ""), b["metadata"].get("resourceVersion", "")
    return ra.isdigit() and rb.isdigit() and int(ra) < int(rb)


def owner_of(kind: str, obj: Mapping[str, Any]) -> RunKey | None:
    """The run an object's status concerns: the run itself, or the run a child is labelled
    with (None for an object of no run)."""
    meta = obj["metadata"]
    if kind == KIND:
        return meta["namespace"], meta["name"]
    run = (meta.get("labels") or {}).get(LABEL_RUN)
    return (meta["namespace"], run) if run else None


class Cache:
    """The runs and their children, as the watches last delivered them."""

    def __init__(self) -> None:
        self.runs: dict[RunKey, dict[str, Any]] = {}
        self.children: dict[ChildKey, dict[str, Any]] = {}
        # key -> the object as it was deleted (its metadata only), the latest TOMBSTONES
        self._deleted: OrderedDict[Any, dict[str, Any]] = OrderedDict()

    def put(self, kind: str, obj: Mapping[str, Any], *, deleted: bool = False) -> RunKey | None:
        """Record an event's object (or its deletion), or what a write returned; the run it
        concerns. A version older than the one cached, or than the object's deletion, is
        ignored: events come in order, but a write's answer may come before or after its own
        event, or another's."""
        meta = obj["metadata"]
        ns, name = meta["namespace"], meta["name"]
        if kind != KIND and controlled_elsewhere(obj):
            return None  # another controller's object, with the run's labels (not its child)
        store: dict[Any, dict[str, Any]]
        key: Any
        if kind == KIND:
            store, key = self.runs, (ns, name)
        else:
            store, key = self.children, (ns, kind, name)
        if deleted:
            store.pop(key, None)
            self._deleted[key] = {"metadata": {"resourceVersion": meta.get("resourceVersion", "")}}
            self._deleted.move_to_end(key)
            if len(self._deleted) > TOMBSTONES:
                self._deleted.popitem(last=False)
        else:
            cached, gone = store.get(key), self._deleted.get(key)
            if (cached is not None and older(obj, cached)) or (gone and older(obj, gone)):
                return owner_of(kind, obj)
            self._deleted.pop(key, None)
            store[key] = slim({**obj, "apiVersion": API_VERSIONS[kind], "kind": kind})
        return owner_of(kind, obj)

    def deleted(self, kind: str, obj: Mapping[str, Any]) -> bool:
        """Whether ``obj`` (a run or a child, as some event or read gave it) was deleted since:
        its deletion is remembered, and not older than it."""
        meta = obj["metadata"]
        key = (
            (meta["namespace"], meta["name"])
            if kind == KIND
            else (meta["namespace"], kind, meta["name"])
        )
        gone = self._deleted.get(key)
        return gone is not None and not older(gone, obj)

    def replace(
        self, kind: str, namespace: str | None, listed: Iterable[Mapping[str, Any]]
    ) -> set[RunKey]:
        """Make the cache of ``kind`` in ``namespace`` (None: every namespace) what a list
        returned, keeping what a watch event brought later; the runs concerned."""
        store: dict[Any, dict[str, Any]] = self.runs if kind == KIND else self.children
        listed_keys: set[Any] = set()
        touched: set[RunKey] = set()
        for obj in listed:
            if kind != KIND and controlled_elsewhere(obj):
                continue  # not the run's child: see put
            meta = obj["metadata"]
            key = (
                (meta["namespace"], meta["name"])
                if kind == KIND
                else (meta["namespace"], kind, meta["name"])
            )
            listed_keys.add(key)
            cached = store.get(key)
            if cached is None or newer(obj, cached):
                self.put(kind, obj)
            run = owner_of(kind, obj)
            if run:
                touched.add(run)
        for key in [
            k
            for k in store
            if (namespace is None or k[0] == namespace) and (kind == KIND or k[1] == kind)
        ]:
            if key not in listed_keys:
                run = owner_of(kind, store.pop(key))
                if run:
                    touched.add(run)
        return touched


def _report_end(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("following the runs' status stopped", exc_info=task.exception())


class Follower:
    """The cache of the runs and their children, filled by one list of each kind, then kept by
    the watches; every event that concerns a run is told to ``notify`` (the work queue's add:
    :mod:`platform.workqueue`) with whether it owes the run its spec side
    (:func:`child_event_requeues`)."""

    def __init__(self, op: Operator, *, resync_seconds: float | None = None) -> None:
        self.op = op
        self.cache = Cache()
        self._resync = resync_seconds if resync_seconds is not None else op.settings.resync_seconds
        self._tasks: list[asyncio.Task[None]] = []
        # told of every run an event concerns, and whether it owes the run its spec side
        self.notify: Callable[[RunKey, bool], None] = _nobody
        self.reflectors: list[Reflector] = []  # the children's watches, once synced
        self.synced = asyncio.Event()

    # -- the watches' side --
    def observe(self, kind: str, event: Mapping[str, Any]) -> None:
        """A raw watch event (kopf's ``event``: its ``type`` and ``object``): into the cache, and
        its run told. Called in the event loop (async handlers: kopf runs sync ones on threads,
        and the cache is not thread-safe)."""
        obj = event.get("object")
        if not isinstance(obj, Mapping) or "metadata" not in obj:
            return
        run = self.cache.put(kind, obj, deleted=event.get("type") == "DELETED")
        if run is not None:
            self.notify(run, False)

    def observe_child(self, kind: Kind, event: Mapping[str, Any]) -> None:
        """A watch event of one of the operator's children (:mod:`watching`): into the cache
        (:meth:`observe`), its run told, with its spec side owed when the event calls for it
        (:func:`child_event_requeues`)."""
        obj = event.get("object")
        if not isinstance(obj, Mapping) or "metadata" not in obj:
            return  # observe would drop it too
        meta = obj["metadata"]
        key = (meta.get("namespace", ""), kind.kind, meta.get("name", ""))
        before = self.cache.children.get(key)
        run = self.cache.put(kind.kind, obj, deleted=event.get("type") == "DELETED")
        after = self.cache.children.get(key)
        if run is not None:
            self.notify(run, child_event_requeues(kind, event.get("type"), before, after))

    # -- the pass's side --
    def live(self, kind: str, namespace: str, name: str) -> tuple[bool, dict[str, Any] | None]:
        """``(True, the child as cached, or None when it does not exist)`` once the cache is
        synced; ``(False, None)`` before (the caller asks the API server instead). Only the
        kinds the follower watches (:data:`kinds.CHILD_KINDS`), without pod templates. An add-on's
        kind the cluster does not serve has nothing to cache: (True, None)."""
        if not self.synced.is_set():
            return False, None
        return True, self.cache.children.get((namespace, kind, name))

    def wrote(self, obj: Mapping[str, Any]) -> None:
        """Record what the API server answered to a write of a child the follower watches (the
        object as written), so that the next pass sees it before its watch event."""
        kind, meta = obj.get("kind"), obj.get("metadata") or {}
        # only what the watches also deliver: an object they miss would stay as written
        watched = (meta.get("labels") or {}).get(LABEL_MANAGED_BY) == FIELD_MANAGER
        if kind in API_VERSIONS and kind != KIND and watched:
            self.cache.put(kind, obj)

    # -- its life --
    def start(
        self, namespaces: Sequence[str], notify: Callable[[RunKey, bool], None] | None = None
    ) -> None:
        """List the runs and their children, then follow the children's watches, telling
        ``notify`` of every run an event concerns (and every cached run each resync)."""
        self.notify = notify or _nobody
        task = asyncio.create_task(self._run(namespaces))
        task.add_done_callback(_report_end)
        self._tasks.append(task)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def _run(self, namespaces: Sequence[str]) -> None:
        await self.op.client.logged_in()  # started by a startup handler, before kopf logs in
        await self.sync(namespaces)
        tasks = [asyncio.create_task(reflector.run()) for reflector in self.reflectors]
        try:
            while True:
                await asyncio.sleep(self._resync)
                for run in list(self.cache.runs):
                    self.notify(run, False)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def followed(self) -> list[tuple[str, str]]:
        """The kinds of child the follower lists, as (apiVersion, kind): those the status reads
        (:data:`kinds.CHILD_KINDS`) whose API the cluster served at start (an add-on's may be
        missing: :mod:`platform.discovery`)."""
        return [(k.api_version, k.kind) for k in self._followed_kinds()]

    def _followed_kinds(self) -> list[Kind]:
        discovery = self.op.discovery
        return [k for k in FOLLOWED if not k.optional or discovery.serves(k)]

    def _listed(self, kind: Kind, scope: str | None, items: list[dict[str, Any]]) -> None:
        for run in self.cache.replace(kind.kind, scope, items):
            self.notify(run, False)

    async def sync(self, namespaces: Sequence[str]) -> None:
        """One list of the runs and of every kind the status reads (each kind's, where its
        watch starts), retried until it works."""
        scopes: Sequence[str | None] = namespaces or (None,)
        # learnt at login, before kopf's scan (done then: this waits for it, or does it when the
        # follower runs without kopf, as in tests)
        await self.op.discovery.discover(self.op.client)
        settings = self.op.settings
        watch = WatchSettings(settings.watch_server_timeout, settings.watch_inactivity_timeout)
        self.reflectors = [
            Reflector(
                self.op.client, kind, scope, watch, listed=self._listed, observed=self.observe_child
            )
            for scope in scopes
            for kind in self._followed_kinds()
        ]
        # Every pass waits for this list: retried as soon as the reflectors retry their own
        # (a CRD just installed answers 429 "storage is (re)initializing" for a moment, and a
        # flat 5 s wait there held back every run's first pass).
        failures = 0
        while True:
            try:
                for scope in scopes:  # the runs: kopf watches them
                    listed = await self.op.client.list_objects(API_VERSION, KIND, scope)
                    for run in self.cache.replace(KIND, scope, listed):
                        self.notify(run, False)
                for reflector in self.reflectors:
                    if not reflector.version:  # listed before a failure: watched from there
                        await reflector.list()
                break
            except (KubeApiError, aiohttp.ClientError, OSError, TimeoutError) as exc:
                failures += 1
                delay = backoff(failures)
                log.warning(
                    "listing the runs and their children failed (again in %g s): %s", delay, exc
                )
                await asyncio.sleep(delay)
        self.synced.set()


def _nobody(run: RunKey, spec: bool) -> None:
    """What a follower started without a queue tells of an event: nobody (tests)."""


async def live_object(
    op: Operator, follower: Follower | None, kind: Kind, namespace: str, name: str
) -> dict[str, Any] | None:
    """A followed child as it is (None: it does not exist): the follower's copy once its cache
    is synced (watch events and the operator's own writes keep it current), else read."""
    if follower is not None:
        synced, live = follower.live(kind.kind, namespace, name)
        if synced:
            return live
    return await op.client.get(kind.api_version, kind.kind, namespace, name)


def child_event_requeues(
    kind: Kind, event_type: str | None, before: Mapping[str, Any] | None, after: Any
) -> bool:
    """Whether a child's watch event owes its run the spec side of a pass (its children
    applied), which kopf's handlers of the run never hear of: one of the run's children deleted
    (``before``: it was cached, so it was the run's and not, say, LeaderWorkerSet's), which the
    pass makes again (a live run) or leaves gone (a finished one), as controller-runtime's
    ``Owns()`` does; or a Workload whose admission changed (admitted, evicted, another flavor)."""
    if event_type == "DELETED":
        return before is not None
    return kind is WORKLOAD and queue.gate_key(before) != queue.gate_key(after)
