"""The observed state: what a run is, read from its children, and what that calls for. Following
the children, their readiness, how the run ends (outcome), the plan for applying a workload,
finishing and restarting, and the run's status computed from them.

Imports the API, platform and desired wings; the top level (handlers, __main__) wires it up.
"""
