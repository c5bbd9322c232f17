"""A real network filesystem for the data path: one GlusterFS volume, a client per "node".

``nodes`` (module): a volume with the client's **default** caches, as users meet them, and three
independent FUSE clients of it standing for three nodes: ``inference`` (the writer writes through
it), ``orchestrator`` (the retention sidecar records, deletes, sweeps and wipes through it) and
``trainer`` (``PayloadReader`` reads through it). Each process sees its node's client at the one
path every pod of a run mounts the volume at (``nodes.root``): the writer and the retention
sidecar run in mount namespaces of their own (:func:`~payloadrun_devcluster.glusterfs.as_client`),
and this test process is the trainer. ``nodes.brick`` is the server's own directory, the ground
truth a check reads (never a client's cached view).

``faulty`` (module): the same on a volume of its own whose brick a test kills or stops (and
brings back before it ends),
with a short client ping timeout (``network.ping-timeout``, 42 s by default) so that a stopped
server is noticed within seconds.

GlusterFS needs root, ``/dev/fuse`` and Debian's packages (``bash cluster/node-packages.sh``);
without them these tests skip, or fail under ``PAYLOADRUN_REQUIRE_CLUSTER`` (``make test``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sharedfs_helpers import Nodes, make_nodes

from payloadrun_devcluster.glusterfs import (
    GlusterError,
    GlusterServer,
    teardown,
    unsupported_reason,
)
from payloadrun_devkit.required import skip_or_fail

PING_TIMEOUT_S = 2


@pytest.fixture(scope="session")
def gluster() -> Iterator[GlusterServer]:
    reason = unsupported_reason()
    if reason:
        skip_or_fail(f"GlusterFS cannot run here: {reason}")
    try:
        server = GlusterServer.ensure()
    except GlusterError as error:
        pytest.fail(str(error), pytrace=False)
    try:
        yield server
    finally:
        teardown(server)


@pytest.fixture(scope="module")
def nodes(gluster: GlusterServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    made = make_nodes(gluster, tmp_path_factory.mktemp("sharedfs"))
    try:
        yield made
    finally:
        gluster.delete_volume(made.volume.name)


@pytest.fixture(scope="module")
def faulty(gluster: GlusterServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    base = tmp_path_factory.mktemp("faulty")
    made = make_nodes(gluster, base, {"network.ping-timeout": str(PING_TIMEOUT_S)})
    try:
        yield made
    finally:
        gluster.delete_volume(made.volume.name)
