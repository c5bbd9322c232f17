"""What the wheel and the two images ship: the product and its test kit, nothing dev-only.

The wheel is built from exactly what the Dockerfiles copy into their build stage (so a file the
images would miss, or one they should not carry, shows here first) and its module list is read
back. Every module must import only the standard library, the product's own packages and what
installing the product brings (its dependencies and its ``operator`` and ``torch`` extras, and
theirs): a module that imports pytest, the Kubernetes client or a dev-only package is test-only,
and the wheel may not hold it. The images' own site-packages, read from their tarballs layer by
layer, must hold the same product modules and no dev-only distribution.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path, PurePosixPath

import pytest
from packaging.requirements import Requirement

from payloadrun_devkit.required import skip_or_fail

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = (REPO / "sidecars" / "Dockerfile", REPO / "operator" / "Dockerfile")
PRODUCT_PACKAGES = {"payloadrun", "payloadrun_operator"}
# dev-only distributions' import names: the local cluster, the development kit, the test runner
DEV_ONLY = {"payloadrun_devcluster", "payloadrun_devkit", "pytest", "_pytest"}
PRODUCT_EXTRAS = ("operator", "torch")  # the images take `operator`; torch stays optional
SITE_PACKAGES = re.compile(r"^opt/payloadrun/lib/python3\.\d+/site-packages/(.+)$")


def build_context_sources(dockerfile: Path) -> list[str]:
    """The repository paths a Dockerfile's build stage copies (``COPY src... dst``)."""
    sources: list[str] = []
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            sources.extend(words[1:-1])
    return sources


