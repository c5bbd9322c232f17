"""Pod templates per role: the operator's parts on top of the user's, by the written rules
(templates.py, docs/operator.md#pod-templates), and every collision refused with its message."""

import copy

import pytest

from builders import by_kind, children_of, container, context, env_of, pod_of
from payloadrun_operator.desired.builders import build_children, run_errors


def mounts_of(c):
    return {m["mountPath"]: m for m in c.get("volumeMounts", [])}


def refused(spec_dict):
    errors = run_errors(context(spec_dict))
    assert errors, "the spec was accepted"
    return errors


def with_template(spec_dict, role, template):
    spec = copy.deepcopy(spec_dict)
    spec[role]["template"] = template
    return spec


# --- the main container --------------------------------------------------------------------


def test_short_fields_fill_the_main_container_of_the_template(spec_dict):
    spec_dict["inference"].update(args=["--enable-return-routed-experts"], command=["vllm"])
    spec_dict["inference"]["template"] = {
        "metadata": {"labels": {"team": "rl"}, "annotations": {"note": "x"}},
        "spec": {
            "containers": [
                {"name": "log-shipper", "image": "fluent/fluent-bit:3"},
                {"name": "vllm", "ports": [{"name": "api", "containerPort": 8000}]},
            ],
            "runtimeClassName": "nvidia",
        },
    }
    pod = pod_of(spec_dict, "inference")
    assert pod["metadata"]["labels"]["team"] == "rl"
    assert pod["metadata"]["labels"]["payloadrun.dev/run"] == "run1"
    assert pod["metadata"]["annotations"] == {"note": "x"}
    assert pod["spec"]["runtimeClassName"] == "nvidia"
    names = [c["name"] for c in pod["spec"]["containers"]]
    assert names == ["log-shipper", "vllm"]  # the template's order, its other containers kept
    vllm = container(pod, "vllm")
    assert (vllm["image"], vllm["command"], vllm["args"]) == (
        "vllm/vllm-openai:v0.33.0",
        ["vllm"],
        ["--enable-return-routed-experts"],
    )
    # the port the template declares for vLLM is kept, not declared twice
    assert vllm["ports"] == [{"name": "api", "containerPort": 8000}]
    # the template's other container: told which run it belongs to, nothing else of the operator's
    shipper = container(pod, "log-shipper")
    assert [e["name"] for e in shipper["env"]] == [
        "PAYLOADRUN_RUN",
        "PAYLOADRUN_RUN_ID",
        "PAYLOADRUN_PAYLOAD_MODE",
    ]
    assert "volumeMounts" not in shipper


def test_a_template_without_the_main_container_gets_it_first(spec_dict):
    spec_dict["trainer"]["template"] = {"spec": {"containers": [{"name": "x", "image": "x:1"}]}}
    pod = pod_of(spec_dict, "trainer")
    assert [c["name"] for c in pod["spec"]["containers"]] == ["trainer", "x"]


def test_the_image_can_come_from_the_template_alone(spec_dict):
    del spec_dict["trainer"]["image"]
    spec_dict["trainer"]["template"] = {
        "spec": {"containers": [{"name": "trainer", "image": "mine/trainer:3"}]}
    }
    assert container(pod_of(spec_dict, "trainer"), "trainer")["image"] == "mine/trainer:3"


def test_no_image_anywhere_is_refused(spec_dict):
    del spec_dict["trainer"]["image"]
    spec_dict["trainer"]["template"] = {"spec": {"containers": [{"name": "other", "image": "x"}]}}
    assert refused(spec_dict) == [
        "spec.trainer needs an image: set spec.trainer.image, or give the container named "
        "trainer in spec.trainer.template an image"
    ]


@pytest.mark.parametrize(
    ("field", "short", "templated"),
    [
        ("image", "vllm/vllm-openai:v0.33.0", "other/vllm:1"),
        ("command", ["a"], ["b"]),
        ("args", ["--x"], ["--y"]),
        ("resources", {"limits": {"nvidia.com/gpu": 8}}, {"limits": {"nvidia.com/gpu": 4}}),
    ],
)
def test_a_field_set_both_ways_must_agree(spec_dict, field, short, templated):
    spec_dict["inference"][field] = short
    agree = with_template(
        spec_dict, "inference", {"spec": {"containers": [{"name": "vllm", field: short}]}}
    )
    assert run_errors(context(agree)) == []
    differ = with_template(
        spec_dict, "inference", {"spec": {"containers": [{"name": "vllm", field: templated}]}}
    )
    assert refused(differ) == [
        f"spec.inference.{field} and spec.inference.template.spec.containers[vllm].{field} are "
        "both set, to different values: set it in one place"
    ]


