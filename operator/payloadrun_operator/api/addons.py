"""The add-ons a run may need of its cluster (LeaderWorkerSet for replicas that span pods, Kueue
for a queued run): the API version the operator needs of each, the release that first served it,
the release its tests ran against, and what the operator says when the cluster does not serve
that version, whether the add-on is missing or too old (platform/discovery.py logs it at start,
observed/prerequisites.py puts it in a run's Applied condition)."""

from __future__ import annotations

import dataclasses

from payloadrun_operator.api.kinds import LEADER_WORKER_SET, WORKLOAD, Kind


@dataclasses.dataclass(frozen=True)
class Addon:
    name: str
    kind: Kind  # the kind whose API version the operator needs (the others share the version)
    tested: str  # the release the operator's tests run against (cluster/versions.env)
    first_serving: str | None  # the first release that serves kind.api_version
    install: str  # its installation page
    # fields of the kind's schema the operator sets, which older releases of that API version
    # lack (the API server would drop them: checked at start in the published OpenAPI schema),
    # and the first release that has them all
    required_fields: tuple[str, ...] = ()
    fields_from: str | None = None

    def needs(self) -> str:
        """What the operator needs of it, in words: the API version and the releases."""
        since = f"served from {self.name} {self.first_serving} on; " if self.first_serving else ""
        if self.fields_from:
            since = (
                f"with {', '.join(self.required_fields)}: from {self.name} {self.fields_from} on; "
            )
        return f"{self.kind.api_version} {self.kind.plural} ({since}tested with {self.tested})"

    def not_served(self, group_versions: tuple[str, ...]) -> str:
        """Why the cluster cannot give it: ``group_versions`` are the versions of the kind's API
        group the cluster serves (none: the add-on is not installed)."""
        if not group_versions:
            return (
                f"this cluster did not serve {self.needs()} when the operator started. Install "
                f"{self.name} ({self.install})"
            )
        return (
            f"this cluster served {self.kind.group} at {', '.join(group_versions)} only when the "
            f"operator started, an older {self.name} than the operator needs: "
            f"{self.needs()}. Upgrade {self.name} ({self.install})"
        )


LEADER_WORKER_SET_ADDON = Addon(
    "LeaderWorkerSet",
    LEADER_WORKER_SET,
    tested="v0.9.0",
    first_serving=None,
    install="https://lws.sigs.k8s.io/docs/installation/",
    # the groups' one DNS subdomain (builders): networkConfig came in v0.4.0 (read in the
    # modules of v0.3.0 and v0.4.0, api/leaderworkerset/v1/leaderworkerset_types.go); releases
    # before it serve v1 too
    required_fields=("spec.networkConfig.subdomainPolicy",),
    fields_from="v0.4.0",
)
# Kueue's v1beta2 API: introduced in v0.15.0 beside v1beta1 (kubernetes-sigs/kueue#7304), the
# storage version from v0.16, v1beta1 gone in v0.17
KUEUE_ADDON = Addon(
    "Kueue",
    WORKLOAD,
    tested="v0.19.2",
    first_serving="v0.15.0",
    install="https://kueue.sigs.k8s.io/docs/installation/",
)
ADDONS = {addon.kind: addon for addon in (LEADER_WORKER_SET_ADDON, KUEUE_ADDON)}
