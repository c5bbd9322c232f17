"""payloadrun's Kubernetes operator (kopf): reconciles PayloadRun resources.

Decisions are pure functions (:mod:`decisions`, :mod:`builders`); :mod:`handlers` validates,
builds, applies and reports. It talks to the API server through kopf and a small aiohttp client
(:mod:`kube`), not the official Kubernetes client, which would more than double its memory.
"""

from payloadrun.version import __version__

__all__ = ["__version__"]