def test_env_from_both_places_is_kept_after_the_operators(spec_dict):
    spec_dict["orchestrator"]["env"] = [{"name": "B", "value": "2"}]
    spec_dict["orchestrator"]["template"] = {
        "spec": {
            "containers": [
                {"name": "orchestrator", "env": [{"name": "A", "value": "$(PAYLOADRUN_RUN)"}]}
            ]
        }
    }
    env = [e["name"] for e in container(pod_of(spec_dict, "orchestrator"), "orchestrator")["env"]]
    # the operator's first, so the user's can refer to them with $(NAME)
    assert env[0] == "PAYLOADRUN_RUN" and env[-2:] == ["A", "B"]


def test_env_the_operator_sets_or_a_name_given_twice_is_refused(spec_dict):
    spec_dict["trainer"]["env"] = [{"name": "MASTER_ADDR", "value": "elsewhere"}]
    spec_dict["orchestrator"]["env"] = [{"name": "A", "value": "1"}]
    spec_dict["orchestrator"]["template"] = {
        "spec": {"containers": [{"name": "orchestrator", "env": [{"name": "A", "value": "2"}]}]}
    }
    assert refused(spec_dict) == [
        "the orchestrator container's env names A more than once (spec.orchestrator.env and "
        "spec.orchestrator.template): keep one",
        "spec.trainer sets env MASTER_ADDR in the trainer container, which the operator sets "
        "itself (docs/operator.md#what-every-pod-learns): remove it",
    ]


# --- what the operator owns ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("role", "template", "message"),
    [
        (
            "inference",
            {"spec": {"containers": [{"name": "payload-writer", "image": "x"}]}},
            "spec.inference.template has a container named payload-writer, the operator's "
            "sidecar: rename it",
        ),
        (
            "trainer",
            {"spec": {"volumes": [{"name": "payloads", "emptyDir": {}}]}},
            "spec.trainer.template.spec.volumes has a volume named payloads, which the operator "
            "adds: rename it",
        ),
        (
            "orchestrator",
            {
                "spec": {
                    "containers": [{"name": "orchestrator", "ports": [{"containerPort": 9402}]}]
                }
            },
            "spec.orchestrator.template.spec.containers[orchestrator].ports: container "
            "orchestrator declares port 9402, which the "
            "retention sidecar's metrics listens on in the same pod: use another port (or change "
            "the operator's in the spec)",
        ),
        (
            "inference",
            {"metadata": {"labels": {"payloadrun.dev/run": "other"}}},
            "spec.inference.template.metadata.labels sets payloadrun.dev/run='other', a label "
            "the operator sets to 'run1' (it selects the run's pods): remove it",
        ),
        (
            "trainer",
            {"spec": {"restartPolicy": "OnFailure"}},
            "spec.trainer.template.spec.restartPolicy is 'OnFailure', but the operator sets "
            "'Never' for the trainer pods: remove it",
        ),
        (
            "orchestrator",
            {"spec": {"hostname": "orch"}},
            "spec.orchestrator.template.spec.hostname is set, but the operator names the "
            "orchestrator pods (their DNS names are <run>-orchestrator-<index>): remove it",
        ),
        (
            "trainer",
            {"spec": {"subdomain": "mine"}},
            "spec.trainer.template.spec.subdomain is 'mine', but the operator sets "
            "'run1-trainer-headless' for the trainer pods: remove it",
        ),
        (
            "inference",
            {
                "spec": {
                    "containers": [
                        {"name": "vllm", "ports": [{"name": "http", "containerPort": 9}]}
                    ]
                }
            },
            "spec.inference.template.spec.containers[vllm] names port 9 http, the name of the "
            "operator's port 8000: rename it",
        ),
        (
            "trainer",
            {"spec": {"volumes": [{"name": "dshm", "emptyDir": {}}]}},
            "spec.trainer.template.spec.volumes has a volume named dshm, which the operator "
            "adds for /dev/shm: rename it, or mount your own at /dev/shm",
        ),
    ],
)
def test_a_template_using_what_the_operator_owns_is_refused(spec_dict, role, template, message):
    assert refused(with_template(spec_dict, role, template)) == [message]


