"""The desired state: what a run should be. Admission, the children's manifests (builders,
pod templates, network policies), the decisions they rest on, and the run's lifecycle record.

Pure functions of the spec and the settings; imports only the API and platform wings.
"""
