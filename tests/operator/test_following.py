"""The follower's cache: what it keeps of an event's object, and which run it concerns."""

import builders
from payloadrun_operator.observed.following import Cache, newer, owner_of, slim

RUN_LABEL = {"payloadrun.dev/run": "r1"}


def job(name: str, rv: str, labels=RUN_LABEL, ns: str = "ml") -> dict:
    return builders.job(name=name, resource_version=rv, labels=labels, namespace=ns)


def test_slim_drops_what_the_status_never_reads():
    full = job("r1-trainer", "5")
    full["metadata"]["managedFields"] = [{"manager": "payloadrun-operator"}]
    full["spec"] |= {"suspend": False, "template": {"spec": {"containers": []}}}
    kept = slim(full)
    assert "managedFields" not in kept["metadata"] and "template" not in kept["spec"]
    assert kept["spec"] == {"parallelism": 1, "suspend": False}
    assert kept["status"] == full["status"]
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


def test_a_write_newer_than_its_events_is_kept_and_a_deletion_is_final():
    """The reconcile's writes go into the cache (the API server's answer, a version its watch
    event brings later or has brought already): an older event does not undo a write, and a
    write's answer older than the object's deletion does not bring it back."""
    cache = Cache()
    cache.put("Job", job("r1-trainer", "10"))  # what an apply answered
    cache.put("Job", job("r1-trainer", "9"))  # the event of an earlier write, late
    assert cache.children[("ml", "Job", "r1-trainer")]["metadata"]["resourceVersion"] == "10"
    cache.put("Job", job("r1-trainer", "12"), deleted=True)
    cache.put("Job", job("r1-trainer", "11"))  # an answer sent before the deletion
    assert ("ml", "Job", "r1-trainer") not in cache.children
    cache.put("Job", job("r1-trainer", "13"))  # created again
    assert cache.children[("ml", "Job", "r1-trainer")]["metadata"]["resourceVersion"] == "13"
    # opaque resourceVersions: nothing is known older, the latest put wins
    cache.put("Job", job("r1-orchestrator", "b"))
    cache.put("Job", job("r1-orchestrator", "a"))
    assert cache.children[("ml", "Job", "r1-orchestrator")]["metadata"]["resourceVersion"] == "a"


def test_the_reconcile_reads_the_cache_once_synced_and_writes_through():
    import asyncio

    from payloadrun_operator.observed.following import Follower
    from payloadrun_operator.platform.kube import KubeClient
    from payloadrun_operator.platform.metrics import OperatorMetrics
    from payloadrun_operator.platform.runtime import Operator
    from payloadrun_operator.platform.settings import OperatorSettings

    async def main() -> None:
        op = Operator(OperatorSettings(), KubeClient(), OperatorMetrics())
        follower = Follower(op)
        managed = {"app.kubernetes.io/managed-by": "payloadrun-operator", **RUN_LABEL}
        follower.wrote(job("r1-trainer", "3", labels=managed))
        assert follower.live("Job", "ml", "r1-trainer") == (False, None)  # not synced: ask
        follower.synced.set()
        synced, live = follower.live("Job", "ml", "r1-trainer")
        assert synced and live["metadata"]["resourceVersion"] == "3"
        assert "template" not in live["spec"]  # slimmed as an event's object is
        assert follower.live("Job", "ml", "r1-orchestrator") == (True, None)
        # an object the watches do not deliver (no managed-by label) is not kept: nothing
        # would ever update or remove it
        follower.wrote(job("r1-orchestrator", "4", labels=RUN_LABEL))
        assert follower.live("Job", "ml", "r1-orchestrator") == (True, None)

    asyncio.run(main())