def test_an_equal_label_or_pod_field_is_no_collision(spec_dict):
    template = {
        "metadata": {"labels": {"app.kubernetes.io/component": "trainer"}},
        "spec": {"restartPolicy": "Never", "subdomain": "run1-trainer-headless"},
    }
    assert run_errors(context(with_template(spec_dict, "trainer", template))) == []


def test_placement_merges_with_the_templates(spec_dict):
    spec_dict["placement"] = {
        "nodeSelector": {"pool": "gpu"},
        "tolerations": [{"key": "gpu", "operator": "Exists"}],
        "imagePullSecrets": [{"name": "regcred"}],
    }
    spec_dict["orchestrator"]["template"] = {
        "spec": {
            "nodeSelector": {"cpu-only": "true"},
            "tolerations": [{"key": "spot", "operator": "Exists"}],
            "priorityClassName": "rl-high",
        }
    }
    pod = pod_of(spec_dict, "orchestrator")["spec"]
    assert pod["nodeSelector"] == {"cpu-only": "true", "pool": "gpu"}
    assert [t["key"] for t in pod["tolerations"]] == ["spot", "gpu"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["priorityClassName"] == "rl-high"
    assert pod_of(spec_dict, "trainer")["spec"]["nodeSelector"] == {"pool": "gpu"}
    spec_dict["orchestrator"]["template"]["spec"]["nodeSelector"] = {"pool": "cpu"}
    assert refused(spec_dict) == [
        "spec.orchestrator.template.spec.nodeSelector sets pool='cpu' but "
        "spec.placement.nodeSelector sets 'gpu': keep one"
    ]


# --- /dev/shm and fsGroup ----------------------------------------------------------------------


def test_dev_shm_is_memory_sized_by_the_memory_limit_or_the_spec(spec_dict):
    spec_dict["trainer"]["resources"] = {"limits": {"memory": "64Gi"}}
    spec_dict["inference"]["shmSize"] = "16Gi"
    shm = {
        role: {v["name"]: v for v in pod_of(spec_dict, role)["spec"]["volumes"]}["dshm"]
        for role in ("inference", "trainer")
    }
    assert shm["trainer"] == {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}}
    assert shm["inference"]["emptyDir"]["sizeLimit"] == "16Gi"
    assert "/dev/shm" in mounts_of(container(pod_of(spec_dict, "trainer"), "trainer"))
    # the orchestrator gets none
    assert "dshm" not in {v["name"] for v in pod_of(spec_dict, "orchestrator")["spec"]["volumes"]}


