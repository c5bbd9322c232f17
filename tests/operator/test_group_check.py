"""A group run's templates as the StatefulSets LeaderWorkerSet makes of them (pure parts): the
dry run's objects, and a refusal said at the run's template path with containers named."""

from __future__ import annotations

from builders import children_of, group_spec
from payloadrun_operator.desired import group_check


def lws_of(spec):
    (lws,) = [c for c in children_of(spec).values() if c["kind"] == "LeaderWorkerSet"]
    return lws


def test_each_template_becomes_a_pod_template_and_a_statefulset_at_its_own_path():
    spec = group_spec()
    spec["inference"]["workerTemplate"] = {"spec": {"containers": [{"name": "vllm"}]}}
    lws = lws_of(spec)
    checks = group_check.checks(lws, True)
    assert [(path, check["kind"]) for path, check in checks] == [
        ("spec.inference.template", "PodTemplate"),
        ("spec.inference.template", "StatefulSet"),
        ("spec.inference.workerTemplate", "PodTemplate"),
        ("spec.inference.workerTemplate", "StatefulSet"),
    ]
    templates = lws["spec"]["leaderWorkerTemplate"]
    (_, leader_pods), (_, leader), (_, worker_pods), (_, worker) = checks
    for check, key in ((leader_pods, "leaderTemplate"), (leader, "leaderTemplate")):
        assert group_check.pod_template(check) == templates[key]
    for check in (worker_pods, worker):
        assert group_check.pod_template(check) == templates["workerTemplate"]
    assert leader_pods["template"] == leader["spec"]["template"]
    for _, check in checks:
        assert check["metadata"]["generateName"] == "payloadrun-check-"
        assert check["metadata"]["namespace"] == lws["metadata"]["namespace"]
    for sts in (leader, worker):
        assert (sts["apiVersion"], sts["kind"]) == ("apps/v1", "StatefulSet")
        labels = sts["spec"]["template"]["metadata"]["labels"]
        assert sts["spec"]["selector"] == {"matchLabels": labels}  # the API server insists
    assert (worker_pods["apiVersion"], worker_pods["kind"]) == ("v1", "PodTemplate")
    # without a workerTemplate, the workers' pods come from spec.inference.template too
    assert {p for p, _ in group_check.checks(lws_of(group_spec()), False)} == {
        "spec.inference.template"
    }


def test_a_refusal_is_said_at_the_template_path_with_containers_named():
    spec = group_spec()
    spec["inference"]["workerTemplate"] = {
        "spec": {"containers": [{"name": "proxy", "image": "p"}, {"name": "vllm"}]}
    }
    _, worker = group_check.checks(lws_of(spec), True)[3]
    names = [c["name"] for c in worker["spec"]["template"]["spec"]["containers"]]
    index = names.index("proxy")
    message = (
        'StatefulSet.apps "payloadrun-check-x7k2p" is invalid: [spec.template.spec.containers'
        f"[{index}].ports[0].containerPort: Invalid value: -1: must be between 1 and 65535, "
        'inclusive, spec.template.metadata.labels: Invalid value: "x": bad]'
    )
    said = group_check.refusal(message, "spec.inference.workerTemplate", worker)
    assert said == (
        "spec.inference.workerTemplate: the API server refuses its pods as a StatefulSet's (as "
        "LeaderWorkerSet's controller would create them): [spec.inference.workerTemplate.spec."
        "containers[proxy].ports[0].containerPort: Invalid value: -1: must be between 1 and "
        '65535, inclusive, spec.inference.workerTemplate.metadata.labels: Invalid value: "x": '
        "bad]"
    )


def test_a_pod_templates_refusal_is_said_the_same_way():
    """Before Kubernetes 1.34 only the PodTemplate's check sees a container's fields."""
    spec = group_spec()
    spec["inference"]["workerTemplate"] = {
        "spec": {"containers": [{"name": "proxy", "image": "p"}, {"name": "vllm"}]}
    }
    _, pods = group_check.checks(lws_of(spec), True)[2]
    names = [c["name"] for c in pods["template"]["spec"]["containers"]]
    message = (
        'PodTemplate "payloadrun-check-x7k2p" is invalid: template.spec.containers'
        f"[{names.index('proxy')}].ports[0].containerPort: Invalid value: -1: must be between 1 "
        "and 65535, inclusive"
    )
    said = group_check.refusal(message, "spec.inference.workerTemplate", pods)
    assert said == (
        "spec.inference.workerTemplate: the API server refuses its pods as a StatefulSet's (as "
        "LeaderWorkerSet's controller would create them): spec.inference.workerTemplate.spec."
        "containers[proxy].ports[0].containerPort: Invalid value: -1: must be between 1 and "
        "65535, inclusive"
    )
