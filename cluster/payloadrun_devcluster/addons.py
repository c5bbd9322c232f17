"""A Kubernetes add-on's controller manager on the local node, installed as upstream installs it.

What LeaderWorkerSet (:mod:`.lws`) and Kueue (:mod:`.kueue`) share: each is a controller manager
built from the Go module proxy by ``cluster/build.sh`` into ``<cache>/bin/<name>-<v>/manager``,
beside the module's own ``config/`` tree copied from its module zip, and installed the same way:

1. the manager binary as a one-layer image (``/manager``, uid 65532 as upstream's distroless
   images have it), imported into the node's containerd; cached by the binary's hash;
2. ``kubectl apply --server-side -k`` of a kustomize overlay whose only resource is upstream's
   ``config/default``, with the changes the add-on's module lists, each for a reason of this
   machine;
3. waiting on facts: its CRDs Established, the manager's Deployment available (the readiness
   check of both passes only once their internal cert management has written the serving
   certificate and the kubelet has put it in the pod), and the webhooks answering: a server-side
   dry run of one of the add-on's objects goes through its mutating and validating webhooks, so
   it succeeds only when the API server reaches the webhook Service and trusts the CA the
   manager injected into both configurations.

Each runs as a pod, not a host process, because its webhooks are Service-backed
(``clientConfig.service``) and its cert management issues the serving certificate for
``<name>-webhook-service.<namespace>.svc``: in a pod both work exactly as upstream ships them,
while a host process would need URL-based webhook configurations and a certificate for another
name.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .binaries import BinariesMissing, cache_dir, read_versions
from .images import write_single_binary_image

if TYPE_CHECKING:  # the cluster imports nothing of this module
    from .cluster import LocalCluster

IMAGE_USER = "65532:65532"  # upstream Dockerfiles: distroless static, USER 65532:65532


class AddonError(RuntimeError):
    """An add-on could not be installed, or did not become ready."""


@dataclass(frozen=True)
class Addon:
    """What installing one add-on needs to know of it."""

    title: str  # for messages: "LeaderWorkerSet"
    name: str  # its cache directory's, state directory's and image's name: "lws"
    version_key: str  # its line in cluster/versions.env: "LWS_VERSION"
    namespace: str
    deployment: str  # the manager's Deployment, in namespace
    crds: tuple[str, ...]  # the CRDs waited on (Established) before anything else
    error: type[AddonError] = AddonError

    @property
    def image_repository(self) -> str:
        return f"localhost/payloadrun-{self.name}"

    @property
    def build_hint(self) -> str:
        return (
            f"run: bash cluster/build.sh  (it builds {self.title}'s manager at {self.version_key})"
        )


@dataclass(frozen=True)
class AddonBuild:
    """What ``cluster/build.sh`` leaves for one add-on version."""

    version: str
    manager: Path
    config: Path  # the module's config/ (kustomize), as shipped in its zip

    @property
    def default_kustomization(self) -> Path:
        return self.config / "default"


@dataclass(frozen=True)
class AddonInstall:
    """An installed add-on and how long each step took (seconds)."""

    version: str
    image: str
    timings: dict[str, float]

    @property
    def seconds(self) -> float:
        return sum(self.timings.values())


def expected_build(addon: Addon, versions: dict[str, str] | None = None) -> AddonBuild:
    """Where the build of the pinned version is, whether or not it is there."""
    version = (versions or read_versions())[addon.version_key]
    directory = cache_dir() / "bin" / f"{addon.name}-{version}"
    return AddonBuild(version, directory / "manager", directory / "config")


def find_build(addon: Addon) -> AddonBuild:
    """The built manager and its config, or :class:`BinariesMissing` saying what to run."""
    try:
        build = expected_build(addon)
    except KeyError:
        raise BinariesMissing(f"cluster/versions.env does not set {addon.version_key}") from None
    if not os.access(build.manager, os.X_OK):
        raise BinariesMissing(
            f"{addon.title}'s manager is not built: {build.manager}; {addon.build_hint}"
        )
    if not (build.default_kustomization / "kustomization.yaml").is_file():
        raise BinariesMissing(
            f"{addon.title}'s config/default is missing beside its manager ({build.config}); "
            f"{addon.build_hint}"
        )
    return build


def binary_key(binary: Path) -> str:
    digest = hashlib.sha256()
    with binary.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:12]


def image_name(addon: Addon, build: AddonBuild) -> str:
    """``localhost/payloadrun-<name>:<version>-<binary hash>``: a rebuilt binary, a new tag."""
    return f"{addon.image_repository}:{build.version}-{binary_key(build.manager)}"


def image_tarball(addon: Addon, build: AddonBuild) -> tuple[str, Path]:
    """The manager's image (name, docker-archive), made once per binary."""
    name = image_name(addon, build)
    tarball = cache_dir() / "images" / f"payloadrun-{addon.name}-{name.rsplit(':', 1)[1]}.tar"
    if not tarball.is_file():
        tarball.parent.mkdir(parents=True, exist_ok=True)
        write_single_binary_image(build.manager, "/manager", name, tarball, user=IMAGE_USER)
    return name, tarball


def relative_to(target: Path, directory: Path) -> str:
    """``target`` as a path relative to ``directory`` (``../..`` as needed): kustomize refuses
    absolute resource paths."""
    return os.path.relpath(target.resolve(), directory.resolve())


def deployment_available(deployment: dict) -> bool:
    """Whether a manager's Deployment has rolled out: its newest generation observed and every
    wanted replica updated and available."""
    spec, status = deployment.get("spec", {}), deployment.get("status", {})
    wanted = spec.get("replicas", 1)
    return (
        status.get("observedGeneration", 0) >= deployment["metadata"].get("generation", 1)
        and status.get("updatedReplicas", 0) >= wanted
        and status.get("availableReplicas", 0) >= wanted
    )


def deployment_patch(target: str, operations: Sequence[dict]) -> dict:
    """A kustomization ``patches`` entry: JSON-patch ``operations`` on the Deployment ``target``."""
    return {
        "target": {"group": "apps", "kind": "Deployment", "name": target},
        "patch": json.dumps(list(operations)),
    }


def install(
    cluster: LocalCluster,
    addon: Addon,
    build: AddonBuild | None,
    overlay: Callable[[str, str], dict],
    probe: dict,
    timeout: float = 240,
) -> AddonInstall:
    """Install ``addon`` on ``cluster`` (which runs a node) and wait until its webhooks answer;
    idempotent. ``build`` defaults to the pinned one (:func:`find_build`);
    ``overlay(base, image)`` gives the kustomization applied (``base``: upstream's config/default
    relative to it); ``probe`` is an object whose server-side dry run goes through the add-on's
    webhooks. Raises ``addon.error`` naming the step that failed, with what it saw."""
    if not cluster.with_node:
        raise addon.error(f"{addon.title} runs as a pod: the cluster needs its node (up --node)")
    build = build or find_build(addon)
    timings: dict[str, float] = {}
    began = time.monotonic()
    deadline = began + timeout

    def step(name: str) -> None:
        nonlocal began
        now = time.monotonic()
        timings[name] = round(now - began, 2)
        began = now

    image, tarball = image_tarball(addon, build)
    cluster.load_image(tarball)
    step("image")

    directory = cluster.kubeconfig.parent / addon.name  # in the cluster's state directory
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "kustomization.yaml").write_text(  # JSON is YAML
        json.dumps(overlay(relative_to(build.default_kustomization, directory), image), indent=2)
        + "\n"
    )
    applied = cluster.kubectl("apply", "--server-side", "--force-conflicts", "-k", str(directory))
    if applied.returncode != 0:
        raise addon.error(f"kubectl apply -k {directory} failed: {applied.stderr.strip()}")
    step("apply")

    for crd in addon.crds:
        cluster.wait_established(crd, timeout=max(1.0, deadline - time.monotonic()))
    step("crd_established")

    def deployment() -> dict:
        got = cluster.kubectl(
            "-n", addon.namespace, "get", "deployment", addon.deployment, "-o", "json"
        )
        return json.loads(got.stdout) if got.returncode == 0 else {}

    def log_tail() -> str:
        logs = cluster.kubectl(
            "-n", addon.namespace, "logs", f"deployment/{addon.deployment}", "--tail=20", timeout=20
        )
        return logs.stdout or logs.stderr

    wait(
        addon,
        f"deployment {addon.namespace}/{addon.deployment} available",
        lambda: bool(d := deployment()) and deployment_available(d),
        deadline,
        seen=lambda: deployment().get("status") or log_tail(),
    )
    step("manager_available")

    last = {"stderr": ""}

    def webhooks_answer() -> bool:
        result = cluster.kubectl(
            "create", "--dry-run=server", "-o", "name", "-f", "-", input=json.dumps(probe)
        )
        last["stderr"] = result.stderr.strip()
        return result.returncode == 0

    wait(
        addon,
        f"{addon.title}'s webhooks to answer a server-side dry run of a {probe['kind']}",
        webhooks_answer,
        deadline,
        seen=lambda: last["stderr"],
    )
    step("webhooks_answer")
    return AddonInstall(build.version, image, timings)


def wait(
    addon: Addon,
    what: str,
    check: Callable[[], bool],
    deadline: float,
    seen: Callable[[], object],
) -> None:
    while not check():
        if time.monotonic() > deadline:
            raise addon.error(f"timed out waiting for {what}; saw: {seen()}")
        time.sleep(0.5)  # each check is one kubectl call
