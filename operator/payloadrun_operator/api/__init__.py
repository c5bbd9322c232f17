"""The API: the PayloadRun resource's models, its CRD and schema checks, the names the operator
gives its children, and the vocabulary of its status (conditions, reasons, phases).

The lowest wing: it imports no other wing, so the CRD depends on nothing that computes status.
"""