@pytest.mark.parametrize(
    "template",
    [
        {
            "spec": {
                "containers": [
                    {"name": "trainer", "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}]}
                ],
                "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}],
            }
        },
        {"spec": {"hostIPC": True}},
    ],
    ids=["its own mount", "hostIPC"],
)
def test_a_template_with_its_own_dev_shm_gets_none(spec_dict, template):
    pod = pod_of(with_template(spec_dict, "trainer", template), "trainer")
    assert "dshm" not in {v["name"] for v in pod["spec"].get("volumes", [])}


def test_the_templates_fs_group_is_the_runs(spec_dict):
    spec_dict["trainer"]["template"] = {"spec": {"securityContext": {"fsGroup": 1000}}}
    for role in ("inference", "orchestrator", "trainer"):
        assert pod_of(spec_dict, role)["spec"]["securityContext"]["fsGroup"] == 1000
    spec_dict["inference"]["template"] = {"spec": {"securityContext": {"fsGroup": 2000}}}
    assert refused(spec_dict)[0].startswith(
        "the pod templates set different securityContext.fsGroup values (spec.inference.template "
        "2000, spec.trainer.template 1000)"
    )


# --- the run directory ---------------------------------------------------------------------


def test_the_run_directory_on_the_payload_volume_is_read_write_everywhere(spec_dict):
    spec_dict["runDirectory"] = {"mountPath": "/data"}
    spec_dict["payloads"] = {"root": "/data/outputs/payloads"}
    for role, main in (("inference", "vllm"), ("orchestrator", "orchestrator")):
        pod = pod_of(spec_dict, role)
        mount = mounts_of(container(pod, main))["/data"]
        assert mount == {"name": "payloads", "mountPath": "/data"}
        assert env_of(container(pod, main))["PAYLOADRUN_RUN_DIRECTORY"] == "/data"
        (sidecar,) = pod["spec"]["initContainers"]
        assert mounts_of(sidecar)["/data"]["readOnly"] is False  # one path in every container
    trainer = container(pod_of(spec_dict, "trainer"), "trainer")
    mounts = mounts_of(trainer)
    assert mounts["/data"] == {"name": "payloads", "mountPath": "/data"}
    # the payload root read-only over the read-write run directory
    assert mounts["/data/outputs/payloads"] == {
        "name": "payloads",
        "mountPath": "/data/outputs/payloads",
        "subPath": "outputs/payloads",
        "readOnly": True,
    }
    spec_dict["trainer"]["payloadAccess"] = "ReadWrite"
    assert "/data/outputs/payloads" not in mounts_of(
        container(pod_of(spec_dict, "trainer"), "trainer")
    )


def test_an_inline_run_directory_gets_the_managed_claim(spec_dict):
    spec_dict["deploymentType"] = "SingleNode"
    spec_dict["runDirectory"] = {"mountPath": "/data"}
    children = children_of(spec_dict)
    assert ("PersistentVolumeClaim", "run1-payloads") in children
    pod = pod_of(spec_dict, "trainer")
    assert "initContainers" not in pod_of(spec_dict, "inference")["spec"]
    assert mounts_of(container(pod, "trainer"))["/data"]["name"] == "payloads"
    assert children[("ConfigMap", "run1-settings")]["data"]["claimName"] == "run1-payloads"


def test_a_run_directory_on_its_own_claim(spec_dict):
    spec_dict["runDirectory"] = {"mountPath": "/data", "claimName": "team-data"}
    pod = pod_of(spec_dict, "trainer")["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["run-directory"] == {
        "name": "run-directory",
        "persistentVolumeClaim": {"claimName": "team-data"},
    }
    mounts = mounts_of(pod["containers"][0])
    assert mounts["/data"] == {"name": "run-directory", "mountPath": "/data"}
    assert mounts["/payloads"]["readOnly"] is True  # the payload volume apart, read-only
    spec_dict["runDirectory"]["mountPath"] = "/payloads"
    assert refused(spec_dict) == [
        "spec.runDirectory.mountPath /payloads is where the payload volume is mounted: choose "
        "another path, or drop spec.runDirectory.claimName to make the payload volume the run "
        "directory"
    ]


def test_a_template_mount_of_the_payload_claim_is_made_read_only_over_the_root(spec_dict):
    spec_dict["payloads"] = {"volume": {"claimName": "shared"}, "root": "/payloads/runs/a"}
    spec_dict["trainer"]["template"] = {
        "spec": {
            "containers": [
                {"name": "trainer", "volumeMounts": [{"name": "mine", "mountPath": "/shared"}]}
            ],
            "volumes": [{"name": "mine", "persistentVolumeClaim": {"claimName": "shared"}}],
        }
    }
    mounts = mounts_of(container(pod_of(spec_dict, "trainer"), "trainer"))
    assert mounts["/shared/runs/a"] == {
        "name": "payloads",
        "mountPath": "/shared/runs/a",
        "subPath": "runs/a",
        "readOnly": True,
    }
    at_root = spec_dict["trainer"]["template"]["spec"]["containers"][0]["volumeMounts"][0]
    at_root.update(mountPath="/root-rw", subPath="runs/a")
    assert refused(spec_dict) == [
        "spec.trainer.template: container trainer mounts the payload root /payloads/runs/a "
        "read-write (at /root-rw): set spec.trainer.payloadAccess to ReadWrite if the trainers "
        "may write and delete payload files"
    ]


def test_a_template_mount_where_the_operator_mounts_is_refused(spec_dict):
    spec_dict["trainer"]["template"] = {
        "spec": {
            "containers": [
                {"name": "trainer", "volumeMounts": [{"name": "x", "mountPath": "/payloads"}]}
            ],
            "volumes": [{"name": "x", "emptyDir": {}}],
        }
    }
    assert refused(spec_dict) == [
        "spec.trainer.template.spec.containers[trainer] mounts x at /payloads, where the "
        "operator mounts payloads: mount it elsewhere"
    ]


# --- addresses -------------------------------------------------------------------------------


def test_every_inference_replica_is_addressable(spec_dict):
    spec_dict["inference"]["replicas"] = 3
    env = env_of(container(pod_of(spec_dict, "orchestrator"), "orchestrator"))
    assert env["PAYLOADRUN_INFERENCE_ADMIN_URLS"] == " ".join(
        f"http://run1-inference-{i}.run1-inference-headless.ml.svc:8000/v1" for i in range(3)
    )
    assert env["PAYLOADRUN_INFERENCE_URL"] == "http://run1-inference.ml.svc:8001"
    assert env["PAYLOADRUN_TRAINER_HOST"] == "run1-trainer-0.run1-trainer-headless.ml.svc"
    headless = children_of(spec_dict)[("Service", "run1-inference-headless")]
    assert {"name": "vllm", "port": 8000, "targetPort": 8000} in headless["spec"]["ports"]
    # inference and trainers do not depend on the replica count: scaling rolls neither
    for role, main in (("inference", "vllm"), ("trainer", "trainer")):
        assert "PAYLOADRUN_INFERENCE_ADMIN_URLS" not in env_of(
            container(pod_of(spec_dict, role), main)
        )


def test_the_orchestrator_has_a_dns_name_with_its_declared_ports(spec_dict):
    spec_dict["orchestrator"]["template"] = {
        "spec": {
            "containers": [
                {
                    "name": "orchestrator",
                    "ports": [{"containerPort": 5555}, {"name": "nccl", "containerPort": 29501}],
                }
            ]
        }
    }
    children = children_of(spec_dict)
    service = children[("Service", "run1-orchestrator-headless")]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"] == [
        {"name": "port-5555", "port": 5555, "targetPort": 5555},
        {"name": "nccl", "port": 29501, "targetPort": 29501},
    ]
    job = children[("Job", "run1-orchestrator")]
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["template"]["spec"]["subdomain"] == "run1-orchestrator-headless"
    host = "run1-orchestrator-0.run1-orchestrator-headless.ml.svc"
    for role, main in (
        ("inference", "vllm"),
        ("trainer", "trainer"),
        ("orchestrator", "orchestrator"),
    ):
        assert (
            env_of(container(pod_of(spec_dict, role), main))["PAYLOADRUN_ORCHESTRATOR_HOST"] == host
        )


