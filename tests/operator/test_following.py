"""The follower's cache: what it keeps of an event's object, and which run it concerns."""

from payloadrun_operator.following import Cache, newer, owner_of, slim

RUN_LABEL = {"payloadrun.dev/run": "r1"}


def job(name: str, rv: str, labels=RUN_LABEL, ns: str = "ml") -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": ns,
            "resourceVersion": rv,
            "labels": labels,
            "managedFields": [{"manager": "payloadrun-operator"}],
        },
        "spec": {"parallelism": 2, "suspend": False, "template": {"spec": {"containers": []}}},
        "status": {"ready": 1},
    }


def test_slim_drops_what_the_status_never_reads():
    kept = slim(job("r1-trainer", "5"))
    assert "managedFields" not in kept["metadata"] and "template" not in kept["spec"]
    assert kept["spec"] == {"parallelism": 2, "suspend": False}
    assert kept["status"] == {"ready": 1}
    run = {
        "kind": "PayloadRun",
        "metadata": {
            "name": "r1",
            "namespace": "ml",
            "annotations": {"payloadrun.dev/last-handled-configuration": "{...}", "a": "b"},
        },
        "spec": {
            "suspend": True,
            "trainer": {"replicas": 2, "template": {"spec": {"containers": []}}},
            "failurePolicy": {"backoffLimit": 3},
        },
    }
    assert slim(run)["metadata"]["annotations"] == {"a": "b"}
    # a run keeps all of its spec but its components' pod templates
    assert slim(run)["spec"] == {
        "suspend": True,
        "trainer": {"replicas": 2},
        "failurePolicy": {"backoffLimit": 3},
    }
    assert run["spec"]["trainer"]["template"] == {"spec": {"containers": []}}  # not changed


def test_a_child_belongs_to_the_run_of_its_label():
    assert owner_of("Job", job("r1-trainer", "1")) == ("ml", "r1")
    assert owner_of("Job", job("other", "1", labels={})) is None
    assert owner_of("PayloadRun", {"metadata": {"name": "r1", "namespace": "ml"}}) == ("ml", "r1")


def test_newer_compares_resource_versions_as_etcd_writes_them():
    assert newer(job("a", "10"), job("a", "9"))
    assert not newer(job("a", "9"), job("a", "10"))
    assert not newer(job("a", "9"), job("a", "9"))


def test_a_list_replaces_the_cache_but_keeps_what_a_later_event_brought():
    cache = Cache()
    assert cache.put("Job", job("r1-trainer", "7")) == ("ml", "r1")
    cache.put("Job", job("r1-orchestrator", "3"))
    cache.put("Job", job("r2-trainer", "3", ns="other"))
    # a list taken before the trainer's event (rv 5 < 7), without the orchestrator (deleted)
    touched = cache.replace("Job", "ml", [job("r1-trainer", "5")])
    assert touched == {("ml", "r1")}
    assert cache.children[("ml", "Job", "r1-trainer")]["metadata"]["resourceVersion"] == "7"
    assert ("ml", "Job", "r1-orchestrator") not in cache.children
    assert ("other", "Job", "r2-trainer") in cache.children  # another namespace's list
    # a list item has no apiVersion: the cache gives the kind's
    assert cache.children[("ml", "Job", "r1-trainer")]["apiVersion"] == "batch/v1"
    cache.put("Job", job("r1-trainer", "8"), deleted=True)
    assert ("ml", "Job", "r1-trainer") not in cache.children
