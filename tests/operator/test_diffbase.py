"""kopf's record of the last handled spec as a digest: a change is still a change, nothing else
is, and a record an older operator wrote whole reads as the same digest."""

import copy
import json
from pathlib import Path

import kopf
import yaml
from bad_runs import BAD, BASE_RUN

from payloadrun_operator.api.names import ANNOTATION_PREFIX, DIFFBASE_KEY
from payloadrun_operator.platform.diffbase import (
    DIGEST,
    DigestDiffBaseStorage,
    QuietProgressStorage,
    StatusDigestDiffBaseStorage,
    digest_of,
)

REPO = Path(__file__).resolve().parents[2]
KEY = f"{ANNOTATION_PREFIX}/{DIFFBASE_KEY}"


def storages() -> tuple[DigestDiffBaseStorage, kopf.AnnotationsDiffBaseStorage]:
    return (
        DigestDiffBaseStorage(prefix=ANNOTATION_PREFIX, key=DIFFBASE_KEY),
        kopf.AnnotationsDiffBaseStorage(prefix=ANNOTATION_PREFIX, key=DIFFBASE_KEY),
    )


def run(**meta) -> dict:
    body = copy.deepcopy(BASE_RUN)
    body["metadata"] = {"name": "r1", "namespace": "ml", "uid": "u1", **meta}
    return body


def stored(storage, body: dict) -> dict:
    """``body`` with the record ``storage`` writes for it, as kopf would patch it in."""
    patch = kopf.Patch()
    storage.store(body=kopf.Body(body), patch=patch, essence=storage.build(body=kopf.Body(body)))
    written = copy.deepcopy(body)
    annotations = written["metadata"].setdefault("annotations", {})
    annotations.update({k: v for k, v in patch["metadata"]["annotations"].items() if v})
    return written


def test_the_digest_changes_with_the_spec_and_the_annotations_only():
    digest, _ = storages()
    first = digest.build(body=kopf.Body(run(resourceVersion="1")))
    assert set(first) == {DIGEST}
    # what kopf and the API server change is no change: status, versions, kopf's own records
    same = run(resourceVersion="9", annotations={f"{ANNOTATION_PREFIX}/reconcile_run": "{}"})
    same["status"] = {"phase": "Running"}
    assert digest.build(body=kopf.Body(same)) == first
    spec = run()
    spec["spec"]["suspend"] = True
    assert digest.build(body=kopf.Body(spec)) != first
    rollout = run(annotations={"rollout.payloadrun.dev/sidecars": "now"})
    assert digest.build(body=kopf.Body(rollout)) != first


def test_the_record_is_a_digest_and_an_older_whole_one_reads_the_same():
    digest, whole = storages()
    body = run()
    written = stored(digest, body)
    record = written["metadata"]["annotations"][KEY]
    assert json.loads(record) == digest.build(body=kopf.Body(body)) and len(record) < 100
    assert digest.fetch(body=kopf.Body(written)) == digest.build(body=kopf.Body(body))
    # an older operator's record: the whole essence, read as its digest (no change seen)
    older = stored(whole, body)
    assert json.loads(older["metadata"]["annotations"][KEY])["spec"] == body["spec"]
    assert digest.fetch(body=kopf.Body(older)) == digest.build(body=kopf.Body(older))
    changed = copy.deepcopy(older)
    changed["spec"]["suspend"] = True
    assert digest.fetch(body=kopf.Body(changed)) != digest.build(body=kopf.Body(changed))
    assert digest.fetch(body=kopf.Body(run())) is None  # never handled: a creation


def status_record() -> StatusDigestDiffBaseStorage:
    return StatusDigestDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key=DIFFBASE_KEY, field="observedDigest"
    )


def test_the_record_in_the_status_is_written_by_the_reconcile_and_kopf_writes_none():
    record = status_record()
    body = run()
    assert record.fetch(body=kopf.Body(body)) is None  # never handled: a creation
    patch = kopf.Patch()
    record.store(body=kopf.Body(body), patch=patch, essence=record.build(body=kopf.Body(body)))
    assert not patch  # no request of kopf's: the status the reconcile writes holds it
    handled = copy.deepcopy(body)
    handled["status"] = {"observedDigest": record.digest(body)}
    assert record.fetch(body=kopf.Body(handled)) == record.build(body=kopf.Body(handled))
    relabelled = copy.deepcopy(handled)
    relabelled["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    assert record.fetch(body=kopf.Body(relabelled)) != record.build(body=kopf.Body(relabelled))


def test_an_older_operators_annotation_reads_as_handled_and_goes_with_the_next_change():
    digest, _ = storages()
    record = status_record()
    older = stored(digest, run())
    assert record.fetch(body=kopf.Body(older)) == record.build(body=kopf.Body(older))
    changed = copy.deepcopy(older)
    changed["spec"]["suspend"] = True
    patch = kopf.Patch()
    record.store(
        body=kopf.Body(changed), patch=patch, essence=record.build(body=kopf.Body(changed))
    )
    assert patch == {"metadata": {"annotations": {KEY: None}}}


def progress_patch(body: dict, handlers: list[str]) -> kopf.Patch:
    """The patch kopf leaves after ``handlers`` succeeded in this pass (stored, then purged)."""
    storage = QuietProgressStorage(prefix=ANNOTATION_PREFIX)
    patch = kopf.Patch()
    for handler in handlers:
        record = {"started": "2026-12-04T00:00:00", "success": True, "retries": 1}
        storage.store(key=handler, record=record, body=kopf.Body(body), patch=patch)
    for handler in handlers:
        storage.purge(key=handler, body=kopf.Body(body), patch=patch)
    return patch


def test_a_pass_that_succeeds_at_once_leaves_no_annotation_not_even_kopfs_marker():
    assert not progress_patch(run(), ["reconcile_run"])
    # kopf's own storage leaves its marker behind: one metadata patch a run for nothing
    plain = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
    patch = kopf.Patch()
    plain.store(key="reconcile_run", record={"success": True}, body=kopf.Body(run()), patch=patch)
    plain.purge(key="reconcile_run", body=kopf.Body(run()), patch=patch)
    assert patch == {"metadata": {"annotations": {f"{ANNOTATION_PREFIX}/kopf-managed": "yes"}}}


def test_a_record_that_stays_keeps_its_marker_and_a_purged_retry_drops_its_record():
    retried = run(annotations={f"{ANNOTATION_PREFIX}/reconcile_run": '{"retries":1}'})
    # purging the record of an earlier retry removes it; nothing of ours stays, no marker
    assert progress_patch(retried, ["reconcile_run"]) == {
        "metadata": {"annotations": {f"{ANNOTATION_PREFIX}/reconcile_run": None}}
    }
    # the marker that retry left goes with its record, in the same write
    marked = run(
        annotations={
            f"{ANNOTATION_PREFIX}/reconcile_run": '{"retries":1}',
            f"{ANNOTATION_PREFIX}/kopf-managed": "yes",
        }
    )
    assert progress_patch(marked, ["reconcile_run"]) == {
        "metadata": {
            "annotations": {
                f"{ANNOTATION_PREFIX}/reconcile_run": None,
                f"{ANNOTATION_PREFIX}/kopf-managed": None,
            }
        }
    }
    # a marker alone (an older operator's) is no reason for a write of its own
    alone = run(annotations={f"{ANNOTATION_PREFIX}/kopf-managed": "yes"})
    assert not progress_patch(alone, ["reconcile_run"])
    # a record kept (another handler's, still retried) keeps kopf's marker beside it
    storage = QuietProgressStorage(prefix=ANNOTATION_PREFIX)
    patch = kopf.Patch()
    storage.store(key="a", record={"retries": 1}, body=kopf.Body(run()), patch=patch)
    storage.store(key="b", record={"retries": 1}, body=kopf.Body(run()), patch=patch)
    storage.purge(key="a", body=kopf.Body(run()), patch=patch)
    kept = patch["metadata"]["annotations"]
    assert f"{ANNOTATION_PREFIX}/kopf-managed" in kept and f"{ANNOTATION_PREFIX}/b" in kept


def kopf_digest(body: dict) -> dict:
    """The digest of the essence as kopf's own (deep-copying) build makes it."""
    digest, _ = storages()
    essence = kopf.AnnotationsDiffBaseStorage.build(digest, body=kopf.Body(copy.deepcopy(body)))
    return digest_of(digest._without_own_annotations(essence))


def examples_and_bad_runs() -> list[dict]:
    examples = [
        doc
        for path in sorted((REPO / "examples").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("kind") == "PayloadRun"
    ]
    return examples + [case.run() for case in BAD]


METADATA_VARIANTS = [
    {},
    {"labels": {}, "annotations": {}},
    {"labels": {"team": "a"}, "annotations": {"note": "x"}},
    {
        "labels": {"team": "a"},
        "annotations": {
            KEY: '{"digest": "old"}',
            f"{ANNOTATION_PREFIX}/reconcile_run": "{}",
            f"{ANNOTATION_PREFIX}/kopf-managed": "yes",
            "other.example/kopf-managed": "yes",  # another kopf operator's records
            "other.example/handler": "{}",
            "kopf.zalando.org/last-handled-configuration": "{}",
            "kubectl.kubernetes.io/last-applied-configuration": "{}",
            "rollout.payloadrun.dev/sidecars": "now",
        },
        "resourceVersion": "7",
        "generation": 3,
        "managedFields": [{"manager": "kubectl"}],
    },
]


def test_the_digest_built_without_a_copy_is_kopfs_over_every_example_and_bad_run():
    digest, _ = storages()
    bodies = examples_and_bad_runs()
    assert len(bodies) > len(BAD)  # the examples were found
    for body in bodies:
        for meta in METADATA_VARIANTS:
            doc = copy.deepcopy(body)
            doc["metadata"] = {**doc.get("metadata", {}), **copy.deepcopy(meta)}
            doc["status"] = {"phase": "Running", "observedDigest": "d"}
            before = copy.deepcopy(doc)
            assert digest.build(body=kopf.Body(doc)) == kopf_digest(doc), meta
            assert doc == before  # and the body is left as it was
