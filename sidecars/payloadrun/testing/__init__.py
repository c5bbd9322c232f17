"""payloadrun's test harness, shipped apart from the product's code (as ``kopf.testing`` is kopf's).

Nothing in the sidecars or the operator imports this package; tests, benchmarks, the demo and the
simulator's own sidecar do.

- :mod:`~payloadrun.testing.fakevllm`: an upstream that speaks vLLM's wire format with
  deterministic routed experts and sampling masks (``payloadrun fake-vllm``; the end-to-end tests
  run it in the sidecar image as the inference container).
- :mod:`~payloadrun.testing.processes`: ``payloadrun`` commands as child processes on loopback
  (the fake vLLM, the writer, the retention sidecar), ``free_port`` and ``wait_http``.

The operator's counterpart, ``payloadrun_operator.testing.LocalOperator``, runs the operator as a
local process against a cluster.
"""
