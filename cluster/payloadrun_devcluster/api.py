"""One JSON call to the Kubernetes API with the standard library (the cluster's admin calls and
the provisioner's), authenticated by the client certificate of an SSL context."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request


def api_request(
    server: str,
    context: ssl.SSLContext,
    method: str,
    path: str,
    body: dict | None = None,
    timeout: float = 10.0,
) -> tuple[int, dict]:
    """(HTTP status, the decoded JSON body or {}); error statuses are returned, not raised."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(server + path, data=data, method=method)
    request.add_header("Accept", "application/json")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            raw, status = response.read(), response.status
    except urllib.error.HTTPError as error:
        raw, status = error.read(), error.code
    try:
        decoded = json.loads(raw) if raw else {}
    except ValueError:
        decoded = {"raw": raw.decode(errors="replace")}
    return status, decoded if isinstance(decoded, dict) else {"items": decoded}
