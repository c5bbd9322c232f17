"""The writer sidecar: a reverse proxy beside vLLM that moves payload arrays by handle.

``transform`` holds the decisions (pure functions over parsed JSON), ``rewrite`` the blocking work
run on threads, ``app`` the aiohttp server, ``metrics`` its Prometheus metrics and ``cli`` the
``payloadrun writer`` command.
"""
