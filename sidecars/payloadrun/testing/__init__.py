"""payloadrun's test kit, on runtime dependencies only (as ``kopf.testing`` is kopf's).

The sidecars, the operator and the ``payloadrun`` command never import it. It ships in the
wheel and the sidecar image because the end-to-end pods run three of its modules:

- :mod:`~payloadrun.testing.fakevllm`: an upstream that speaks vLLM's wire format with
  deterministic routed experts and sampling masks
  (``python -m payloadrun.testing.fakevllm``, the end-to-end tests' inference container), with
  several API servers per process and a multi-node group's leader and workers
  (:mod:`~payloadrun.testing.fakegroup`).
- :mod:`~payloadrun.testing.roles`: the orchestrator and trainer stand-ins of those pods
  (``python -m payloadrun.testing.roles COMMAND``).
- :mod:`~payloadrun.testing.bootstrap`: NCCL's bootstrap pattern (prime-rl's NCCL weight
  broadcast: a store on port 29501, then connections both ways on ports the kernel picks) over
  plain sockets (``python -m payloadrun.testing.bootstrap rank|reach``), which the network
  policy test runs across a run's pods.
- :mod:`~payloadrun.testing.processes`: the fake vLLM, the writer and a real vLLM as child
  processes on loopback, ``free_port`` and ``wait_http``, for tests, benchmarks and the demo.

What needs the repository, root or pytest (the operator as a local process, the images, the
machine's requirements) is the development kit, ``payloadrun_devkit`` (``devkit/``), which no
wheel or image carries.
"""
