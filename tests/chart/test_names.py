"""nameOverride and fullnameOverride: every object's name follows them, the references too."""

import pytest

from .conftest import VERSION, by_kind, refused, render

EVERYTHING = ("serviceMonitor.enabled=true", "podMonitor.enabled=true")
NAMESPACED = "operator.watchNamespaces={team-a,team-b}"
DASHBOARDS = ("payloadrun-operator", "payloadrun-retention", "payloadrun-writer")


def names(docs) -> dict[str, set[str]]:
    return {kind: {d["metadata"]["name"] for d in ds} for kind, ds in by_kind(docs).items()}


def expected_names(fullname: str, *, namespaced: bool) -> dict[str, set[str]]:
    election, kueue = f"{fullname}-leader-election", f"{fullname}-kueue"
    bindings = (
        {"RoleBinding": {fullname, election}, "ClusterRoleBinding": {kueue}}
        if namespaced
        else {"ClusterRoleBinding": {fullname, kueue}, "RoleBinding": {election}}
    )
    return {
        "ServiceAccount": {fullname},
        "ClusterRole": {fullname, kueue},
        "Role": {election},
        **bindings,
        "Deployment": {fullname},
        "Service": {f"{fullname}-metrics"},
        "ServiceMonitor": {fullname},
        "PodMonitor": {f"{fullname}-sidecars"},
        "ConfigMap": {f"{fullname}-{board}" for board in DASHBOARDS},
    }


def assert_consistent(docs, *, name: str) -> None:
    """The references between objects hold, and the labels are the recommended ones."""
    kinds = by_kind(docs)
    (sa,) = kinds["ServiceAccount"]
    roles = {r["metadata"]["name"]: r for r in kinds["ClusterRole"]}
    (deploy,) = kinds["Deployment"]
    (election,) = kinds["Role"]  # the leader election's Lease, in the release's namespace
    assert election["metadata"]["namespace"] == deploy["metadata"]["namespace"]
    for binding in kinds.get("ClusterRoleBinding", []) + kinds.get("RoleBinding", []):
        ref = binding["roleRef"]
        granted = election if ref["kind"] == "Role" else roles[ref["name"]]
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": granted["kind"],
            "name": granted["metadata"]["name"],
        }
        assert binding["subjects"] == [
            {
                "kind": "ServiceAccount",
                "name": sa["metadata"]["name"],
                "namespace": sa["metadata"]["namespace"],
            }
        ]
    pod = deploy["spec"]["template"]
    assert pod["spec"]["serviceAccountName"] == sa["metadata"]["name"]
    selector = deploy["spec"]["selector"]["matchLabels"]
    assert selector == {
        "app.kubernetes.io/name": f"{name}-operator",
        "app.kubernetes.io/instance": "rel",
    }
    assert selector.items() <= pod["metadata"]["labels"].items()
    (service,) = kinds["Service"]
    assert service["spec"]["selector"] == selector
    (monitor,) = kinds["ServiceMonitor"]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    # the run pods are labelled by the operator, not by the chart: their selector never moves
    (pods,) = kinds["PodMonitor"]
    assert pods["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == "payloadrun"
    for doc in docs:
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == f"{name}-operator", doc["kind"]
        assert labels["app.kubernetes.io/instance"] == "rel"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/version"] == VERSION
        assert len(doc["metadata"]["name"]) <= 63


@pytest.mark.parametrize("namespaced", [False, True], ids=["cluster-wide", "namespaced"])
@pytest.mark.parametrize(
    ("sets", "fullname", "name"),
    [
        ((), "rel-payloadrun", "payloadrun"),
        (("nameOverride=prun",), "rel-prun", "prun"),
        (("fullnameOverride=ml-operator",), "ml-operator", "payloadrun"),
        (("nameOverride=prun", "fullnameOverride=ml-operator"), "ml-operator", "prun"),
    ],
    ids=["defaults", "nameOverride", "fullnameOverride", "both"],
)
def test_every_object_follows_the_name(helm, sets, fullname, name, namespaced):
    extra = (NAMESPACED,) if namespaced else ()
    docs = render(helm, *EVERYTHING, *extra, *sets)
    expected = expected_names(fullname, namespaced=namespaced)
    found = names(docs)
    assert {kind: found.get(kind) for kind in expected} == expected
    for doc in docs:  # the kinds above, and any the chart gains
        object_name = doc["metadata"]["name"]
        if doc["kind"] == "CustomResourceDefinition":  # named by its group, whatever the release
            assert object_name == "payloadruns.payloadrun.dev"
            continue
        assert object_name == fullname or object_name.startswith(f"{fullname}-"), object_name
    if namespaced:
        watched = [b for b in by_kind(docs)["RoleBinding"] if b["roleRef"]["kind"] == "ClusterRole"]
        assert {b["metadata"]["namespace"] for b in watched} == {"team-a", "team-b"}
    assert_consistent(docs, name=name)


def test_a_release_named_like_the_chart_is_not_repeated(helm):
    # the rule docs/operations.md gives: the release's name alone when it contains the chart's
    for release in ("payloadrun", "payloadrun-prod", "team-payloadrun"):
        assert names(render(helm, release=release))["Deployment"] == {release}
    assert names(render(helm, release="prun"))["Deployment"] == {"prun-payloadrun"}
    prun = render(helm, "nameOverride=prun", release="prun-prod")
    assert names(prun)["Deployment"] == {"prun-prod"}


def test_long_names_are_cut_to_63_and_stay_distinct(helm):
    long = "a" * 70
    docs = render(helm, *EVERYTHING, f"fullnameOverride={long}", f"nameOverride={'b' * 70}")
    found = names(docs)
    assert found["Deployment"] == {"a" * 63}
    assert found["Service"] == {"a" * 55 + "-metrics"}
    assert found["PodMonitor"] == {"a" * 54 + "-sidecars"}
    # three dashboards, three names, each ending with its dashboard
    assert len(found["ConfigMap"]) == 3
    assert {n.split("-", 1)[1] for n in found["ConfigMap"]} == set(DASHBOARDS)
    (deploy,) = by_kind(docs)["Deployment"]
    label = deploy["metadata"]["labels"]["app.kubernetes.io/name"]
    assert label == "b" * 54 + "-operator" and len(label) == 63
    for doc in docs:
        assert len(doc["metadata"]["name"]) <= 63, doc["metadata"]["name"]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("nameOverride=PayloadRun", "at '/nameOverride': 'PayloadRun' does not match pattern"),
        ("fullnameOverride=ml_operator", "at '/fullnameOverride': 'ml_operator' does not match"),
        ("fullnameOverride=-x", "at '/fullnameOverride'"),
        ("nameOverride[0]=x", "at '/nameOverride': got array, want string"),
    ],
)
def test_schema_rejects_bad_names(helm, value, message):
    error = refused(helm, value)
    assert message in error, error
