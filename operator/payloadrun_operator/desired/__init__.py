"""The desired state: what a run should be. Admission, the run's context and what it is pinned to,
the children's manifests (builders, the pods' env, volumes and sidecar containers, pod templates,
network policies) and the decisions they rest on.

Pure functions of the spec and the settings; imports only the API and platform wings.
"""