@pytest.mark.parametrize("per_node", [1, 8])
def test_trainers_rendezvous_at_rank_0(spec_dict, per_node):
    spec_dict["trainer"].update(replicas=4, processesPerNode=per_node)
    env = env_of(container(pod_of(spec_dict, "trainer"), "trainer"))
    master = "run1-trainer-0.run1-trainer-headless.ml.svc"
    index = {
        "fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        }
    }
    expected = {
        "MASTER_ADDR": master,
        "MASTER_PORT": "29500",
        "NNODES": "4",
        "NPROC_PER_NODE": str(per_node),
        "NODE_RANK": index,
        "PET_MASTER_ADDR": master,
        "PET_MASTER_PORT": "29500",
        "PET_NNODES": "4",
        "PET_NPROC_PER_NODE": str(per_node),
        "PET_NODE_RANK": index,
    }
    if per_node == 1:  # one process per pod: torch.distributed's env:// needs these too
        expected |= {"RANK": index, "WORLD_SIZE": "4"}
    assert {
        k: v for k, v in env.items() if k in expected or k in ("RANK", "WORLD_SIZE")
    } == expected
    service = children_of(spec_dict)[("Service", "run1-trainer-headless")]
    assert service["spec"]["ports"][0] == {"name": "dist", "port": 29500, "targetPort": 29500}


# --- what a review found ---------------------------------------------------------------------


