"""A role's pods: the user's pod template with the operator's parts on top, by written rules.

Pure functions. :func:`compose` takes what the user wrote (``spec.<role>.template`` and the
short fields) and what the operator adds (:class:`Parts`) and returns the pod template, or the
list of collisions: a user value is never overridden silently. The rules, as
``docs/operator.md#pod-templates`` gives them:

1. **The main container** is the one named ``vllm``, ``orchestrator`` or ``trainer``; a template
   without one gets it (first). The short fields (``image``, ``command``, ``args``,
   ``resources``, ``env``) fill it: a field the template's container sets too must be equal, and
   an env name given both ways is refused.
2. **Operator-owned names** are refused where a template uses them: the sidecars' container
   names, the operator's volume names, the operator's env names in the main container, its mount
   paths in the containers it mounts into, its labels (unless equal), the pod fields it sets
   (unless equal: ``restartPolicy``, ``subdomain``), the sidecars' ports anywhere in the pod.
3. **Merged**: ``spec.placement`` with the template's node selector (a key set both ways must
   agree), tolerations, image pull secrets and service account (both set: must agree); a main
   container port the operator declares is kept when the template declares the same number.
4. **Added unless the template has its own**: ``/dev/shm`` (not when the template mounts
   something there or sets ``hostIPC``), the payload volume's ``fsGroup`` (the run's one, see
   :func:`run_fs_group`), and in every other container of the template (init containers too)
   the run's identity (``PAYLOADRUN_RUN``, ...), each variable unless that container sets it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from payloadrun_operator.api.names import SHM_VOLUME

Manifest = dict[str, Any]

SHM_PATH = "/dev/shm"
SHORT_FIELDS = ("image", "command", "args", "resources")


class TemplateConflict(ValueError):
    """A template collides with what the operator owns; ``errors`` says each collision."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors


@dataclass(frozen=True)
class Parts:
    """What the operator adds to one role's pods (and what the role's short fields say)."""

    role: str  # inference, orchestrator or trainer: errors name spec.<role>
    main: str  # the main container's name
    short: Manifest = field(default_factory=dict)  # image, command, args, resources that are set
    short_env: tuple[Manifest, ...] = ()
    env: tuple[Manifest, ...] = ()  # the operator's, first in the main container's env
    identity: tuple[Manifest, ...] = ()  # first in every other container's, unless it sets them
    mounts: tuple[Manifest, ...] = ()  # into the main container
    ports: tuple[Manifest, ...] = ()  # declared on the main container
    sidecars: tuple[Manifest, ...] = ()  # native sidecars (initContainers, after the user's)
    volumes: tuple[Manifest, ...] = ()
    pod: Manifest = field(default_factory=dict)  # pod spec fields: absent in the template, or equal
    pod_unset: tuple[str, ...] = ()  # pod spec fields the template must not set
    labels: Mapping[str, str] = field(default_factory=dict)
    placement: Manifest = field(default_factory=dict)  # spec.placement as pod spec fields
    fs_group: int | None = None  # the run's fsGroup, when the template sets none
    shm: bool = False  # a memory-backed /dev/shm, unless the template has its own
    shm_size: str | None = None  # its size limit (default: the main container's memory limit)
    reserved_ports: Mapping[int, str] = field(default_factory=dict)  # port -> what uses it
    template_path: str = ""  # the template's field, default spec.<role>.template
    pod_names: str = ""  # how the pods are named, for errors; default <run>-<role>-<index>
    refused_env: Mapping[str, str] = field(default_factory=dict)  # name -> who sets it instead
    refused_label_prefixes: Mapping[str, str] = field(default_factory=dict)  # prefix -> who

    @property
    def where(self) -> str:
        return self.template_path or f"spec.{self.role}.template"


def containers_of(pod: Mapping[str, Any]) -> list[Manifest]:
    return [*pod.get("containers", []), *pod.get("initContainers", [])]


def compose(template: Mapping[str, Any] | None, parts: Parts) -> Manifest:
    """The pod template of ``parts.role``; raises :class:`TemplateConflict` on a collision."""
    where = parts.where
    tpl = copy.deepcopy(dict(template or {}))
    meta = tpl.get("metadata") or {}
    pod = tpl.get("spec") or {}

    labels, errors = _labels(meta, parts, where)
    out_meta: Manifest = {"labels": labels}
    if meta.get("annotations"):
        out_meta["annotations"] = dict(meta["annotations"])
    errors += _taken(pod, parts, where)

    containers = list(pod.get("containers") or [])
    index = next((i for i, c in enumerate(containers) if c.get("name") == parts.main), None)
    if index is None:
        containers.insert(0, {"name": parts.main})
        index = 0
    main = dict(containers[index])
    errors += _fill_main(main, parts, f"{where}.spec.containers[{parts.main}]")
    errors += _refused_env(pod, parts, where)
    containers = [
        c if i == index else with_identity(c, parts.identity) for i, c in enumerate(containers)
    ]
    containers[index] = main
    pod["containers"] = containers
    if pod.get("initContainers"):  # the template's own (the operator's sidecars come later)
        pod["initContainers"] = [with_identity(c, parts.identity) for c in pod["initContainers"]]

    for key in parts.pod_unset:
        if key in pod:
            errors.append(
                f"{where}.spec.{key} is set, but the operator names the {parts.role} pods (their "
                f"DNS names are {parts.pod_names or f'<run>-{parts.role}-<index>'}): remove it"
            )
    for key, value in parts.pod.items():
        if key in pod and pod[key] != value:
            errors.append(
                f"{where}.spec.{key} is {pod[key]!r}, but the operator sets {value!r} for the "
                f"{parts.role} pods: remove it"
            )
        pod[key] = value
    errors += _place(pod, parts.placement, where)
    if parts.fs_group is not None:
        security = dict(pod.get("securityContext") or {})
        security.setdefault("fsGroup", parts.fs_group)
        security.setdefault("fsGroupChangePolicy", "OnRootMismatch")
        pod["securityContext"] = security
    volumes = [*(pod.get("volumes") or []), *parts.volumes]
    if parts.shm and has_shm(pod, main) and parts.shm_size is not None:
        errors.append(
            f"spec.{parts.role}.shmSize is set, but {where} has its own {SHM_PATH} (a mount "
            "there, or hostIPC): remove one"
        )
    elif parts.shm and not has_shm(pod, main):
        if any(v.get("name") == SHM_VOLUME for v in volumes):
            errors.append(
                f"{where}.spec.volumes has a volume named {SHM_VOLUME}, which the operator adds "
                f"for {SHM_PATH}: rename it, or mount your own at {SHM_PATH}"
            )
        volumes.append(shm_volume(parts.shm_size, main))
        main["volumeMounts"] = [
            *(main.get("volumeMounts") or []),
            {"name": SHM_VOLUME, "mountPath": SHM_PATH},
        ]
    if volumes:
        pod["volumes"] = volumes
    if parts.sidecars:
        pod["initContainers"] = [*(pod.get("initContainers") or []), *parts.sidecars]
    if errors:
        raise TemplateConflict(errors)
    return {"metadata": out_meta, "spec": pod}


def with_identity(container: Manifest, identity: Iterable[Manifest]) -> Manifest:
    """``container`` told which run it belongs to: ``identity``'s variables first (so its own
    entries can refer to them as ``$(PAYLOADRUN_RUN)``), except those it sets itself, which
    stay as written."""
    own = container.get("env") or []
    taken = {e.get("name") for e in own}
    added = [dict(e) for e in identity if e["name"] not in taken]
    if not added:
        return container
    return {**container, "env": [*added, *own]}


def _refused_env(pod: Mapping[str, Any], parts: Parts, where: str) -> list[str]:
    """Env names another component sets in every container (LeaderWorkerSet's webhook), which
    would replace the template's value silently."""
    errors = []
    for container in containers_of(pod):
        for entry in container.get("env") or []:
            who = parts.refused_env.get(entry.get("name"))
            if who:
                errors.append(
                    f"{where}: container {container.get('name')} sets env {entry['name']}, "
                    f"which {who} sets in every container, replacing yours: remove it"
                )
    return errors


