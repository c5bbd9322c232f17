"""The operator at run time: its settings, API client and metrics, passed to every handler.

A module of its own so that :mod:`handlers` and the pass both take a typed
:class:`Operator` without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from payloadrun_operator.platform.discovery import Discovery
from payloadrun_operator.platform.election import Heartbeat
from payloadrun_operator.platform.kube import KubeClient
from payloadrun_operator.platform.metrics import OperatorMetrics
from payloadrun_operator.platform.settings import OperatorSettings


@dataclass
class Operator:
    settings: OperatorSettings
    client: KubeClient
    metrics: OperatorMetrics
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    heartbeat: Heartbeat = field(default_factory=Heartbeat)  # beaten by the event loop
    # the add-on APIs the cluster served at start (LeaderWorkerSet), learnt at login
    discovery: Discovery = field(default_factory=Discovery)
