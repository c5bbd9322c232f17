"""The PayloadRun resource as pydantic models: the one source of truth for the CRD's schema.

Field names are the CRD's (camelCase aliases), bounds and defaults are the schema's, and the CEL
rules that the API server enforces ride along in ``json_schema_extra`` (see :mod:`crd`). The
operator parses every body it handles through these models, so a cluster without CEL still gets
the same checks (:mod:`validation`).
"""

from __future__ import annotations

import ipaddress
import re
from enum import StrEnum
from typing import Annotated, Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator, model_validator
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

ROOT_OUTSIDE_MOUNT_MESSAGE = (
    "spec.payloads.root must be a directory under the payload volume's mount path: "
    "spec.payloads.mountPath (default /payloads), or spec.runDirectory.mountPath when the run "
    "directory is the payload volume"
)
TWO_MOUNT_PATHS_MESSAGE = (
    "spec.payloads.mountPath and spec.runDirectory.mountPath differ, but the run directory is the "
    "payload volume (spec.runDirectory.claimName is not set): it is mounted at one path in "
    "every container, since segments name payload files by absolute path. Remove "
    "spec.payloads.mountPath, or set it to spec.runDirectory.mountPath"
)
# CEL: the run directory is the payload volume (it names no claim of its own).
RUN_DIRECTORY_ON_PAYLOAD_VOLUME = "(has(self.runDirectory) && !has(self.runDirectory.claimName))"

Name = Annotated[str, Field(min_length=1, max_length=253)]
Quantity = Annotated[int | str, Field(json_schema_extra={"x-kubernetes-int-or-string": True})]
Port = Annotated[int, Field(ge=1, le=65535)]
MountPath = Annotated[str, Field(max_length=512, pattern=r"^/[^\s]*[^/\s]$")]
DEFAULT_MOUNT_PATH = "/payloads"
Generation = Annotated[int, Field(ge=0, json_schema_extra={"format": "int64"})]

# metav1.Condition's rules (k8s.io/apimachinery/pkg/apis/meta/v1/types.go), so a condition this
# CRD accepts is one every Kubernetes tool reads.
CONDITION_TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
MAX_CONDITION_MESSAGE = 32768

RUN_DESCRIPTION = (
    "A multi-node RL run (vLLM inference, an orchestrator, trainers) and how its per-token "
    "payloads, MoE routed expert ids and sampling masks, move: inline in the HTTP responses, or "
    "by handle through files on a shared ReadWriteMany volume that the operator provisions."
)


