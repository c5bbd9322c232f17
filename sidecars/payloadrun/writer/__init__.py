"""The writer sidecar: a reverse proxy beside vLLM that moves payload arrays by handle.

Its rooms, from the outside in:

- ``cli``: the ``payloadrun writer`` command; ``config``: its settings (work and address).
- ``server``: the aiohttp app, its lifecycle and listeners: passthrough, by handle, probes.
- ``forwarding``: which headers a proxy forwards (RFC 9110 hop-by-hop).
- ``body``: a body with its content coding as one value, vLLM's answer read into one buffer.
- ``content_coding``: HTTP content codings (gzip, deflate, br), bounded decoding.
- ``budget``: the in-flight byte budget; ``payload_root``: the store opened on first use.
- ``root_monitor``: the payload root probed in the background (its health: metric, log, /readyz
  body; never readiness).
- ``breaker``: when to touch the volume at all (pure); ``write_threads``: the capped daemon
  threads that do, apart from the request pool, and the count of those a hang holds.
- ``plan``: the by-handle plan, pure functions over parsed JSON (request and response).
- ``blocking``: the work run on the thread pool: decode, parse, write, serialize.
- ``inline``: cutting routed-experts strings out of a raw body before parsing it.
- ``metrics``: its Prometheus metrics.
"""
