"""payloadrun's test harness, shipped apart from the product's code (as ``kopf.testing`` is kopf's).

The sidecars and the operator never import it. Tests, benchmarks and the demo do, and so do two
tools of the ``payloadrun`` command: ``payloadrun fake-vllm`` (which the end-to-end tests run in
the sidecar image as the inference container) and ``payloadrun simulate`` (which starts its own
retention sidecar).

- :mod:`~payloadrun.testing.fakevllm`: an upstream that speaks vLLM's wire format with
  deterministic routed experts and sampling masks (``payloadrun fake-vllm``; the end-to-end tests
  run it in the sidecar image as the inference container).
- :mod:`~payloadrun.testing.processes`: ``payloadrun`` commands as child processes on loopback
  (the fake vLLM, the writer, the retention sidecar), ``free_port`` and ``wait_http``.
- :mod:`~payloadrun.testing.images`: the project's container images (``hack/images.sh``) for the
  end-to-end tests and the demo.
- :mod:`~payloadrun.testing.required`: what the tests need from the machine, skipped when it is
  missing unless CI (``PAYLOADRUN_REQUIRE_CLUSTER``) requires it.

The operator's counterpart, ``payloadrun_operator.testing.LocalOperator``, runs the operator as a
local process against a cluster.
"""
