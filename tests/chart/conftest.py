import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from payloadrun_devcluster import BinariesMissing, find_binaries
from payloadrun_devkit import required
from payloadrun_devkit.release import release_version

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "payloadrun"
VERSION = release_version(REPO)  # the images' default tag and the chart's labels


@pytest.fixture(scope="session")
def helm() -> str:
    """The helm that cluster/build.sh built, else one on PATH."""
    try:
        return str(find_binaries(("helm",)).path("helm"))
    except BinariesMissing as exc:
        found = shutil.which("helm")
        if found:
            return found
        required.skip_or_fail(str(exc))


def run_helm(helm: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([helm, *args], capture_output=True, text=True, timeout=120, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result


def render(
    helm: str,
    *sets: str,
    namespace: str = "payloadrun-system",
    values: Path | None = None,
    release: str = "rel",
    crd: bool = False,
) -> list[dict]:
    """The chart's objects, without the CRD (1.5 MB a render) unless ``crd``."""
    args = ["template", release, str(CHART), "--namespace", namespace]
    if not crd:
        args += ["--set", "crds.install=false"]
    if values is not None:
        args += ["--values", str(values)]
    for s in sets:
        args += ["--set", s]
    # the C loader: a render with the CRD is 1.5 MB of YAML
    docs = yaml.load_all(run_helm(helm, *args).stdout, Loader=yaml.CSafeLoader)
    return [d for d in docs if d]


def refused(helm: str, value: str) -> str:
    """helm template with ``--set value``, which the chart must refuse; its error output."""
    result = run_helm(helm, "template", "rel", str(CHART), "--set", value, check=False)
    assert result.returncode != 0, f"--set {value} was accepted"
    return result.stderr


def by_kind(docs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for doc in docs:
        out.setdefault(doc["kind"], []).append(doc)
    return out


def env_of(container: dict) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def operator_container(docs: list[dict]) -> dict:
    (deploy,) = by_kind(docs)["Deployment"]
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    return container
