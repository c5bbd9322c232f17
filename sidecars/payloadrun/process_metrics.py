"""What every payloadrun process exports about itself, beside its own metrics.

- ``payloadrun_build_info``: a gauge of 1 whose labels say which component (``operator``,
  ``writer``, ``retention``) of which version runs on which Python; Prometheus' own
  ``prometheus_build_info`` is the model. A plain gauge rather than client_python's ``Info``,
  which would append ``_info`` to the name.
- ``process_*`` (memory, CPU seconds, open and maximum file descriptors, start time, threads),
  ``python_gc_*`` and ``python_info``: client_python's process, garbage-collector and platform
  collectors, the families its default registry exports. Every component has registries of its
  own (tests run several writers in one process), so each registry gets its own collectors.
- No ``*_created`` series: client_python adds one per counter and histogram child (a second
  series with the creation time, which no dashboard or alert here reads). The switch is global
  in client_python; :func:`register` turns it off, so a process is covered as soon as it builds
  its metrics, and tests that build the apps in-process see what a scrape in a pod sees.
"""

from __future__ import annotations

import platform

from prometheus_client import (
    CollectorRegistry,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)

from payloadrun.version import __version__

BUILD_INFO = "payloadrun_build_info"
COMPONENTS = ("operator", "writer", "retention")


def register(registry: CollectorRegistry, component: str) -> Gauge:
    """Add build info and the process, GC and platform collectors to ``registry``."""
    if component not in COMPONENTS:
        raise ValueError(f"component must be one of {', '.join(COMPONENTS)}, got {component!r}")
    disable_created_metrics()
    build_info = Gauge(
        BUILD_INFO,
        "Always 1: the component, its version and the Python it runs on.",
        ["component", "version", "python_version"],
        registry=registry,
    )
    build_info.labels(component, __version__, platform.python_version()).set(1)
    ProcessCollector(registry=registry)
    GCCollector(registry=registry)
    PlatformCollector(registry=registry)
    return build_info