def _labels(meta: Mapping[str, Any], parts: Parts, where: str) -> tuple[dict[str, str], list[str]]:
    """The template's labels with the operator's (a key set both ways must agree)."""
    labels, errors = dict(meta.get("labels") or {}), []
    for key in sorted(labels):
        for prefix, who in parts.refused_label_prefixes.items():
            if key.startswith(prefix):
                errors.append(
                    f"{where}.metadata.labels sets {key}, a label {who} sets on its pods: remove it"
                )
    for key, value in parts.labels.items():
        if key in labels and labels[key] != value:
            errors.append(
                f"{where}.metadata.labels sets {key}={labels[key]!r}, a label the operator sets "
                f"to {value!r} (it selects the run's pods): remove it"
            )
        labels[key] = value
    return labels, errors


def _taken(pod: Mapping[str, Any], parts: Parts, where: str) -> list[str]:
    """The operator's container names, volume names and ports that the template uses."""
    errors = []
    taken_names = {c.get("name") for c in containers_of(pod)}
    for sidecar in parts.sidecars:
        if sidecar["name"] in taken_names:
            errors.append(
                f"{where} has a container named {sidecar['name']}, the operator's sidecar: "
                "rename it"
            )
    for name in (v["name"] for v in parts.volumes):
        if name in {v.get("name") for v in pod.get("volumes") or []}:
            errors.append(
                f"{where}.spec.volumes has a volume named {name}, which the operator adds: "
                "rename it"
            )
    return errors + _port_clashes(pod, parts, where)


def _port_clashes(pod: Mapping[str, Any], parts: Parts, where: str) -> list[str]:
    """Ports a template's containers declare that another one of the pod listens on: the
    operator's sidecars' (anywhere), its main container's (the API servers', torchrun's: in any
    other container; the main container's own declaration merges, :func:`_fill_main`), or a
    port name of the operator's. Kubernetes only warns of a duplicate port, and at run time
    one of the two cannot bind."""
    errors = []
    owned_names = {p["name"] for p in parts.ports} | {
        p["name"] for c in parts.sidecars for p in c.get("ports") or [] if p.get("name")
    }
    main_ports = {p["containerPort"]: p["name"] for p in parts.ports}
    for kind in ("containers", "initContainers"):
        for container in pod.get(kind) or []:
            name = container.get("name")
            path = f"{where}.spec.{kind}[{name}].ports"
            is_main = kind == "containers" and name == parts.main
            for port in container.get("ports") or []:
                number = port.get("containerPort")
                if not is_main and port.get("name") in owned_names:
                    errors.append(
                        f"{path}: container {name} names a port {port['name']}, the name of one "
                        "of the operator's ports in the same pod (port names are unique in a "
                        "pod): rename it"
                    )
                if not is_main and number in main_ports:
                    errors.append(
                        f"{path}: container {name} declares port {number}, the port of "
                        f"{main_ports[number]} in the main container {parts.main} of the same "
                        "pod (one of the two could not bind it): use another port"
                    )
                if number in parts.reserved_ports:
                    errors.append(
                        f"{path}: container {name} declares port {number}, which the "
                        f"{parts.reserved_ports[number]} listens on in the same pod: use another "
                        "port (or change the operator's in the spec)"
                    )
    return errors


