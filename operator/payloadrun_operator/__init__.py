"""payloadrun's Kubernetes operator (kopf): reconciles PayloadRun resources.

In wings, lowest first: :mod:`api` (the resource and its vocabulary), :mod:`platform` (the
client, election, endpoints, settings), :mod:`desired` (what a run should be: pure functions),
:mod:`observed` (what it is, read from its children); :mod:`handlers` validates, builds, applies
and reports. docs/operator.md#the-operators-files maps every module. It talks to the API server
through kopf and a small aiohttp client (:mod:`platform.kube`), not the official Kubernetes
client, which its image does not have (what that saves: :mod:`platform.kube`).
"""

from payloadrun.version import __version__

__all__ = ["__version__"]
