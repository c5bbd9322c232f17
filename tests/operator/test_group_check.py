"""A group run's templates as the StatefulSets LeaderWorkerSet makes of them (pure parts): the
dry run's objects, and a refusal said at the run's template path with containers named."""

from __future__ import annotations

from builders import children_of, group_spec
from payloadrun_operator.desired import group_check


def lws_of(spec):
    (lws,) = [c for c in children_of(spec).values() if c["kind"] == "LeaderWorkerSet"]
    return lws


def test_each_template_becomes_a_statefulset_at_its_own_path():
    spec = group_spec()
    spec["inference"]["workerTemplate"] = {"spec": {"containers": [{"name": "vllm"}]}}
    lws = lws_of(spec)
    (leader_path, leader), (worker_path, worker) = group_check.statefulsets(lws, True)
    assert (leader_path, worker_path) == (
        "spec.inference.template",
        "spec.inference.workerTemplate",
    )
    templates = lws["spec"]["leaderWorkerTemplate"]
    assert leader["spec"]["template"] == templates["leaderTemplate"]
    assert worker["spec"]["template"] == templates["workerTemplate"]
    for sts in (leader, worker):
        assert (sts["apiVersion"], sts["kind"]) == ("apps/v1", "StatefulSet")
        assert sts["metadata"]["generateName"] == "payloadrun-check-"
        assert sts["metadata"]["namespace"] == lws["metadata"]["namespace"]
        labels = sts["spec"]["template"]["metadata"]["labels"]
        assert sts["spec"]["selector"] == {"matchLabels": labels}  # the API server insists
    # without a workerTemplate, the workers' pods come from spec.inference.template too
    assert [p for p, _ in group_check.statefulsets(lws_of(group_spec()), False)] == [
        "spec.inference.template",
        "spec.inference.template",
    ]


def test_a_refusal_is_said_at_the_template_path_with_containers_named():
    spec = group_spec()
    spec["inference"]["workerTemplate"] = {
        "spec": {"containers": [{"name": "proxy", "image": "p"}, {"name": "vllm"}]}
    }
    _, worker = group_check.statefulsets(lws_of(spec), True)[1]
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