def _preserve(description: str) -> Any:
    """A Kubernetes core type passed through as is (the API server validates it in the pod)."""
    return Field(
        default=None,
        description=description,
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


# Marks a field whose schema is Kubernetes' PodTemplateSpec (crd.py puts it in: kubeschema.py).
POD_TEMPLATE_MARKER = "x-payloadrun-pod-template"
# Marks a field added after the first release: its default is the model's only, none in the CRD
# (crd.py drops it). The API server writes a CRD's defaults into every run it serves, so the
# operator of the release before, which does not know the field, would read each live run as an
# invalid spec (Rejected) while the two run side by side during `helm upgrade` (seen from 0.1.0:
# tests/integration/test_upgrade.py). Absent means the default, in the CEL rules too
# (:func:`given_or`); tests/operator/test_crd_upgrades.py holds it against the previous release.
NO_CRD_DEFAULT = "x-payloadrun-no-crd-default"
ADDED_AFTER_RELEASE = {NO_CRD_DEFAULT: True}


def given_or(field: str, default: str, obj: str = "self") -> str:
    """A CEL expression of ``obj.field``, or ``default`` (CEL) where the run leaves it out."""
    return f"(has({obj}.{field}) ? {obj}.{field} : {default})"


# The marker's value for a template the CRD stores as a plain object and the operator checks
# against the same schema (schema_check.py), to keep the CRD under etcd's 1.5 MiB.
CHECKED_BY_OPERATOR = "operator"


def _pod_template(role: str, main: str, extra: str = "", marker: bool | str = True) -> Any:
    return Field(
        default=None,
        description=f"The {role} pods' template, a Kubernetes PodTemplateSpec (labels, "
        f"annotations and the whole pod spec). The container named {main} is the main one: the "
        f"short fields above fill it (a field set both ways must agree), and the operator adds "
        "its parts on top by the rules of docs/operator.md#pod-templates, refusing a template "
        f"that sets one of them.{extra}",
        json_schema_extra={POD_TEMPLATE_MARKER: marker},
    )


def _image_rule(role: str, main: str) -> dict[str, str]:
    return {
        "rule": "has(self.image) || has(self.template)",
        "message": f"spec.{role} needs an image: set spec.{role}.image, or give the container "
        f"named {main} in spec.{role}.template an image",
    }


class Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class DeploymentType(StrEnum):
    MULTI_NODE = "MultiNode"
    SINGLE_NODE = "SingleNode"


class PayloadAccess(StrEnum):
    READ_ONLY = "ReadOnly"
    READ_WRITE = "ReadWrite"


class PayloadModeSetting(StrEnum):
    AUTO = "Auto"
    BY_HANDLE = "ByHandle"
    INLINE = "Inline"


class PayloadModeReason(StrEnum):
    """Why a run's payloads move by handle or inline (``status.payloadModeReason``): the rule of
    ``spec.payloads.mode`` that decided (desired/decisions.py), in the order it is asked."""

    INLINE_REQUESTED = "InlineRequested"  # Inline: spec.payloads.mode says so
    BY_HANDLE_REQUESTED = "ByHandleRequested"  # ByHandle: spec.payloads.mode says so
    PAYLOAD_ROOT_SET = "PayloadRootSet"  # ByHandle: spec.payloads.root is set
    NO_PER_TOKEN_PAYLOADS = "NoPerTokenPayloads"  # Inline: neither capture is on
    SINGLE_NODE = "SingleNode"  # Inline
    DISAGGREGATED = "Disaggregated"  # Inline: the P/D router does not stitch segments
    MULTI_NODE_PER_TOKEN_PAYLOADS = "MultiNodePerTokenPayloads"  # ByHandle


def _either(reasons: list[PayloadModeReason]) -> str:
    """``A, B or C``."""
    words = [str(r) for r in reasons]
    return ", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else "".join(words)


class DeletionPolicy(StrEnum):
    DELETE = "Delete"
    RETAIN = "Retain"


class EnvVar(Model):
    name: Annotated[str, Field(min_length=1, max_length=256)] = Field(
        description="The variable's name (a name the operator sets in that container, its "
        "PAYLOADRUN_*, PAYLOAD_ROOT and the trainers' torchrun variables, is refused)."
    )
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
    mode: PayloadModeSetting = Field(
        default=PayloadModeSetting.AUTO,
        description="Auto: by handle when spec.payloads.root is set "
        f"({PayloadModeReason.PAYLOAD_ROOT_SET}), or when router replay or sampling-mask "
        "capture is on, deploymentType is MultiNode and inference is not disaggregated "
        f"({PayloadModeReason.MULTI_NODE_PER_TOKEN_PAYLOADS}); inline otherwise "
        f"({PayloadModeReason.NO_PER_TOKEN_PAYLOADS}, {PayloadModeReason.SINGLE_NODE}, "
        f"{PayloadModeReason.DISAGGREGATED}). Inline and ByHandle force the mode.",
    )
    root: Annotated[str, Field(max_length=1024, pattern=r"^/")] | None = Field(
        default=None,
        description="Payload root set by hand, a directory under the volume's mount path (default "
        "<mountPath>/<namespace>/<name>/payloads). Inside a run directory on this volume, the "
        "seed's layout is <run dir>/payloads.",
    )
    mount_path: MountPath | None = Field(
        default=None,
        description="Where the payload volume is mounted, the same path in every container that "
        f"mounts it (segments name files by absolute path); default {DEFAULT_MOUNT_PATH}, or "
        "spec.runDirectory.mountPath when the run directory is this volume.",
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


SHM_DESCRIPTION = (
    "Size limit of the memory-backed /dev/shm the operator mounts in the main container (NCCL "
    "and vLLM need far more than a container's default 64 MiB); default: the main container's "
    "memory limit, or no limit of its own without one. None is added when the template mounts "
    "something at /dev/shm or sets hostIPC."
)


class SelectorOperator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


# Label keys and values as the API server checks them in a selector (apimachinery's
# validation.IsQualifiedName and IsValidLabelValue): a NetworkPolicy the operator applies with
# a bad one would be refused at every pass, so a run naming one is refused at admission.
_LABEL_NAME = r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)"
_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
LABEL_KEY = re.compile(rf"^({_DNS_SUBDOMAIN}/)?{_LABEL_NAME}$")
LABEL_VALUE = re.compile(rf"^({_LABEL_NAME})?$")


def check_label_key(key: str) -> str:
    prefix = key.rpartition("/")[0]
    if not LABEL_KEY.match(key) or len(prefix) > 253:
        raise ValueError(
            f"label key {key!r} is not valid: a name of at most 63 characters (letters, digits, "
            "'-', '_', '.'; a letter or digit at each end), optionally after a DNS subdomain "
            "prefix and '/'"
        )
    return key


def check_label_value(value: str) -> str:
    if not LABEL_VALUE.match(value):
        raise ValueError(
            f"label value {value!r} is not valid: empty, or at most 63 characters (letters, "
            "digits, '-', '_', '.'; a letter or digit at each end)"
        )
    return value


class LabelSelectorRequirement(Model):
    key: Annotated[str, Field(min_length=1, max_length=317)] = Field(description="The label's key.")
    operator: SelectorOperator = Field(description="In, NotIn, Exists or DoesNotExist.")
    values: list[str] | None = Field(
        default=None, description="The values (In, NotIn); empty for Exists and DoesNotExist."
    )

    @field_validator("key")
    @classmethod
    def _key(cls, key: str) -> str:
        return check_label_key(key)

    @model_validator(mode="after")
    def _values_fit_the_operator(self) -> LabelSelectorRequirement:
        takes_values = self.operator in (SelectorOperator.IN, SelectorOperator.NOT_IN)
        if takes_values and not self.values:
            raise ValueError(
                f"matchExpressions {self.key!r} {self.operator.value} needs values: name at "
                "least one, or use Exists / DoesNotExist"
            )
        if not takes_values and self.values:
            raise ValueError(
                f"matchExpressions {self.key!r} {self.operator.value} takes no values: remove "
                f"{self.values!r}, or use In / NotIn"
            )
        for value in self.values or []:
            check_label_value(value)
        return self


class LabelSelector(Model):
    """A Kubernetes label selector (meta/v1 LabelSelector); empty selects everything."""

    match_labels: dict[str, str] | None = Field(
        default=None, description="Labels that must all match."
    )
    match_expressions: list[LabelSelectorRequirement] | None = Field(
        default=None, description="Requirements that must all hold."
    )

    @field_validator("match_labels")
    @classmethod
    def _labels(cls, labels: dict[str, str] | None) -> dict[str, str] | None:
        for key, value in (labels or {}).items():
            check_label_key(key)
            check_label_value(value)
        return labels


class IPBlock(Model):
    """Addresses outside the cluster's pods (networking/v1 IPBlock)."""

    cidr: Annotated[str, Field(min_length=1, max_length=64)] = Field(
        description="A CIDR, e.g. 10.0.0.0/16."
    )
    except_: list[Annotated[str, Field(max_length=64)]] | None = Field(
        default=None, alias="except", description="CIDRs inside cidr left out."
    )

    @field_validator("cidr")
    @classmethod
    def _cidr(cls, cidr: str) -> str:
        return check_cidr(cidr)

    @field_validator("except_")
    @classmethod
    def _excepts(cls, excepts: list[str] | None) -> list[str] | None:
        for cidr in excepts or []:
            check_cidr(cidr)
        return excepts


def check_cidr(cidr: str) -> str:
    if "/" not in cidr:
        raise ValueError(f"{cidr!r} is not a CIDR: give an address and a prefix, e.g. 10.0.0.0/16")
    try:
        ipaddress.ip_network(cidr, strict=False)
    except ValueError as exc:
        raise ValueError(f"{cidr!r} is not a CIDR ({exc}): e.g. 10.0.0.0/16") from None
    return cidr


PEER_NEEDS_ONE_MESSAGE = (
    "a network peer needs podSelector, namespaceSelector or ipBlock (namespaceSelector: {} "
    "alone is every pod of every namespace)"
)
PEER_IP_BLOCK_ALONE_MESSAGE = (
    "a network peer's ipBlock cannot be combined with podSelector or namespaceSelector "
    "(as in a NetworkPolicy): give them as two peers"
)


class NetworkPolicyPeer(Model):
    """Who may connect, as a NetworkPolicy names it (networking/v1 NetworkPolicyPeer):
    podSelector alone is pods of the run's namespace, namespaceSelector alone every pod of those
    namespaces, both together those pods of those namespaces; ipBlock addresses outside the
    cluster."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.podSelector) || has(self.namespaceSelector) || "
                    "has(self.ipBlock)",
                    "message": PEER_NEEDS_ONE_MESSAGE,
                },
                {
                    "rule": "!has(self.ipBlock) || "
                    "!(has(self.podSelector) || has(self.namespaceSelector))",
                    "message": PEER_IP_BLOCK_ALONE_MESSAGE,
                },
            ]
        }
    )

    pod_selector: LabelSelector | None = Field(default=None, description=LabelSelector.__doc__)
    namespace_selector: LabelSelector | None = Field(
        default=None, description=LabelSelector.__doc__
    )
    ip_block: IPBlock | None = Field(default=None, description=IPBlock.__doc__)

    @model_validator(mode="after")
    def _one_kind_of_peer(self) -> NetworkPolicyPeer:
        """The CEL rules above, for clusters without CEL (and for the operator's settings)."""
        selectors = self.pod_selector is not None or self.namespace_selector is not None
        if not selectors and self.ip_block is None:
            raise ValueError(PEER_NEEDS_ONE_MESSAGE)
        if selectors and self.ip_block is not None:
            raise ValueError(PEER_IP_BLOCK_ALONE_MESSAGE)
        return self

    def manifest(self) -> dict[str, Any]:
        """The peer as a NetworkPolicy takes it (fields not given left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


INFERENCE_CLIENTS_DESCRIPTION = (
    "Who else may call the inference Service's port (the writer's by handle, vLLM's inline), "
    "e.g. an eval job or a router: NetworkPolicy peers, added to the operator's own list "
    "(PAYLOADRUN_INFERENCE_CLIENTS, the chart's operator.networkPolicy.inferenceFrom). The "
    "run's own pods need no entry: they reach every port of each other."
)


class ApiServerLayout(StrEnum):
    """Which pods of an inference replica run vLLM API servers."""

    EVERY_POD = "EveryPod"  # data parallelism across nodes (MoE expert parallelism, wide-EP)
    LEADER = "Leader"  # tensor/pipeline parallelism across nodes: only the leader serves HTTP


VLLM_DATA_PARALLEL_RPC_PORT = 29550  # vLLM's --data-parallel-rpc-port default (ParallelConfig)
MAX_PODS_PER_REPLICA = 64
MAX_API_SERVERS_PER_POD = 64

LAYOUT_IS_FIXED_MESSAGE = (
    "spec.inference.podsPerReplica, apiServers and apiServersPerPod cannot change on a live "
    "run: they decide which kind of workload serves inference and how its pods are wired. "
    "Create a new run (spec.resume keeps the payload root's files) instead"
)
WORKER_TEMPLATE_NEEDS_GROUPS_MESSAGE = (
    "spec.inference.workerTemplate is the template of a replica's workers, and this run's "
    "replicas have one pod each: set spec.inference.podsPerReplica above 1, or remove "
    "spec.inference.workerTemplate"
)


# The inference layout fields fixed for a run's life, with their defaults in CEL.
FIXED_LAYOUT_FIELDS = (
    ("podsPerReplica", "1"),
    ("apiServers", f"'{ApiServerLayout.EVERY_POD}'"),
    ("apiServersPerPod", "1"),
)


class Inference(Model):
    """The vLLM servers (the writer sidecar beside each pod's, by handle)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _image_rule("inference", "vllm"),
                {
                    "rule": " && ".join(
                        f"{given_or(field, default)} == {given_or(field, default, 'oldSelf')}"
                        for field, default in FIXED_LAYOUT_FIELDS
                    ),
                    "message": LAYOUT_IS_FIXED_MESSAGE,
                },
                {
                    "rule": f"!has(self.workerTemplate) || {given_or('podsPerReplica', '1')} > 1",
                    "message": WORKER_TEMPLATE_NEEDS_GROUPS_MESSAGE,
                },
            ]
        }
    )

    replicas: Annotated[int, Field(ge=1, le=1024)] = Field(
        default=1,
        description="vLLM replicas: one pod each, or a group of podsPerReplica pods each.",
    )
    pods_per_replica: Annotated[int, Field(ge=1, le=MAX_PODS_PER_REPLICA)] = Field(
        default=1,
        json_schema_extra=ADDED_AFTER_RELEASE,
        description="Pods per inference replica. 1 (the default): a StatefulSet of one-pod "
        "replicas. More: each replica is a LeaderWorkerSet group of this many pods (a leader "
        "and its workers, started, recreated and scaled together), for models whose replica "
        "spans nodes; LeaderWorkerSet must be installed in the cluster "
        "(docs/operator.md#multi-node-replicas). Fixed for the run's life.",
    )
    api_servers: ApiServerLayout = Field(
        default=ApiServerLayout.EVERY_POD,
        json_schema_extra=ADDED_AFTER_RELEASE,
        description="Which pods of a replica run vLLM API servers, with a writer in front of "
        "them: EveryPod (data parallelism across nodes, e.g. MoE expert parallelism: every "
        "rank serves HTTP) or Leader (tensor or pipeline parallelism across nodes: the workers "
        "serve no HTTP). Fixed for the run's life.",
    )
    api_servers_per_pod: Annotated[int, Field(ge=1, le=MAX_API_SERVERS_PER_POD)] = Field(
        default=1,
        json_schema_extra=ADDED_AFTER_RELEASE,
        description="vLLM API servers each serving pod runs (one per data-parallel rank), on "
        "consecutive ports from spec.inference.port; none of them may be a sidecar's port. "
        "Fixed for the run's life.",
    )
    data_parallel_rpc_port: Port = Field(
        default=VLLM_DATA_PARALLEL_RPC_PORT,
        json_schema_extra=ADDED_AFTER_RELEASE,
        description="The data-parallel RPC port on a replica's head (vLLM's "
        "--data-parallel-rpc-port), given to every pod as PAYLOADRUN_INFERENCE_DP_RPC_PORT.",
    )
    disaggregated: bool = Field(
        default=False,
        description="Whether the run's inference is prefill/decode-disaggregated behind a P/D "
        "router. It only decides the payload mode (Auto picks Inline; ByHandle or a payload root "
        "is refused): the operator deploys no P/D router and no prefill/decode roles, so the "
        "template or the image has to run them.",
    )
    image: Name | None = Field(
        default=None,
        description="The vLLM image (prime-rl's serves the admin routes its orchestrator calls).",
    )
    command: list[str] | None = Field(default=None, description="Default: the image's.")
    args: list[str] = Field(
        default_factory=list,
        description="vLLM's flags. Router replay needs --enable-return-routed-experts; "
        "sampling-mask capture needs --return-sampling-mask with --logprobs-mode "
        "processed_logprobs (masks come on the tokens-in generate endpoint only); that endpoint "
        "needs --enable-scale-out.",
    )
    env: list[EnvVar] = Field(default_factory=list, description="Extra environment.")
    resources: Resources | None = Field(default=None, description="vLLM's container resources.")
    port: Port = Field(default=sidecar.VLLM_PORT, description="vLLM's HTTP port.")
    shm_size: Quantity | None = Field(default=None, description=SHM_DESCRIPTION)
    writer: Writer = Field(default_factory=Writer, description=Writer.__doc__)
    clients: list[NetworkPolicyPeer] = Field(
        default_factory=list, max_length=64, description=INFERENCE_CLIENTS_DESCRIPTION
    )
    template: dict[str, Any] | None = _pod_template("inference", "vllm")
    worker_template: dict[str, Any] | None = _pod_template(
        "inference worker",
        "vllm",
        " Only with podsPerReplica above 1: the template of a replica's pods other than its "
        "leader; default: spec.inference.template. The API server stores it unchecked (a "
        "fourth PodTemplateSpec schema would take the CRD near etcd's 1.5 MiB): the operator "
        "checks it against PodTemplateSpec's schema and refuses the run with the field's path.",
        marker=CHECKED_BY_OPERATOR,
    )

    @model_validator(mode="after")
    def _worker_template_needs_groups(self) -> Inference:
        """The CEL rule above, for clusters without CEL (the layout's transition rule needs the
        stored run: only the API server checks it)."""
        if self.worker_template is not None and self.pods_per_replica == 1:
            raise ValueError(WORKER_TEMPLATE_NEEDS_GROUPS_MESSAGE)
        return self


