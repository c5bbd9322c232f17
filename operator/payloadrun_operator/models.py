"""The PayloadRun resource as pydantic models: the one source of truth for the CRD's schema.

Field names are the CRD's (camelCase aliases), bounds and defaults are the schema's, and the CEL
rules that the API server enforces ride along in ``json_schema_extra`` (see :mod:`crd`). The
operator parses every body it handles through these models, so a cluster without CEL still gets
the same checks (:mod:`validation`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from payloadrun import settings as sidecar

GROUP = "payloadrun.dev"
VERSION = "v1alpha1"
KIND = "PayloadRun"
PLURAL = "payloadruns"
SINGULAR = "payloadrun"
SHORT_NAMES = ("prun",)
# Children are named <run>-<component>-headless (up to 19 more characters) and Service names are
# DNS labels of at most 63; StatefulSet pods add an ordinal and a revision hash besides.
MAX_NAME_LENGTH = 40
NAME_LENGTH_MESSAGE = (
    f"metadata.name must have at most {MAX_NAME_LENGTH} characters: the run's children are "
    "named after it and Kubernetes limits their names"
)

DISAGGREGATED_BY_HANDLE_MESSAGE = (
    "payloads by handle cannot be combined with prefill/decode-disaggregated inference: the P/D "
    "router does not stitch by-handle routing segments. Set spec.payloads.mode to Auto or Inline "
    "and remove spec.payloads.root, or turn off spec.inference.disaggregated"
)

Name = Annotated[str, Field(min_length=1, max_length=253)]
Quantity = Annotated[int | str, Field(json_schema_extra={"x-kubernetes-int-or-string": True})]
Port = Annotated[int, Field(ge=1, le=65535)]


def _preserve(description: str) -> Any:
    """A Kubernetes core type passed through as is (the API server validates it in the pod)."""
    return Field(
        default=None,
        description=description,
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class DeploymentType(StrEnum):
    MULTI_NODE = "MultiNode"
    SINGLE_NODE = "SingleNode"


class PayloadModeSetting(StrEnum):
    AUTO = "Auto"
    BY_HANDLE = "ByHandle"
    INLINE = "Inline"


class DeletionPolicy(StrEnum):
    DELETE = "Delete"
    RETAIN = "Retain"


class EnvVar(Model):
    name: Annotated[str, Field(min_length=1, max_length=256)]
    value: str | None = Field(default=None, description="The value (or use valueFrom).")
    value_from: dict[str, Any] | None = _preserve("a core/v1 EnvVarSource")


class Resources(Model):
    limits: dict[str, Quantity] | None = Field(default=None, description="e.g. nvidia.com/gpu: 8")
    requests: dict[str, Quantity] | None = Field(default=None, description="e.g. cpu: 16")


class Volume(Model):
    """The shared ReadWriteMany volume: an existing claim, or one the operator manages."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!(has(self.claimName) && (has(self.size) || "
                    "has(self.storageClassName)))",
                    "message": "set either volume.claimName (an existing ReadWriteMany claim) "
                    "or volume.size and volume.storageClassName (a claim the operator "
                    "manages), not both",
                },
                {
                    "rule": "has(self.claimName) == has(oldSelf.claimName) && "
                    "(!has(self.claimName) || self.claimName == oldSelf.claimName)",
                    "message": "volume.claimName cannot change after creation: the payload "
                    "root lives on that claim; create a new PayloadRun instead",
                },
                {
                    "rule": "has(self.storageClassName) == has(oldSelf.storageClassName) && "
                    "(!has(self.storageClassName) || "
                    "self.storageClassName == oldSelf.storageClassName)",
                    "message": "volume.storageClassName cannot change after creation",
                },
            ]
        }
    )

    claim_name: Name | None = Field(
        default=None, description="Use this existing ReadWriteMany claim instead of a managed one."
    )
    size: Quantity | None = Field(
        default=None, description="Size of the managed claim (default 100Gi)."
    )
    storage_class_name: Name | None = Field(
        default=None,
        description="Storage class of the managed claim; it must support ReadWriteMany "
        "(NFS, CephFS, EFS, Filestore, ...).",
    )
    deletion_policy: DeletionPolicy = Field(
        default=DeletionPolicy.DELETE,
        description="Delete the managed claim with the run, or Retain it (a run of the same "
        "name adopts it again).",
    )


class Payloads(Model):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.root) || self.root.startsWith(self.mountPath + '/')",
                    "message": "payloads.root must be a directory under payloads.mountPath",
                },
            ]
        }
    )

    mode: PayloadModeSetting = Field(
        default=PayloadModeSetting.AUTO,
        description="Auto: by handle when router replay or sampling-mask capture is on, the run "
        "is multi-node and inference is not disaggregated; inline otherwise.",
    )
    root: Annotated[str, Field(max_length=1024, pattern=r"^/")] | None = Field(
        default=None,
        description="Payload root set by hand (default <mountPath>/<namespace>/<name>/payloads).",
    )
    mount_path: Annotated[str, Field(max_length=512, pattern=r"^/[^\s]*[^/\s]$")] = Field(
        default="/payloads", description="Where the shared volume is mounted in every pod."
    )
    volume: Volume = Field(default_factory=Volume, description=Volume.__doc__)