def test_dev_shm_follows_a_memory_limit_set_in_the_template(spec_dict):
    memory = {"limits": {"memory": "64Gi"}}
    spec_dict["trainer"]["template"] = {
        "spec": {"containers": [{"name": "trainer", "resources": memory}]}
    }
    volumes = {v["name"]: v for v in pod_of(spec_dict, "trainer")["spec"]["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}


def test_a_shm_size_the_template_overrides_is_refused_not_dropped(spec_dict):
    spec_dict["trainer"]["shmSize"] = "32Gi"
    spec_dict["trainer"]["template"] = {"spec": {"hostIPC": True}}
    assert refused(spec_dict) == [
        "spec.trainer.shmSize is set, but spec.trainer.template has its own /dev/shm (a mount "
        "there, or hostIPC): remove one"
    ]


def test_an_init_container_of_the_trainers_sees_the_payload_root_read_only(spec_dict):
    spec_dict["trainer"]["template"] = {
        "spec": {
            "initContainers": [
                {
                    "name": "side",
                    "image": "x",
                    "restartPolicy": "Always",
                    "volumeMounts": [{"name": "mine", "mountPath": "/w"}],
                }
            ],
            "volumes": [{"name": "mine", "persistentVolumeClaim": {"claimName": "run1-payloads"}}],
        }
    }
    (side,) = pod_of(spec_dict, "trainer")["spec"]["initContainers"]
    assert mounts_of(side)["/w/ml/run1/payloads"] == {
        "name": "payloads",
        "mountPath": "/w/ml/run1/payloads",
        "subPath": "ml/run1/payloads",
        "readOnly": True,
    }


def test_a_sub_path_expr_mount_of_the_payload_claim_is_refused(spec_dict):
    spec_dict["trainer"]["template"] = {
        "spec": {
            "containers": [
                {
                    "name": "trainer",
                    "volumeMounts": [{"name": "mine", "mountPath": "/x", "subPathExpr": "$(NS)"}],
                }
            ],
            "volumes": [{"name": "mine", "persistentVolumeClaim": {"claimName": "run1-payloads"}}],
        }
    }
    (error,) = refused(spec_dict)
    assert "mounts the payload volume read-write with subPathExpr (at /x)" in error


def test_another_containers_port_named_like_the_operators_is_refused(spec_dict):
    ports = [{"name": "dist", "containerPort": 1234}]
    spec_dict["trainer"]["template"] = {
        "spec": {"containers": [{"name": "helper", "image": "x", "ports": ports}]}
    }
    assert refused(spec_dict) == [
        "spec.trainer.template.spec.containers[helper].ports: container helper names a port "
        "dist, the name of one of the "
        "operator's ports in the same pod (port names are unique in a pod): rename it"
    ]


def test_unnamed_ports_of_two_protocols_get_two_service_port_names(spec_dict):
    ports = [{"containerPort": 5555}, {"containerPort": 5555, "protocol": "UDP"}]
    spec_dict["orchestrator"]["template"] = {
        "spec": {"containers": [{"name": "orchestrator", "ports": ports}]}
    }
    service = children_of(spec_dict)[("Service", "run1-orchestrator-headless")]
    assert [p["name"] for p in service["spec"]["ports"]] == ["port-5555", "port-5555-udp"]


def test_fs_groups_must_agree_when_a_run_directory_is_shared_inline_too(spec_dict):
    spec_dict["deploymentType"] = "SingleNode"
    spec_dict["runDirectory"] = {"mountPath": "/data"}
    spec_dict["inference"]["template"] = {"spec": {"securityContext": {"fsGroup": 1000}}}
    spec_dict["trainer"]["template"] = {"spec": {"securityContext": {"fsGroup": 2000}}}
    assert refused(spec_dict)[0].startswith("the pod templates set different securityContext")


def test_a_run_started_before_pod_templates_keeps_its_env_and_rank_replacement(spec_dict):
    """Layout 1: no names it may set itself are injected, and its trainers' Job still replaces
    ranks one by one (the operator restarts no group for it)."""
    spec_dict["trainer"]["env"] = [{"name": "MASTER_ADDR", "value": "mine"}]
    ctx = context(spec_dict, layout=1)
    assert run_errors(ctx) == []
    children = by_kind(build_children(ctx))
    job = children[("Job", "run1-trainer")]
    assert job["spec"]["backoffLimit"] == 3
    (trainer,) = job["spec"]["template"]["spec"]["containers"]
    env = env_of(trainer)
    assert env["MASTER_ADDR"] == "mine" and "NNODES" not in env
    assert "PAYLOADRUN_ORCHESTRATOR_HOST" not in env and env["PAYLOADRUN_RUN"] == "run1"
