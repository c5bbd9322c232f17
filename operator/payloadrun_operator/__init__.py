"""payloadrun's Kubernetes operator (kopf): reconciles PayloadRun resources.

Decisions are pure functions (:mod:`decisions`, :mod:`builders`); :mod:`handlers` validates,
builds, applies and reports. It talks to the API server through kopf and a small aiohttp client
(:mod:`kube`), not the official Kubernetes client, which its image does not have (what that saves:
:mod:`kube`).
"""

from payloadrun.version import __version__

__all__ = ["__version__"]