class Writer(Model):
    """Overrides for the writer sidecar beside each vLLM container."""

    image: Name | None = Field(default=None, description="Default: the operator's sidecar image.")
    resources: Resources | None = Field(default=None, description="Default: the operator's.")
    port: Port = Field(
        default=sidecar.WRITER_PORT, description="Port the orchestrator talks to (the Service's)."
    )
    metrics_port: Port = Field(
        default=sidecar.WRITER_METRICS_PORT, description="Prometheus /metrics."
    )
    args: list[str] = Field(default_factory=list, description="Extra writer flags.")


class Retention(Model):
    """Overrides for the retention sidecar beside the orchestrator."""

    image: Name | None = Field(default=None, description="Default: the operator's sidecar image.")
    resources: Resources | None = Field(default=None, description="Default: the operator's.")
    port: Port = Field(
        default=sidecar.RETENTION_PORT, description="HTTP API on the pod's loopback."
    )
    metrics_port: Port = Field(
        default=sidecar.RETENTION_METRICS_PORT,
        description="Prometheus /metrics, /healthz, /readyz.",
    )
    workers: Annotated[int, Field(ge=1, le=256)] = Field(
        default=sidecar.RETENTION_WORKERS, description="Unlink threads."
    )
    scan_interval_seconds: Annotated[int, Field(ge=1, le=86400)] = Field(
        default=sidecar.RETENTION_SCAN_INTERVAL_S,
        description="Seconds between scans that correct the size metrics.",
    )
    args: list[str] = Field(default_factory=list, description="Extra retention flags.")


class Inference(Model):
    replicas: Annotated[int, Field(ge=1, le=1024)] = Field(default=1, description="vLLM pods.")
    disaggregated: bool = Field(
        default=False, description="Prefill/decode-disaggregated inference behind a P/D router."
    )
    image: Name = Field(description="The vLLM image.")
    command: list[str] | None = Field(default=None, description="Default: the image's.")
    args: list[str] = Field(
        default_factory=list,
        description="vLLM's flags; by handle, vLLM needs --enable-return-routed-experts and, for "
        "the tokens-in generate endpoint, --enable-scale-out.",
    )
    env: list[EnvVar] = Field(default_factory=list, description="Extra environment.")
    resources: Resources | None = None
    port: Port = Field(default=sidecar.VLLM_PORT, description="vLLM's HTTP port.")
    writer: Writer = Field(default_factory=Writer, description=Writer.__doc__)


class Orchestrator(Model):
    image: Name = Field(description="The orchestrator's image (prime-rl's, or yours).")
    command: list[str] | None = Field(default=None, description="Default: the image's.")
    args: list[str] = Field(default_factory=list)
    env: list[EnvVar] = Field(default_factory=list, description="Extra environment.")
    resources: Resources | None = None
    retention: Retention = Field(default_factory=Retention, description=Retention.__doc__)


class Trainer(Model):
    replicas: Annotated[int, Field(ge=1, le=4096)] = Field(default=1, description="Trainer pods.")
    image: Name = Field(description="The trainer's image.")
    command: list[str] | None = Field(default=None, description="Default: the image's.")
    args: list[str] = Field(default_factory=list)
    env: list[EnvVar] = Field(default_factory=list, description="Extra environment.")
    resources: Resources | None = None


class LocalObjectReference(Model):
    name: Name


class Placement(Model):
    """Pod placement shared by every workload of the run."""

    node_selector: dict[str, str] | None = None
    tolerations: list[dict[str, Any]] | None = Field(
        default=None,
        description="core/v1 Tolerations",
        json_schema_extra={"items": {"x-kubernetes-preserve-unknown-fields": True}},
    )
    service_account_name: Name | None = None
    image_pull_secrets: list[LocalObjectReference] | None = None


class PayloadRunSpec(Model):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!(self.inference.disaggregated && "
                    "(self.payloads.mode == 'ByHandle' || has(self.payloads.root)))",
                    "message": DISAGGREGATED_BY_HANDLE_MESSAGE,
                }
            ]
        }
    )

    deployment_type: DeploymentType = Field(
        default=DeploymentType.MULTI_NODE,
        description="MultiNode when inference, orchestrator and trainers run on separate nodes.",
    )
    router_replay: bool = Field(default=False, description="MoE router replay: routed expert ids.")
    sampling_mask_capture: bool = Field(
        default=False, description="Capture the ids that survived top-k/top-p per token."
    )
    max_off_policy_steps: Annotated[int, Field(ge=0, le=1024)] = Field(
        default=sidecar.MAX_OFF_POLICY_STEPS,
        description="How many policy versions a rollout may lag.",
    )
    max_steps: Annotated[int, Field(ge=1, le=10_000_000)] | None = Field(
        default=None, description="Batches past this step are never trained: their files go."
    )
    resume: bool = Field(default=False, description="Resume: keep the payload root's files.")
    payloads: Payloads = Field(
        default_factory=Payloads, description="How per-token payloads move, and where."
    )
    inference: Inference = Field(description="The vLLM servers (the writer sidecar beside each).")
    orchestrator: Orchestrator = Field(description="The orchestrator (retention sidecar beside).")
    trainer: Trainer = Field(description="The trainers (the payload volume read-only).")
    placement: Placement = Field(
        default_factory=Placement, description="Pod placement shared by every workload."
    )


class Condition(Model):
    type: str
    status: str
    reason: str
    message: str
    last_transition_time: str | None = None
    observed_generation: int | None = None


class PayloadRunStatus(Model):
    observed_generation: int | None = None
    phase: str | None = None
    payload_mode: str | None = None
    payload_mode_reason: str | None = None
    payload_mode_message: str | None = None
    payload_root: str | None = None
    claim_name: str | None = None
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )
