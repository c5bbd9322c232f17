import pytest

from builders import OWNER, SETTINGS, by_kind, children_of, context, env_of
from payloadrun_operator.desired.builders import build_children
from payloadrun_operator.desired.cleanup import build_cleanup


def test_by_handle_children(spec_dict):
    children = children_of(spec_dict)
    assert sorted(children) == [
        ("ConfigMap", "run1-settings"),
        ("Job", "run1-orchestrator"),
        ("Job", "run1-trainer"),
        ("NetworkPolicy", "run1-inference"),
        ("NetworkPolicy", "run1-orchestrator"),
        ("NetworkPolicy", "run1-trainer"),
        ("PersistentVolumeClaim", "run1-payloads"),
        ("Service", "run1-inference"),
        ("Service", "run1-inference-headless"),
        ("Service", "run1-orchestrator-headless"),
        ("Service", "run1-trainer-headless"),
        ("StatefulSet", "run1-inference"),
    ]
    for child in children.values():
        assert child["metadata"]["namespace"] == "ml"
        (owner,) = child["metadata"]["ownerReferences"]
        assert owner == OWNER
        assert child["metadata"]["labels"]["payloadrun.dev/run"] == "run1"


def test_claim_is_read_write_many(spec_dict):
    spec_dict["payloads"] = {"volume": {"size": "2Ti", "storageClassName": "nfs"}}
    claim = children_of(spec_dict)[("PersistentVolumeClaim", "run1-payloads")]
    assert claim["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "2Ti"}},
        "storageClassName": "nfs",
    }


def test_retained_claim_has_no_owner(spec_dict):
    spec_dict["payloads"] = {"volume": {"deletionPolicy": "Retain"}}
    claim = children_of(spec_dict)[("PersistentVolumeClaim", "run1-payloads")]
    assert "ownerReferences" not in claim["metadata"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "100Gi"


def test_existing_claim_is_used_not_created(spec_dict):
    spec_dict["payloads"] = {"volume": {"claimName": "team-nfs"}}
    children = children_of(spec_dict)
    assert not any(kind == "PersistentVolumeClaim" for kind, _ in children)
    pod = children[("Job", "run1-trainer")]["spec"]["template"]["spec"]
    assert pod["volumes"][0] == {
        "name": "payloads",
        "persistentVolumeClaim": {"claimName": "team-nfs"},
    }


def test_inference_pod_has_writer_sidecar_and_service_targets_it(spec_dict):
    children = children_of(spec_dict)
    sts = children[("StatefulSet", "run1-inference")]
    assert sts["spec"]["replicas"] == 2
    pod = sts["spec"]["template"]["spec"]
    (vllm,) = pod["containers"]
    (writer,) = pod["initContainers"]
    assert vllm["image"] == "vllm/vllm-openai:v0.33.0"
    # vLLM itself never touches the payload volume: its only mount is /dev/shm
    assert vllm["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]
    assert "PAYLOAD_ROOT" not in env_of(vllm)
    assert writer["restartPolicy"] == "Always" and writer["args"][0] == "writer"
    assert writer["image"] == "registry.example/payloadrun:test"
    assert env_of(writer) == {
        "PAYLOADRUN_RUN": "run1",
        "PAYLOADRUN_RUN_ID": "uid-123",
        "PAYLOADRUN_PAYLOAD_MODE": "ByHandle",
        "PAYLOADRUN_WRITER_UPSTREAM": "http://127.0.0.1:8000",
        "PAYLOADRUN_WRITER_HOST": "0.0.0.0",
        "PAYLOADRUN_WRITER_PORT": "8001",
        "PAYLOADRUN_WRITER_METRICS_HOST": "0.0.0.0",
        "PAYLOADRUN_WRITER_METRICS_PORT": "9401",
        "PAYLOAD_ROOT": "/payloads/ml/run1/payloads",
        "PAYLOADRUN_LOG_FORMAT": "json",
    }
    assert writer["volumeMounts"] == [
        {"name": "payloads", "mountPath": "/payloads", "readOnly": False}
    ]
    security = writer["securityContext"]
    assert security["runAsNonRoot"] and security["readOnlyRootFilesystem"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert writer["resources"] == SETTINGS.writer_resources
    service = children[("Service", "run1-inference")]
    assert service["spec"]["ports"][0]["targetPort"] == 8001
    assert service["spec"]["selector"] == {
        "payloadrun.dev/run": "run1",
        "app.kubernetes.io/component": "inference",
    }


def test_orchestrator_has_retention_sidecar_and_env(spec_dict):
    spec_dict["maxSteps"] = 100
    spec_dict["orchestrator"]["env"] = [{"name": "USER_VAR", "value": "1"}]
    children = children_of(spec_dict)
    job = children[("Job", "run1-orchestrator")]
    # one pod; a failed one is kept (its logs) and replaced only once it has stopped
    assert {k: v for k, v in job["spec"].items() if k != "template"} == {
        "suspend": False,
        "completions": 1,
        "parallelism": 1,
        "completionMode": "Indexed",  # its pod is run1-orchestrator-0 on its headless Service
        "backoffLimit": 3,
        "podReplacementPolicy": "Failed",
    }
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    (orch,) = pod["containers"]
    (retention,) = pod["initContainers"]
    env = env_of(orch)
    assert env["USER_VAR"] == "1"
    assert env["PAYLOAD_ROOT"] == "/payloads/ml/run1/payloads"
    assert env["PAYLOADRUN_RETENTION_URL"] == "http://127.0.0.1:8002"
    assert env["PAYLOADRUN_INFERENCE_URL"] == "http://run1-inference.ml.svc:8001"
    assert env["PAYLOADRUN_RUN_ID"] == "uid-123"
    assert env["PAYLOADRUN_MAX_STEPS"] == "100"
    assert "volumeMounts" not in orch
    renv = env_of(retention)
    assert renv["PAYLOAD_ROOT"] == "/payloads/ml/run1/payloads"
    assert renv["PAYLOADRUN_RUN_ID"] == "uid-123"
    assert (renv["PAYLOADRUN_RUN"], renv["PAYLOADRUN_PAYLOAD_MODE"]) == ("run1", "ByHandle")
    assert renv["PAYLOADRUN_RESUME"] == "false"
    assert renv["PAYLOADRUN_MAX_OFF_POLICY_STEPS"] == "8"
    assert renv["PAYLOADRUN_LOG_FORMAT"] == "json"
    assert retention["readinessProbe"]["httpGet"]["port"] == 9402
    assert pod["securityContext"]["fsGroup"] == SETTINGS.sidecar_uid


def test_trainer_mounts_read_only(spec_dict):
    children = children_of(spec_dict)
    pod = children[("Job", "run1-trainer")]["spec"]["template"]["spec"]
    (trainer,) = pod["containers"]
    assert trainer["volumeMounts"] == [
        {"name": "payloads", "mountPath": "/payloads", "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    assert env_of(trainer)["PAYLOAD_ROOT"] == "/payloads/ml/run1/payloads"
    assert "initContainers" not in pod


def test_inline_mode_adds_no_sidecar_and_no_volume(spec_dict):
    spec_dict["deploymentType"] = "SingleNode"
    children = build_children(context(spec_dict))
    kinds = by_kind(children)
    assert not any(kind == "PersistentVolumeClaim" for kind, _ in kinds)
    for child in children:
        if child["kind"] in ("StatefulSet", "Job"):
            pod = child["spec"]["template"]["spec"]
            assert "initContainers" not in pod
            assert {v["name"] for v in pod.get("volumes", [])} <= {"dshm"}  # no claim
            for container in pod["containers"]:
                assert "PAYLOAD_ROOT" not in env_of(container)
                assert env_of(container)["PAYLOADRUN_PAYLOAD_MODE"] == "Inline"
    service = kinds[("Service", "run1-inference")]
    assert [p["targetPort"] for p in service["spec"]["ports"]] == [8000]
    config = kinds[("ConfigMap", "run1-settings")]["data"]
    assert config["payloadMode"] == "Inline" and config["payloadModeReason"] == "SingleNode"
    assert "payloadRoot" not in config and "retentionUrl" not in config


def test_placement_applies_to_every_pod(spec_dict):
    spec_dict["placement"] = {
        "nodeSelector": {"pool": "gpu"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "serviceAccountName": "rl",
        "imagePullSecrets": [{"name": "regcred"}],
    }
    for child in build_children(context(spec_dict)):
        if child["kind"] in ("StatefulSet", "Job"):
            pod = child["spec"]["template"]["spec"]
            assert pod["nodeSelector"] == {"pool": "gpu"}
            assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
            assert pod["serviceAccountName"] == "rl"
            assert pod["imagePullSecrets"] == [{"name": "regcred"}]


def test_overrides(spec_dict):
    spec_dict["inference"]["writer"] = {
        "image": "mine/writer:2",
        "port": 9000,
        "args": ["--workers", "4"],
    }
    spec_dict["inference"]["command"] = ["vllm", "serve"]
    spec_dict["inference"]["resources"] = {"limits": {"nvidia.com/gpu": 8}}
    children = children_of(spec_dict)
    pod = children[("StatefulSet", "run1-inference")]["spec"]["template"]["spec"]
    writer = pod["initContainers"][0]
    assert writer["image"] == "mine/writer:2" and writer["args"] == ["writer", "--workers", "4"]
    assert env_of(writer)["PAYLOADRUN_WRITER_PORT"] == "9000"
    assert pod["containers"][0]["command"] == ["vllm", "serve"]
    assert pod["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 8}}


@pytest.mark.parametrize("name", ["a", "x" * 40])
def test_child_names_are_valid_dns_labels(spec_dict, name):
    import re

    for child in build_children(context(spec_dict, name=name)):
        child_name = child["metadata"]["name"]
        assert len(child_name) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", child_name)


def test_port_names_are_iana_service_names(spec_dict):
    import re

    for child in build_children(context(spec_dict)):
        pods = []
        if child["kind"] in ("StatefulSet", "Job"):
            pods.append(child["spec"]["template"]["spec"])
        for pod in pods:
            for container in pod["containers"] + pod.get("initContainers", []):
                for port in container.get("ports", []):
                    name = port["name"]
                    assert len(name) <= 15 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name)
        if child["kind"] == "Service":
            for port in child["spec"].get("ports", []):
                assert len(port["name"]) <= 15


def test_native_sidecars_are_started_only_once_they_serve(spec_dict):
    """The kubelet starts the main container after a native sidecar's startup probe passes: vLLM
    takes no traffic before its writer serves, the orchestrator calls no absent retention API."""
    children = children_of(spec_dict)
    inference = children[("StatefulSet", "run1-inference")]["spec"]["template"]["spec"]
    orchestrator = children[("Job", "run1-orchestrator")]["spec"]["template"]["spec"]
    for (sidecar,), port in (
        (inference["initContainers"], 8001),
        (orchestrator["initContainers"], 9402),
    ):
        probe = sidecar["startupProbe"]
        # liveness, not readiness: the writer's /readyz waits for vLLM, which starts after it
        assert probe["httpGet"] == {"path": "/healthz", "port": port}
        assert probe["periodSeconds"] * probe["failureThreshold"] >= 30
        # ready within a second of /readyz answering (vLLM's /health, for the writer), and
        # unready only after 15 s of failures
        ready = sidecar["readinessProbe"]
        assert ready["httpGet"] == {"path": "/readyz", "port": port}
        assert ready["periodSeconds"] == 1 and ready["failureThreshold"] == 15


def test_trainers_are_an_indexed_job_named_like_a_statefulsets_pods(spec_dict):
    spec_dict["trainer"]["replicas"] = 4
    spec_dict["failurePolicy"] = {"backoffLimit": 7}
    job = children_of(spec_dict)[("Job", "run1-trainer")]
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 4, 4)
    # any rank's failure fails the Job; the operator restarts every rank (restarts.py), counting
    # each restart once against the run's limit
    assert spec["backoffLimit"] == 0
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == "run1-trainer-headless"  # run1-trainer-<rank>.run1-trainer-headless
    assert pod["restartPolicy"] == "Never"


def test_a_suspended_run_has_workloads_without_pods(spec_dict):
    spec_dict["suspend"] = True
    ctx = context(spec_dict, uid="u", active=False)
    children = by_kind(build_children(ctx))
    assert children[("StatefulSet", "run1-inference")]["spec"]["replicas"] == 0
    assert children[("Job", "run1-orchestrator")]["spec"]["suspend"] is True
    assert children[("Job", "run1-trainer")]["spec"]["suspend"] is True
    # the claim is still built: suspending keeps the payloads
    assert ("PersistentVolumeClaim", "run1-payloads") in children


def test_the_cleanup_job_wipes_the_root_as_the_sidecars_user(spec_dict):
    ctx = context(spec_dict)
    job = build_cleanup(ctx)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == ["wipe", "--root", "/payloads/ml/run1/payloads", "--json"]
    assert container["image"] == SETTINGS.sidecar_image
    assert container["securityContext"]["runAsUser"] == SETTINGS.sidecar_uid
    assert container["volumeMounts"] == [
        {"name": "payloads", "mountPath": "/payloads", "readOnly": False}
    ]
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "run1-payloads"
    assert pod["restartPolicy"] == "Never"
    assert job["metadata"]["ownerReferences"][0]["kind"] == "PayloadRun"
