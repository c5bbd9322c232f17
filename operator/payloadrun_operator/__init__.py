"""payloadrun's Kubernetes operator (kopf): reconciles PayloadRun resources.

Decisions are pure functions (:mod:`decisions`, :mod:`builders`); :mod:`handlers` validates,
builds, applies and reports. It talks to the API server through kopf and a small aiohttp client
(:mod:`kube`), not the official Kubernetes client, which would triple its memory.
"""

__version__ = "0.1.0"