def _fill_main(main: Manifest, parts: Parts, where: str) -> list[str]:
    errors = []
    short_where = f"spec.{parts.role}"
    for key in SHORT_FIELDS:
        if key not in parts.short:
            continue
        value = parts.short[key]
        if main.get(key) not in (None, [], {}) and main[key] != value:
            errors.append(
                f"{short_where}.{key} and {where}.{key} are both set, to different values: "
                "set it in one place"
            )
        main[key] = value
    if not main.get("image"):
        errors.append(
            f"{short_where} needs an image: set {short_where}.image, or give the container "
            f"named {parts.main} in {short_where}.template an image"
        )
    user_env = [*(main.get("env") or []), *parts.short_env]
    names = [e.get("name") for e in user_env]
    for name in sorted({n for n in names if names.count(n) > 1}):
        errors.append(
            f"the {parts.main} container's env names {name} more than once ({short_where}.env "
            f"and {short_where}.template): keep one"
        )
    owned = {e["name"] for e in parts.env}
    for name in sorted(owned & set(names)):
        errors.append(
            f"{short_where} sets env {name} in the {parts.main} container, which the operator "
            "sets itself (docs/operator.md#what-every-pod-learns): remove it"
        )
    main["env"] = [*parts.env, *user_env]

    mounts = list(main.get("volumeMounts") or [])
    for mount in parts.mounts:
        clash = next((m for m in mounts if m.get("mountPath") == mount["mountPath"]), None)
        if clash is not None:
            errors.append(
                f"{where} mounts {clash.get('name')} at {mount['mountPath']}, where the "
                f"operator mounts {mount['name']}: mount it elsewhere"
            )
    if parts.mounts:
        main["volumeMounts"] = [*mounts, *parts.mounts]

    ports = list(main.get("ports") or [])
    for port in parts.ports:
        same = [p for p in ports if p.get("containerPort") == port["containerPort"]]
        named = [p for p in ports if p.get("name") == port["name"]]
        if named and not same:
            errors.append(
                f"{where} names port {named[0].get('containerPort')} {port['name']}, the name "
                f"of the operator's port {port['containerPort']}: rename it"
            )
        if not same:
            ports.append(port)
    if ports:
        main["ports"] = ports
    return errors


def _place(pod: Manifest, placement: Mapping[str, Any], where: str) -> list[str]:
    """``spec.placement`` merged into the pod spec (refusing a value set both ways to differ)."""
    errors = []
    selector = dict(pod.get("nodeSelector") or {})
    for key, value in (placement.get("nodeSelector") or {}).items():
        if key in selector and selector[key] != value:
            errors.append(
                f"{where}.spec.nodeSelector sets {key}={selector[key]!r} but "
                f"spec.placement.nodeSelector sets {value!r}: keep one"
            )
        selector.setdefault(key, value)
    if selector:
        pod["nodeSelector"] = selector
    for key in ("tolerations", "imagePullSecrets"):
        merged = list(pod.get(key) or [])
        merged += [item for item in placement.get(key) or [] if item not in merged]
        if merged:
            pod[key] = merged
    account = placement.get("serviceAccountName")
    if account:
        if pod.get("serviceAccountName") not in (None, account):
            errors.append(
                f"{where}.spec.serviceAccountName is {pod['serviceAccountName']!r} but "
                f"spec.placement.serviceAccountName is {account!r}: keep one"
            )
        pod["serviceAccountName"] = account
    return errors


def shm_volume(size: str | None, main: Mapping[str, Any]) -> Manifest:
    """A memory-backed /dev/shm of ``size``, else of the main container's memory limit (however
    it was set), else with no limit of its own (the node's memory, within the pod's limits)."""
    limits = (main.get("resources") or {}).get("limits") or {}
    limit = size if size is not None else limits.get("memory")
    empty_dir: Manifest = {"medium": "Memory"}
    if limit is not None:
        empty_dir["sizeLimit"] = str(limit)
    return {"name": SHM_VOLUME, "emptyDir": empty_dir}


def has_shm(pod: Mapping[str, Any], main: Mapping[str, Any]) -> bool:
    """Whether the pod already has its own /dev/shm (a mount there, or the host's IPC)."""
    mounted = any(m.get("mountPath") == SHM_PATH for m in main.get("volumeMounts") or [])
    return mounted or bool(pod.get("hostIPC"))


def template_fs_groups(templates: Mapping[str, Mapping[str, Any] | None]) -> dict[str, int]:
    """The fsGroup each template sets, by its key (the template's field path)."""
    found = {}
    for role, template in templates.items():
        security = ((template or {}).get("spec") or {}).get("securityContext") or {}
        if security.get("fsGroup") is not None:
            found[role] = int(security["fsGroup"])
    return found


def run_fs_group(
    templates: Mapping[str, Mapping[str, Any] | None], default: int
) -> tuple[int, list[str]]:
    """The one fsGroup of a by-handle run's pods: the templates' (``templates``: by field path,
    :meth:`RunContext.template_sources`; all that set one must agree) or ``default`` (the
    sidecars' uid). The volume's group is changed to a pod's fsGroup when the
    pod starts (on volumes whose driver manages ownership): pods of one run that disagree would
    change it back and forth on a volume they share."""
    found = template_fs_groups(templates)
    values = sorted(set(found.values()))
    if len(values) > 1:
        which = ", ".join(f"{path} {gid}" for path, gid in sorted(found.items()))
        return default, [
            f"the pod templates set different securityContext.fsGroup values ({which}): the "
            "pods of a run share its payload volume, whose group each pod would change at its "
            "start: set one value in every template that sets one"
        ]
    return (values[0] if values else default), []


def read_only_overlays(
    pod: Mapping[str, Any], claim: str, volume_name: str, mount_path: str, root: str
) -> tuple[list[tuple[str, int, Manifest]], list[str]]:
    """Mounts that make the payload root read-only in every container of ``pod`` (init
    containers too) that mounts the payload claim read-write above it, as ``(list, index,
    mount)``; and what makes that impossible (a mount of the root itself read-write, a
    ``subPathExpr`` the operator cannot resolve): refused.

    Each overlay mounts the root alone (``subPath``) read-only at the path where the container
    sees it: the kernel refuses writes and deletes there even to root, while the rest of the
    read-write mount (the run directory) stays writable.
    """
    claim_volumes = {
        v["name"]
        for v in pod.get("volumes") or []
        if (v.get("persistentVolumeClaim") or {}).get("claimName") == claim
    } | {volume_name}
    relative_root = root[len(mount_path) :].strip("/")
    overlays, errors = [], []
    for kind, index, container in _indexed_containers(pod):
        name, mounts = container.get("name"), container.get("volumeMounts") or []
        for mount in mounts:
            if mount.get("name") not in claim_volumes or mount.get("readOnly"):
                continue
            if mount.get("subPathExpr"):
                errors.append(
                    f"container {name} mounts the payload volume read-write with subPathExpr "
                    f"(at {mount['mountPath']}): the operator cannot tell where the payload "
                    "root is there to make it read-only; use subPath, mount it read-only, or "
                    "set spec.trainer.payloadAccess to ReadWrite"
                )
                continue
            sub = (mount.get("subPath") or "").strip("/")
            if sub and not (relative_root == sub or relative_root.startswith(sub + "/")):
                continue
            inside = relative_root[len(sub) :].strip("/")
            seen_at = mount["mountPath"].rstrip("/") + ("/" + inside if inside else "")
            if not inside:
                errors.append(
                    f"container {name} mounts the payload root {root} read-write (at "
                    f"{mount['mountPath']}): set spec.trainer.payloadAccess to ReadWrite if "
                    "the trainers may write and delete payload files"
                )
                continue
            if any(m.get("mountPath") == seen_at for m in mounts):
                continue
            overlay = {
                "name": volume_name,
                "mountPath": seen_at,
                "subPath": relative_root,
                "readOnly": True,
            }
            overlays.append((kind, index, overlay))
    return overlays, errors


def _indexed_containers(pod: Mapping[str, Any]) -> Iterable[tuple[str, int, Manifest]]:
    """``(list, index, container)`` of every container of ``pod``, init containers too."""
    for kind in ("containers", "initContainers"):
        for index, container in enumerate(pod.get(kind) or []):
            yield kind, index, container


def with_overlays(pod: Manifest, overlays: Iterable[tuple[str, int, Manifest]]) -> Manifest:
    out = {**pod}
    for kind, index, mount in overlays:
        containers = [dict(c) for c in out[kind]]
        containers[index]["volumeMounts"] = [*containers[index].get("volumeMounts", []), mount]
        out[kind] = containers
    return out
