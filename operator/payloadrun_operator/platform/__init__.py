"""The platform: the API server client, leader election, credentials, health and metrics
endpoints, the heap, the operator's settings and the handle the handlers share (runtime).

Imports only the API wing.
"""