class Orchestrator(Model):
    """The orchestrator (the retention sidecar beside it, by handle)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [_image_rule("orchestrator", "orchestrator")]
        }
    )

    image: Name | None = Field(
        default=None, description="The orchestrator's image (prime-rl's, or yours)."
    )
    command: list[str] | None = Field(default=None, description="Default: the image's.")
    args: list[str] = Field(default_factory=list, description="The orchestrator's arguments.")
    env: list[EnvVar] = Field(default_factory=list, description="Extra environment.")
    resources: Resources | None = Field(
        default=None, description="The orchestrator container's resources."
    )
    retention: Retention = Field(default_factory=Retention, description=Retention.__doc__)
    template: dict[str, Any] | None = _pod_template(
        "orchestrator",
        "orchestrator",
        " The ports its containers declare are the ports of its headless Service.",
    )


class Trainer(Model):
    """The trainers: one pod per rank, rendezvousing at rank 0."""

    model_config = ConfigDict(
        json_schema_extra={"x-kubernetes-validations": [_image_rule("trainer", "trainer")]}
    )

    replicas: Annotated[int, Field(ge=1, le=4096)] = Field(
        default=1, description="Trainer pods (torchrun's nodes)."
    )
    processes_per_node: Annotated[int, Field(ge=1, le=1024)] = Field(
        default=1,
        description="Processes per trainer pod (torchrun's --nproc-per-node, usually its GPUs); "
        "with 1, RANK and WORLD_SIZE are injected too.",
    )
    image: Name | None = Field(default=None, description="The trainer's image.")
    command: list[str] | None = Field(default=None, description="Default: the image's.")
    args: list[str] = Field(default_factory=list, description="The trainer's arguments.")
    env: list[EnvVar] = Field(default_factory=list, description="Extra environment.")
    resources: Resources | None = Field(
        default=None, description="Each trainer container's resources (e.g. its GPUs)."
    )
    shm_size: Quantity | None = Field(default=None, description=SHM_DESCRIPTION)
    payload_access: PayloadAccess = Field(
        default=PayloadAccess.READ_ONLY,
        description="ReadOnly: the trainers cannot write to or delete payload files, even where "
        "the run directory is mounted read-write (the payload root is mounted read-only over "
        "it). ReadWrite: they can.",
    )
    template: dict[str, Any] | None = _pod_template("trainer", "trainer")


class RunDirectory(Model):
    """The run's shared, writable directory (prime-rl's output_dir: weights, markers,
    checkpoints), mounted read-write at one path in the main container of every role."""

    mount_path: MountPath = Field(description="Where, in every role (e.g. /data).")
    claim_name: Name | None = Field(
        default=None,
        description="A ReadWriteMany claim of your own; default: the run's payload volume "
        "(spec.payloads.volume, provisioned even for an inline run), mounted at this path "
        "everywhere, so the payload root can live inside the run directory.",
    )


class FailurePolicy(Model):
    """When a run gives up: failed pods are replaced until a component has failed this often."""

    backoff_limit: Annotated[int, Field(ge=0, le=1000)] = Field(
        default=3,
        description="Failed orchestrator pods (each replaced, and kept for its logs), and "
        "restarts of the trainer group (any rank's failure restarts every rank), before the run "
        "is Failed.",
    )


class LocalObjectReference(Model):
    name: Name = Field(description="The name of a Secret in the run's namespace.")


class Placement(Model):
    """Pod placement shared by every workload of the run (a role's template can add to it:
    node selectors and tolerations are merged, a value set both ways must agree)."""

    node_selector: dict[str, str] | None = Field(
        default=None, description="Node labels every pod of the run must match."
    )
    tolerations: list[dict[str, Any]] | None = Field(
        default=None,
        description="core/v1 Tolerations",
        json_schema_extra={"items": {"x-kubernetes-preserve-unknown-fields": True}},
    )
    service_account_name: Name | None = Field(
        default=None, description="The pods' service account (default: the namespace's default)."
    )
    image_pull_secrets: list[LocalObjectReference] | None = Field(
        default=None, description="Secrets to pull the run's images with."
    )


class PayloadRunSpec(Model):
    """The run the operator builds: its workloads and how their payloads move."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!(self.inference.disaggregated && "
                    "(self.payloads.mode == 'ByHandle' || has(self.payloads.root)))",
                    "message": DISAGGREGATED_BY_HANDLE_MESSAGE,
                },
                {
                    "rule": "!has(self.payloads.root) || self.payloads.root.startsWith(("
                    f"{RUN_DIRECTORY_ON_PAYLOAD_VOLUME} ? self.runDirectory.mountPath : "
                    "(has(self.payloads.mountPath) ? self.payloads.mountPath : "
                    f"'{DEFAULT_MOUNT_PATH}')) + '/')",
                    "message": ROOT_OUTSIDE_MOUNT_MESSAGE,
                },
                {
                    "rule": f"!({RUN_DIRECTORY_ON_PAYLOAD_VOLUME} && has(self.payloads.mountPath) "
                    "&& self.payloads.mountPath != self.runDirectory.mountPath)",
                    "message": TWO_MOUNT_PATHS_MESSAGE,
                },
            ]
        }
    )

    deployment_type: DeploymentType = Field(
        default=DeploymentType.MULTI_NODE,
        description="MultiNode when inference, orchestrator and trainers run on separate nodes, "
        "SingleNode when they share one. It only decides the payload mode (SingleNode: Auto "
        "picks Inline): the operator places no pod by it; spec.placement and each role's "
        "template decide where pods run.",
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
    inference: Inference = Field(description=Inference.__doc__)
    orchestrator: Orchestrator = Field(description=Orchestrator.__doc__)
    trainer: Trainer = Field(description=Trainer.__doc__)
    run_directory: RunDirectory | None = Field(default=None, description=RunDirectory.__doc__)
    placement: Placement = Field(
        default_factory=Placement, description="Pod placement shared by every workload."
    )
    suspend: bool = Field(
        default=False,
        description="Stop every pod of the run and keep its claim, payload directory and "
        "retention journal; false again resumes it where it was (the field Kueue and other "
        "queueing systems set on batch workloads).",
    )
    failure_policy: FailurePolicy = Field(
        default_factory=FailurePolicy, description=FailurePolicy.__doc__
    )


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(Model):
    """One observation of the run, shaped as Kubernetes' metav1.Condition (same rules)."""

    type: Annotated[str, Field(max_length=316, pattern=CONDITION_TYPE_PATTERN)] = Field(
        # crd.py puts the list of types in front (payloadrun_operator.api.conditions.ConditionType)
        description="One entry per type (CamelCase, or example.com/CamelCase for a condition "
        "another controller adds)."
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: Annotated[str, Field(min_length=1, max_length=1024, pattern=REASON_PATTERN)] = Field(
        # crd.py adds each type's reasons (payloadrun_operator.api.conditions.REASONS)
        description="Why the condition has its status, as a CamelCase identifier for programs "
        "and alerts."
    )
    message: Annotated[str, Field(max_length=MAX_CONDITION_MESSAGE)] = Field(
        description="Why, for people: what is missing or wrong, and what to do. May be empty."
    )
    last_transition_time: AwareDatetime = Field(
        description="When status last changed (RFC 3339); a new reason or message alone leaves "
        "it as it is."
    )
    observed_generation: Generation | None = Field(
        default=None,
        description="The metadata.generation of the spec this condition was computed for.",
    )


class PinnedSidecars(Model):
    """The sidecar image and settings the run was started with. Operator restarts and upgrades
    keep them; the annotation rollout.payloadrun.dev/sidecars moves the run onto the operator's
    current ones."""

    image: str = Field(description="Image of both sidecars.")
    image_pull_policy: str = Field(description="Their imagePullPolicy.")
    uid: int = Field(description="Their user, and the pods' fsGroup.")
    log_format: str = Field(description="Their log format (plain or json).")
    writer_resources: dict[str, Any] = Field(
        description="The writer's resources (unless the run sets its own).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    retention_resources: dict[str, Any] = Field(
        description="The retention sidecar's resources (unless the run sets its own).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    rollout: str | None = Field(
        default=None,
        description="The value of the rollout.payloadrun.dev/sidecars annotation these were "
        "taken for (none: taken when the run started).",
    )
    pod_layout: int | None = Field(
        default=None,
        description="The layout of the pods the run was started with: 2 for every run started "
        "by 0.1.0 or later (none: 1, a run started by a development build before 0.1.0, which "
        "had no pod templates).",
    )


class RunFailure(Model):
    """What made the run fail."""

    component: str = Field(description="orchestrator or trainer.")
    reason: str = Field(description="The Job's reason (e.g. BackoffLimitExceeded).")
    exit_code: int | None = Field(
        default=None, description="The exit code of the component's last failed container."
    )
    pod: str | None = Field(default=None, description="The last failed pod (its logs stay).")
    message: str = Field(description="Why, in words.")


class TrainerRestart(Model):
    """The trainers' last restart together: which rank failed, and how."""

    time: AwareDatetime = Field(description="When the operator restarted them.")
    job_uid: str = Field(description="The uid of the failed trainer Job it replaced.")
    pod: str | None = Field(default=None, description="The failed rank's pod.")
    exit_code: int | None = Field(default=None, description="Its trainer container's exit code.")
    message: str = Field(description="What happened, in words.")


class InferenceGroupRestart(Model):
    """The last failure seen in an inference replica that is a LeaderWorkerSet group (spec.
    inference.podsPerReplica above 1): LeaderWorkerSet recreates the failed pod's whole group,
    and the other replicas keep serving."""

    time: AwareDatetime = Field(description="When the failed container ended.")
    replica: int | None = Field(default=None, description="The replica (the group's index).")
    pod: str = Field(description="The pod whose container failed.")
    pod_uid: str = Field(description="That pod's uid.")
    container: str = Field(description="The container that failed.")
    exit_code: int | None = Field(default=None, description="Its exit code.")
    reason: str | None = Field(default=None, description="The kubelet's reason (Error, ...).")
    message: str = Field(description="What happened, in words.")


class QueueStatus(Model):
    """Where a run labelled kueue.x-k8s.io/queue-name stands in Kueue: its Workload, and once
    admitted the ClusterQueue and the flavors of each pod set."""

    name: str = Field(description="The LocalQueue (the run's kueue.x-k8s.io/queue-name label).")
    workload: str = Field(description="The run's Workload (kueue.x-k8s.io), in its namespace.")
    cluster_queue: str | None = Field(
        default=None, description="The ClusterQueue that admitted it (while admitted)."
    )
    flavors: dict[str, list[str]] | None = Field(
        default=None,
        description="Each pod set's admitted ResourceFlavors (inference, inference-workers, "
        "orchestrator, trainer), while admitted.",
    )


class PayloadRunStatus(Model):
    """What the operator observed of the run: its payload mode, volume and readiness (written by
    the operator only, through the status subresource)."""

    observed_generation: Generation | None = Field(
        default=None,
        description="The metadata.generation of the spec this status describes; behind "
        "metadata.generation, the operator has not reconciled the latest change yet.",
    )
    observed_digest: str | None = Field(
        default=None,
        description="A SHA-256 of the spec, labels and annotations the operator last "
        "reconciled (what observedGeneration is for the spec alone): a run whose current one "
        "differs is reconciled again. Written with the rest of the status, so a reconcile costs "
        "one write of the run.",
    )
    phase: str | None = Field(
        default=None,
        description="Provisioning (children being applied, or their pods not ready yet), Running "
        "(the Ready condition is True), Suspended (spec.suspend: no pod runs), Queued (labelled "
        "kueue.x-k8s.io/queue-name and not admitted by Kueue: no pod runs), Succeeded "
        "(every trainer exited 0), Failed (see failure) or Rejected (the spec was refused: see "
        "the Validated condition). Succeeded and Failed are final.",
    )
    payload_mode: str | None = Field(
        default=None,
        description="How per-token payloads move: ByHandle (files on the shared volume, the "
        "responses carry segments) or Inline (inside the HTTP responses).",
    )
    payload_mode_reason: str | None = Field(
        default=None,
        description=f"Why that mode, as a CamelCase reason: {_either(list(PayloadModeReason))} "
        "(spec.payloads.mode says the rule).",
    )
    payload_mode_message: str | None = Field(default=None, description="Why that mode, in words.")
    payload_root: str | None = Field(
        default=None,
        description="The payload root: the directory of the run's v<k> payload directories on "
        "the shared volume, as its pods see it in PAYLOAD_ROOT (by handle only).",
    )
    claim_name: str | None = Field(
        default=None,
        description="The ReadWriteMany PersistentVolumeClaim of the payload volume (by handle, "
        "or when it is the run directory).",
    )
    sidecars: PinnedSidecars | None = Field(default=None, description=PinnedSidecars.__doc__)
    start_time: AwareDatetime | None = Field(
        default=None, description="When the operator first built the run's workloads."
    )
    completion_time: AwareDatetime | None = Field(
        default=None, description="When the run Succeeded or Failed."
    )
    last_step: int | None = Field(
        default=None,
        description="The last policy step the retention sidecar had seen when the run "
        "finished (by handle only; absent when it could not be read).",
    )
    failure: RunFailure | None = Field(default=None, description=RunFailure.__doc__)
    trainer_restarts: Annotated[int, Field(ge=0)] | None = Field(
        default=None,
        description="How often every trainer was restarted together after a rank failed (the "
        "run fails once this would exceed spec.failurePolicy.backoffLimit).",
    )
    last_trainer_restart: TrainerRestart | None = Field(
        default=None, description=TrainerRestart.__doc__
    )
    inference_group_restarts: Annotated[int, Field(ge=0)] | None = Field(
        default=None,
        description="Failures seen in the inference replicas' LeaderWorkerSet groups (each "
        "recreates its group; the run goes on).",
    )
    last_inference_group_restart: InferenceGroupRestart | None = Field(
        default=None, description=InferenceGroupRestart.__doc__
    )
    queue: QueueStatus | None = Field(default=None, description=QueueStatus.__doc__)
    conditions: list[Condition] = Field(
        default_factory=list,
        # crd.py writes what each type means (payloadrun_operator.api.conditions.MEANINGS)
        description="The run's conditions, each with a reason and a message.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )
