"""The observed state: what a run is. Following its children, their readiness, finishing and
restarting, and the run's status computed from them.

Imports the API, platform and desired wings; the top level (handlers, __main__) wires it up.
"""
