"""Write the pod-template definitions the CRD embeds, from the pinned Kubernetes' OpenAPI.

python hack/kubernetes_openapi.py           # rewrite operator/payloadrun_operator/api/openapi/...
python hack/kubernetes_openapi.py --check   # exit 1 when the committed file differs

The document is ``api/openapi-spec/v3/api__v1_openapi.json`` of ``k8s.io/kubernetes`` at
``KUBERNETES_VERSION`` (cluster/versions.env), from the Go module cache that
``cluster/build.sh`` fills (``go mod download`` fetches it otherwise). After changing the
version: run this, then
``python -m payloadrun_operator.api.crd > crds/payloadrun.dev_payloadruns.yaml`` and
``python hack/crd_reference.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from payloadrun_devcluster.binaries import cache_dir, read_versions
from payloadrun_operator.api import kubeschema

OUT = Path(kubeschema.__file__).resolve().parent / kubeschema.OPENAPI_FILE


def document_path(version: str) -> Path:
    """Where the Go module cache keeps the version's OpenAPI document."""
    return (
        cache_dir()
        / "go"
        / "mod"
        / "k8s.io"
        / f"kubernetes@{version}"
        / kubeschema.OPENAPI_DOCUMENT
    )


def download(version: str) -> None:
    env = {**os.environ, "GOMODCACHE": str(cache_dir() / "go" / "mod"), "GOFLAGS": "-mod=mod"}
    subprocess.run(["go", "mod", "download", f"k8s.io/kubernetes@{version}"], env=env, check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 on a difference")
    args = parser.parse_args(argv)
    version = read_versions()["KUBERNETES_VERSION"]
    path = document_path(version)
    if not path.exists():
        print(f"{path} is missing: downloading k8s.io/kubernetes@{version}", file=sys.stderr)
        download(version)
    text = kubeschema.render_openapi_file(kubeschema.extract(json.loads(path.read_text()), version))
    if args.check:
        if OUT.read_text() != text:
            print(
                f"{OUT} differs from Kubernetes {version}'s OpenAPI: run {__file__}",
                file=sys.stderr,
            )
            return 1
        return 0
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT} ({len(text)} bytes) from {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
