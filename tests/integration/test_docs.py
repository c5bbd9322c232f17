"""Every command in the docs runs: each ```bash block of README.md, docs/ and cluster/README.md.

Blocks run as written, from the repository root, with the project's environment and the built
Kubernetes binaries on PATH. One command is not run here: the README's ``make test``, which is the
command running this test. Generated pages must match their generators.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from payloadrun_devkit import required

# The README's `make demo` and cluster/README.md's `up --node` start nodes of their own: they run
# before the session's cluster starts its node (one node per machine). docs/operator.md's
# generators, which rewrite files the other parts read (crds/, charts/, the vendored OpenAPI),
# run in a scratch copy of the checkout (generates()). The other blocks that reach a cluster
# start a control plane of their own on loopback, in a state directory of their own
# (PAYLOADRUN_DEVCLUSTER_DIR, see environment()): they run beside the node's tests, in make
# test's control-plane part (hack/test.py). A block with none of the machine's words needs no
# cluster and runs with the unit tests.
NODE = [pytest.mark.integration, pytest.mark.node_lifecycle]
NODE_WORDS = ("make demo", "--node")
MACHINE = [pytest.mark.integration]
MACHINE_WORDS = (
    "make ",
    "devcluster",
    "kubectl",
    "helm",
    "images.sh",
    "KUBECONFIG",
    "crds/",
    "charts/",
)

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", REPO / "cluster" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```(?:bash|sh)\n(.*?)^```", re.S | re.M)
NOT_RUN_HERE = {"make test"}  # this test is part of it


def blocks() -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        for i, match in enumerate(BLOCK.finditer(path.read_text())):
            found.append((f"{path.relative_to(REPO)}#{i}", match.group(1)))
    return found


def runnable(block: str) -> str:
    lines = [line for line in block.splitlines() if line.split("#")[0].strip() not in NOT_RUN_HERE]
    return "\n".join(lines)


def environment(kube_binaries: Path, state_dir: Path) -> dict[str, str]:
    """The project's environment, the built binaries on PATH, and the local cluster's state
    directory the test's own (``python -m payloadrun_devcluster`` reads it): a block's cluster
    never meets another part's, nor the developer's in ``~/.cache/payloadrun/devcluster``."""
    venv_bin = Path(sys.executable).parent
    path = os.pathsep.join([str(venv_bin), str(kube_binaries), os.environ.get("PATH", "")])
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    return {**env, "PATH": path, "PAYLOADRUN_DEVCLUSTER_DIR": str(state_dir)}


@pytest.fixture(scope="module")
def kube_binaries() -> Path:
    from payloadrun_devcluster import BinariesMissing, find_binaries

    try:
        return find_binaries().path("kubectl").parent
    except BinariesMissing as exc:
        required.skip_or_fail(str(exc))


def test_the_docs_have_commands():
    names = [name for name, _ in blocks()]
    assert any(n.startswith("README.md") for n in names)
    assert any(n.startswith("docs/operator.md") for n in names)


# The packages a generator imports, from the scratch copy (the venv's install is the checkout's).
PACKAGE_DIRS = ("operator", "sidecars", "cluster", "devkit")


def generates(script: str) -> bool:
    """Whether a block rewrites files of the checkout (the CRD, the chart's copy, the vendored
    OpenAPI): those run in a scratch copy, since the other parts of make test read those files
    meanwhile, and a shell's `>` empties a file before it writes it again."""
    return any(word in script for word in ("> crds/", "> charts/"))


def scratch_copy(into: Path) -> Path:
    """The checkout's tracked files, copied under ``into``."""
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, tracked):
        source, target = REPO / name.decode(), into / name.decode()
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return into


def drifted(copy: Path) -> list[str]:
    """The copy's files that differ from the checkout's (or that it lacks)."""
    return sorted(
        str(path.relative_to(copy))
        for path in copy.rglob("*")
        if path.is_file()
        and "__pycache__" not in path.parts
        and (
            not (REPO / path.relative_to(copy)).is_file()
            or (REPO / path.relative_to(copy)).read_bytes() != path.read_bytes()
        )
    )


def stop_left_cluster(env: dict[str, str]) -> None:
    """Stop the local cluster a block started and did not stop (it failed before its ``down``):
    its components run in sessions of their own, which the block's killpg does not reach, and
    would hold the machine through the rest of the suite."""
    if not Path(env["PAYLOADRUN_DEVCLUSTER_DIR"]).exists():
        return
    subprocess.run(
        [sys.executable, "-m", "payloadrun_devcluster", "down"],
        env=env,
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=120,
    )


def marks(block: str) -> list[pytest.MarkDecorator]:
    if any(word in block for word in NODE_WORDS):
        return NODE
    return MACHINE if any(word in block for word in MACHINE_WORDS) else []


@pytest.mark.parametrize(
    ("where", "block"), [pytest.param(n, b, id=n, marks=marks(b)) for n, b in blocks()]
)
def test_doc_block_runs(where, block, kube_binaries, tmp_path):
    script = runnable(block)
    if not script.strip():
        pytest.skip(f"{where} holds only `make test`, the command that runs this test")
    env = environment(kube_binaries, tmp_path / "devcluster")
    cwd = REPO
    if generates(script):
        cwd = scratch_copy(tmp_path / "repo")
        env["PYTHONPATH"] = os.pathsep.join(str(cwd / p) for p in PACKAGE_DIRS)
    # Its own session, so whatever a block leaves in the background is stopped with it.
    proc = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=900)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        stop_left_cluster(env)
    assert proc.returncode == 0, (
        f"{where} failed ({proc.returncode}):\n{script}\n--- stdout\n{stdout[-3000:]}"
        f"\n--- stderr\n{stderr[-3000:]}"
    )
    if cwd != REPO:  # what the generators wrote is what is committed: no drift
        assert drifted(cwd) == [], f"{where} regenerated files that differ from the committed ones"
    if "make demo" in script:
        assert "nothing left running" in stdout
        assert "Inline (Disaggregated)" in stdout and "ByHandle" in stdout
        if required.required():  # CI: a node runs, so real pods
            assert "A run whose pods run" in stdout, stdout[:3000]  # the head says why not
            assert "{'/payloads/" in stdout and ": False}" in stdout  # deleted on consume
            assert "The run finishes" in stdout and "PayloadsReleased: FilesDeleted" in stdout


@pytest.mark.parametrize(
    "generator", ["hack/crd_reference.py", "hack/dashboards.py", "hack/run_diagram.py"]
)
def test_generated_pages_are_current(generator):
    result = subprocess.run(
        [sys.executable, str(REPO / generator), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout
