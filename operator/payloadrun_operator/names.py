"""Every name the operator gives or looks for, in one place (the role of KubeRay's ``constant.go``).

Labels, annotation prefixes, the field manager, container, volume and port names, the workload
table and the child naming rule: a rename here is one edit and a test, never a broken pod. The
environment variables the pods get are :class:`payloadrun.settings.Env` (the sidecars read the
same names), the default ports the CRD's (:mod:`payloadrun.settings`).
"""

from __future__ import annotations

from payloadrun_operator.models import GROUP, VERSION

API_VERSION = f"{GROUP}/{VERSION}"

# Who writes: server-side apply's field manager, the events' reporting component.
FIELD_MANAGER = "payloadrun-operator"
# kopf's state on each run: annotations with this prefix; the finalizer kopf would add.
ANNOTATION_PREFIX = GROUP
FINALIZER = f"{GROUP}/finalizer"
DIFFBASE_KEY = "last-handled-configuration"

# Labels on every child and pod.
APP = "payloadrun"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_RUN = f"{GROUP}/run"
MANAGED_SELECTOR = f"{LABEL_MANAGED_BY}={FIELD_MANAGER}"

# Components: each child is named <run>-<component> (see child_name).
INFERENCE = "inference"
ORCHESTRATOR = "orchestrator"
TRAINER = "trainer"
SETTINGS = "settings"
PAYLOADS = "payloads"  # the managed claim's component label
HEADLESS_SUFFIX = "-headless"

# Containers.
VLLM_CONTAINER = "vllm"
WRITER_CONTAINER = "payload-writer"
RETENTION_CONTAINER = "payload-retention"
ORCHESTRATOR_CONTAINER = ORCHESTRATOR
TRAINER_CONTAINER = TRAINER
OPERATOR_CONTAINER = "operator"  # the chart's Deployment

# Volumes and ports.
VOLUME_NAME = "payloads"
HTTP_PORT_NAME = "http"
WRITER_PORT_NAME = "writer"
WRITER_METRICS_PORT_NAME = "writer-metrics"
RETENTION_METRICS_PORT_NAME = "metrics"
TRAINER_DIST_PORT_NAME = "dist"
TRAINER_DIST_PORT = 29500  # torch.distributed's default

# The workloads a run owns, as (apiVersion, kind, component); readiness follows each of them.
WORKLOADS = (
    ("apps/v1", "StatefulSet", INFERENCE),
    ("apps/v1", "Deployment", ORCHESTRATOR),
    ("apps/v1", "StatefulSet", TRAINER),
)
# The kinds readiness lists by the managed-by label.
CHILD_KINDS = (
    ("v1", "PersistentVolumeClaim"),
    ("apps/v1", "StatefulSet"),
    ("apps/v1", "Deployment"),
)


def child_name(run: str, component: str) -> str:
    """The name of a run's child: ``<run>-<component>``."""
    return f"{run}-{component}"


def headless_name(run: str, component: str) -> str:
    return child_name(run, component + HEADLESS_SUFFIX)
