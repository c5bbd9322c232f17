"""The children's watches ask the API server for the operator's children only, as kopf itself
resolves its settings for each resource it watches."""

import kopf

from payloadrun_operator.api.kinds import FOLLOWED, RUN
from payloadrun_operator.api.names import MANAGED_SELECTOR
from payloadrun_operator.handlers import configure_kopf
from payloadrun_operator.platform.settings import OperatorSettings


def resource(kind) -> kopf.Resource:
    group, _, version = kind.api_version.rpartition("/")
    return kopf.Resource(group, version, kind.plural, kind=kind.kind, namespaced=True)


def test_each_followed_kind_is_watched_with_the_managed_by_selector_and_runs_with_none():
    settings = kopf.OperatorSettings()
    configure_kopf(settings, OperatorSettings())
    selectors = settings.watching.label_selectors
    assert FOLLOWED  # claims, StatefulSets, Jobs at least
    for kind in FOLLOWED:
        assert list(selectors.collect(resource(kind))) == [MANAGED_SELECTOR], kind
    assert list(selectors.collect(resource(RUN))) == []
    # a kind the operator does not follow (pods: the benchmark's, the cluster's) gets none
    assert list(selectors.collect(kopf.Resource("", "v1", "pods", namespaced=True))) == []
