"""kopf's record of the last handled spec as a digest: a change is still a change, nothing else
is, and a record an older operator wrote whole reads as the same digest."""

import copy
import json

import kopf
from bad_runs import BASE_RUN

from payloadrun_operator.api.names import ANNOTATION_PREFIX, DIFFBASE_KEY
from payloadrun_operator.platform.diffbase import DIGEST, DigestDiffBaseStorage

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
