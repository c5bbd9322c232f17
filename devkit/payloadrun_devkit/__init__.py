"""payloadrun's development kit: what the tests, benchmarks and demo of this repository need.

Never in the wheel or an image (``tests/packaging`` checks both), so it may need the
repository, root or pytest:

- :mod:`~payloadrun_devkit.local_operator`: the operator as a local process against a cluster
  (``LocalOperator``), run as in its image, without a Kubernetes client library.
- :mod:`~payloadrun_devkit.images`: the project's container images, from ``hack/images.sh``.
- :mod:`~payloadrun_devkit.previous`: the previous release (``CHANGELOG.md`` names it), checked
  out beside this tree and its images built by its own script, for the upgrade tests.
- :mod:`~payloadrun_devkit.release`: the release's version as the checkout writes it.
- :mod:`~payloadrun_devkit.required`: what the tests need from the machine, skipped when it is
  missing unless CI (``PAYLOADRUN_REQUIRE_CLUSTER``) requires it (imports pytest).

The local control plane and node are the other dev-only package, ``payloadrun_devcluster``
(``cluster/``); the product's own test kit, on runtime dependencies only, is
:mod:`payloadrun.testing` (the fake vLLM and the roles the end-to-end pods run).
"""