def runtime_distributions() -> set[str]:
    """The distributions the product's install brings: its declared ones and theirs, closed."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"]]
    for extra in PRODUCT_EXTRAS:
        wanted += project["optional-dependencies"][extra]
    todo = [Requirement(r) for r in wanted]
    found: set[str] = set()
    while todo:
        requirement = todo.pop()
        name = normalized(requirement.name)
        if name in found or (requirement.marker and not requirement.marker.evaluate({"extra": ""})):
            continue
        found.add(name)
        # torch, an optional extra, may be missing from the environment
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            todo += [Requirement(r) for r in importlib.metadata.requires(name) or ()]
    return found


def normalized(distribution: str) -> str:
    return distribution.lower().replace("-", "_").replace(".", "_")


def runtime_import_names() -> set[str]:
    """Import names of :func:`runtime_distributions` (torch's own if it is not installed)."""
    distributions = runtime_distributions()
    names = {
        top
        for top, dists in importlib.metadata.packages_distributions().items()
        if any(normalized(d) in distributions for d in dists)
    }
    return names | {"torch"}


def imported_top_levels(source: str) -> set[str]:
    """Every top-level module a source imports, at module level or inside functions.

    An import guarded by ``except ImportError`` is optional (the code runs without it) and is
    not counted.
    """
    tree = ast.parse(source)
    optional = {
        id(node)
        for guard in ast.walk(tree)
        if isinstance(guard, ast.Try) and any(catches_import_error(h) for h in guard.handlers)
        for statement in guard.body
        for node in ast.walk(statement)
    }
    names = set()
    for node in ast.walk(tree):
        if id(node) in optional:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def catches_import_error(handler: ast.ExceptHandler) -> bool:
    caught = handler.type
    kinds = caught.elts if isinstance(caught, ast.Tuple) else [caught]
    return any(isinstance(k, ast.Name) and k.id.endswith("ImportError") for k in kinds) or any(
        isinstance(k, ast.Name) and k.id == "ModuleNotFoundError" for k in kinds
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """The product's wheel, built from the images' build context alone."""
    contexts = {tuple(build_context_sources(d)) for d in DOCKERFILES}
    assert len(contexts) == 1, f"the Dockerfiles copy different sources: {contexts}"
    (sources,) = contexts
    context = tmp_path_factory.mktemp("context")
    for source in sources:
        path = REPO / source
        if path.is_dir():
            shutil.copytree(path, context / source, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, context / source)
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"),
            *("--disable-pip-version-check", "-w", str(out), str(context)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PIP_NO_INDEX": "1"},
    )
    assert build.returncode == 0, build.stderr[-4000:]
    (built,) = out.glob("payloadrun-*.whl")
    return zipfile.ZipFile(built)


def product_modules(names: list[str]) -> set[str]:
    """The ``.py`` paths of the product's packages among ``names`` (paths inside a wheel)."""
    return {n for n in names if n.endswith(".py") and n.split("/")[0] in PRODUCT_PACKAGES}


def test_the_wheel_holds_the_product_packages_and_nothing_else(wheel: zipfile.ZipFile) -> None:
    tops = {PurePosixPath(n).parts[0] for n in wheel.namelist()}
    packages = {t for t in tops if not t.endswith(".dist-info")}
    assert packages == PRODUCT_PACKAGES, sorted(tops)
    modules = product_modules(wheel.namelist())
    # the test kit the end-to-end pods run ships; what needs the repository or pytest does not
    for shipped in ("payloadrun/testing/fakevllm.py", "payloadrun/testing/roles.py"):
        assert shipped in modules
    for gone in ("payloadrun/testing/required.py", "payloadrun_operator/testing.py"):
        assert gone not in modules
    assert "payloadrun_operator/openapi/core-v1-podtemplatespec.json" in wheel.namelist()


def test_every_module_in_the_wheel_imports_only_what_the_product_declares(
    wheel: zipfile.ZipFile,
) -> None:
    allowed = set(sys.stdlib_module_names) | PRODUCT_PACKAGES | runtime_import_names()
    assert not DEV_ONLY & allowed, DEV_ONLY & allowed
    strays = {}
    for name in sorted(product_modules(wheel.namelist())):
        extra = imported_top_levels(wheel.read(name).decode()) - allowed
        if extra:
            strays[name] = sorted(extra)
    assert not strays, f"modules in the wheel importing undeclared or dev-only modules: {strays}"


def test_the_product_command_imports_nothing_of_the_test_kit() -> None:
    code = (
        "import sys; from payloadrun.cli import build_parser; build_parser()\n"
        "import payloadrun.simulate, payloadrun_operator.handlers\n"
        "kit = sorted(m for m in sys.modules if m.startswith('payloadrun.testing')\n"
        "             or m.split('.')[0] in ('payloadrun_devkit', 'payloadrun_devcluster'))\n"
        "print(kit)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout


def image_files(tarball: Path) -> list[str]:
    """Every file path in a docker-archive image, across its layers (``manifest.json``)."""
    names: list[str] = []
    with tarfile.open(tarball) as archive:
        (manifest,) = json.load(archive.extractfile("manifest.json"))
        for layer in manifest["Layers"]:
            with tarfile.open(fileobj=archive.extractfile(layer)) as files:
                names.extend(m.name.removeprefix("./") for m in files if not m.isdir())
    return names


@pytest.mark.integration
@pytest.mark.timeout(1800)  # the first run on a machine builds the images
def test_the_images_hold_the_wheels_modules_and_nothing_dev_only(wheel: zipfile.ZipFile) -> None:
    if os.geteuid() != 0:
        skip_or_fail("needs root (hack/images.sh runs debootstrap and buildah)")
    from payloadrun_devkit.images import build_images

    want = product_modules(wheel.namelist())
    for name, tarball in build_images(REPO, timeout=1700).items():
        site = [m.group(1) for f in image_files(tarball) if (m := SITE_PACKAGES.match(f))]
        assert product_modules(site) == want, (name, sorted(product_modules(site) ^ want))
        tops = {PurePosixPath(f).parts[0].split("-")[0] for f in site}
        assert not tops & DEV_ONLY, (name, sorted(tops & DEV_ONLY))
