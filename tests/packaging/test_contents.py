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
import platform
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
from packaging.version import Version

from payloadrun.version import RELEASE_FORM, python_version
from payloadrun.version import release_version as release_version_of
from payloadrun_devkit.release import release_version
from payloadrun_devkit.required import skip_or_fail

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = (REPO / "sidecars" / "Dockerfile", REPO / "operator" / "Dockerfile")
PRODUCT_PACKAGES = {"payloadrun", "payloadrun_operator"}
# dev-only distributions' import names: the local cluster, the development kit, the test runner
DEV_ONLY = {"payloadrun_devcluster", "payloadrun_devkit", "pytest", "_pytest"}
PRODUCT_EXTRAS = ("operator", "torch")  # the images take `operator`; torch stays optional
SITE_PACKAGES = re.compile(r"^opt/payloadrun/lib/python3\.\d+/site-packages/(.+)$")
LICENSE = REPO / "LICENSE"  # Apache-2.0, as pyproject.toml declares
IMAGE_LICENSE = "licenses/LICENSE"  # where both images carry it
OCI = "org.opencontainers.image."  # the annotations' prefix, in both images' labels


def build_context_sources(dockerfile: Path) -> list[str]:
    """The repository paths a Dockerfile's stages copy from the context (``COPY src... dst``;
    the dependencies' stage copies pyproject.toml, the build stage it again with the rest)."""
    sources: list[str] = []
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            sources.extend(words[1:-1])
    return list(dict.fromkeys(sources))


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


def wheel_license(wheel: zipfile.ZipFile) -> bytes:
    """The license file a wheel carries (core metadata 2.4: ``.dist-info/licenses/``), which its
    METADATA names in ``License-File``."""
    (metadata,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    assert "\nLicense-Expression: Apache-2.0\n" in wheel.read(metadata).decode()
    assert "\nLicense-File: LICENSE\n" in wheel.read(metadata).decode()
    (license_file,) = [n for n in wheel.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
    return wheel.read(license_file)


def test_the_wheel_carries_the_license(wheel: zipfile.ZipFile) -> None:
    assert LICENSE.read_text().split("\n", 3)[1].strip() == "Apache License"
    assert wheel_license(wheel) == LICENSE.read_bytes()


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
    assert "payloadrun_operator/api/openapi/core-v1-podtemplatespec.json" in wheel.namelist()
    # every module of the operator's wings ships (a subpackage left out of the package list not)
    operator = REPO / "operator"
    source = {
        p.relative_to(operator).as_posix() for p in (operator / "payloadrun_operator").rglob("*.py")
    }
    assert source <= modules, sorted(source - modules)


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


def image_file(tarball: Path, path: str) -> bytes | None:
    """One file's content in a docker-archive image (the last layer that has it wins)."""
    found = None
    with tarfile.open(tarball) as archive:
        (manifest,) = json.load(archive.extractfile("manifest.json"))
        for layer in manifest["Layers"]:
            with tarfile.open(fileobj=archive.extractfile(layer)) as files:
                for member in files:
                    if member.isfile() and member.name.removeprefix("./") == path:
                        found = files.extractfile(member).read()
    return found


def image_labels(tarball: Path) -> dict[str, str]:
    """A docker-archive image's labels (its config's ``config.Labels``)."""
    with tarfile.open(tarball) as archive:
        (manifest,) = json.load(archive.extractfile("manifest.json"))
        return json.load(archive.extractfile(manifest["Config"]))["config"].get("Labels") or {}


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
        assert image_file(tarball, IMAGE_LICENSE) == LICENSE.read_bytes(), (name, IMAGE_LICENSE)
        labels = image_labels(tarball)
        oci = {k.removeprefix(OCI): v for k, v in labels.items() if k.startswith(OCI)}
        assert oci.keys() >= {"title", "description", "source", "revision"}, (name, labels)
        assert (oci["version"], oci["licenses"]) == (release_version(REPO), "Apache-2.0"), name
        assert oci["source"] == "https://github.com/payloadrun/payloadrun", name
        site = [m.group(1) for f in image_files(tarball) if (m := SITE_PACKAGES.match(f))]
        assert product_modules(site) == want, (name, sorted(product_modules(site) ^ want))
        tops = {PurePosixPath(f).parts[0].split("-")[0] for f in site}
        assert not tops & DEV_ONLY, (name, sorted(tops & DEV_ONLY))


# ---- the release: one version, a wheel that installs alone ----------------------------------
PUBLISH = REPO / "hack" / "publish.sh"
CHART = REPO / "charts" / "payloadrun" / "Chart.yaml"


def publish(*args: str, script: Path = PUBLISH) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHON": sys.executable},
    )


def test_one_version_for_the_wheel_the_images_and_the_chart(wheel: zipfile.ZipFile) -> None:
    """pyproject.toml's version is the release's: the wheel's, what hack/publish.sh tags the
    images with and packages the chart at, and what Chart.yaml says (a chart installed from the
    checkout, as hack/install-chart.sh does, has the same version as the published one)."""
    import yaml

    version = release_version(REPO)
    assert RELEASE_FORM.fullmatch(version), f"pyproject.toml's version {version!r}"
    chart = yaml.safe_load(CHART.read_text())
    assert (chart["version"], chart["appVersion"]) == (version, version), (
        f"{CHART.relative_to(REPO)} says version {chart['version']}, appVersion "
        f"{chart['appVersion']}; pyproject.toml says {version}: make them equal"
    )
    # the wheel holds PEP 440's normal form of it (Helm refuses that form, pip takes both)
    (metadata,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    assert f"\nVersion: {python_version(version)}\n" in wheel.read(metadata).decode()
    printed = publish("version")
    assert (printed.returncode, printed.stdout) == (0, f"{version}\n"), printed.stderr


@pytest.mark.parametrize(
    ("written", "python"),
    [
        ("0.2.0", "0.2.0"),
        ("0.2.0-dev.0", "0.2.0.dev0"),
        ("1.10.3-alpha.2", "1.10.3a2"),
        ("0.2.0-beta.11", "0.2.0b11"),
        ("0.2.0-rc.1", "0.2.0rc1"),
    ],
)
def test_a_written_version_and_its_python_form_are_one_version(written, python) -> None:
    """payloadrun.version's forms agree with PEP 440 (packaging's normal form) both ways."""
    assert python_version(written) == python == str(Version(written))
    assert release_version_of(python) == written
    assert Version(python) == Version(written)


@pytest.mark.parametrize("bad", ["0.2", "v0.2.0", "0.2.0.dev0", "0.2.0-dev", "0.2.0-post.1"])
def test_a_version_in_another_form_is_refused_saying_which_forms_are_taken(bad) -> None:
    with pytest.raises(ValueError, match=r"MAJOR\.MINOR\.PATCH-LABEL\.N"):
        python_version(bad)


def publish_at(tmp_path: Path, version: str) -> Path:
    """A copy of hack/publish.sh in a tree whose pyproject.toml says ``version``."""
    (tmp_path / "hack").mkdir(parents=True)
    shutil.copy2(PUBLISH, tmp_path / "hack" / "publish.sh")
    (tmp_path / "pyproject.toml").write_text(f'[project]\nversion = "{version}"\n')
    return tmp_path / "hack" / "publish.sh"


def test_the_release_workflow_refuses_a_tag_that_is_not_the_version(tmp_path: Path) -> None:
    for version in ("0.2.0", "0.2.0-rc.1"):
        script = publish_at(tmp_path / version, version)
        assert publish("check-tag", f"v{version}", script=script).returncode == 0
        for wrong in (version, f"v{version}.1", "v0.0.0-rc1"):
            refused = publish("check-tag", wrong, script=script)
            assert refused.returncode != 0, wrong
            assert f"not v{version}, the version in pyproject.toml" in refused.stderr


def test_no_tag_publishes_a_development_version(tmp_path: Path) -> None:
    """The tree between releases says 0.2.0-dev.0: tagging it would publish unreleased work."""
    script = publish_at(tmp_path, "0.2.0-dev.0")
    for tag in ("v0.2.0-dev.0", "v0.2.0"):
        refused = publish("check-tag", tag, script=script)
        assert refused.returncode != 0, tag
        assert "0.2.0-dev.0, a version under development" in refused.stderr
        assert "to 0.2.0 (docs/releasing.md) and tag v0.2.0" in refused.stderr


def test_publish_images_takes_only_the_releases_architectures() -> None:
    """``--arch`` names one of the architectures the release publishes (and only for images):
    refused before anything is built, with the ones it takes."""
    refused = publish("images", "127.0.0.1:5000/payloadrun", "--arch", "riscv64")
    assert refused.returncode != 0
    assert "--arch 'riscv64' is not one of the release's architectures: amd64 arm64" in (
        refused.stderr
    )
    refused = publish("index", "127.0.0.1:5000/payloadrun", "--arch", "arm64")
    assert refused.returncode != 0 and "--arch is for images only" in refused.stderr
    # both commands are in the usage a wrong call prints
    usage = publish("nonsense").stderr
    assert "images PREFIX [--plain-http] [--arch ARCH]" in usage
    assert "index PREFIX [--plain-http]" in usage


def test_publish_refuses_a_version_in_a_form_helm_or_oci_would_not_take(tmp_path: Path) -> None:
    refused = publish("version", script=publish_at(tmp_path, "0.2.0.dev0"))
    assert refused.returncode != 0
    assert "'0.2.0.dev0' is not MAJOR.MINOR.PATCH" in refused.stderr


def images_wheelhouse() -> Path:
    """hack/images.sh's wheelhouse (the product's dependencies for CPython 3.11 on Linux)."""
    from payloadrun_devcluster.binaries import cache_dir

    # this machine's architecture's (hack/images.sh keeps one wheelhouse an architecture)
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    complete = sorted(cache_dir().glob(f"images/wheels-{arch}-*/.complete"))
    if not complete:
        skip_or_fail(
            f"no images wheelhouse (~/.cache/payloadrun/images/wheels-{arch}-*): make images"
        )
    if sys.version_info[:2] != (3, 11):
        skip_or_fail(f"the wheelhouse is CPython 3.11's; this is {sys.version.split()[0]}")
    return complete[-1].parent


@pytest.mark.timeout(300)
def test_the_wheel_installs_into_a_fresh_venv_and_its_commands_run(
    wheel: zipfile.ZipFile, tmp_path: Path
) -> None:
    """``pip install payloadrun[operator]`` as a user runs it, into a venv of its own, offline
    from the images' wheelhouse: nothing of the dev extra comes along, and both console scripts
    and ``import payloadrun`` work there (run from a directory with no checkout in it)."""
    wheelhouse = images_wheelhouse()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    # no PYTHONPATH (the tests' checkout on it would hide what the wheel installed)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_FIND_LINKS")}
    installed = subprocess.run(
        [
            *(str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"),
            *("--no-index", "--find-links", str(wheelhouse), f"{wheel.filename}[operator]"),
        ],
        capture_output=True, text=True, timeout=240, check=False, env=env,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-4000:]

    def run(*command: str) -> str:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=60, check=False, env=env, cwd=tmp_path
        )
        assert done.returncode == 0, (command, done.stderr[-4000:])
        return done.stdout

    for script in ("payloadrun", "payloadrun-operator"):
        assert run(str(venv / "bin" / script), "--help").startswith("usage:"), script
    where = run(
        str(python), "-c", "import payloadrun, payloadrun_operator; print(payloadrun.__file__)"
    )
    assert where.startswith(str(venv)), where
    listed = run(str(python), "-m", "pip", "list", "--format=json", "--disable-pip-version-check")
    names = {normalized(d["name"]) for d in json.loads(listed)}
    assert "payloadrun" in names and "kopf" in names
    dev = {normalized(Requirement(r).name) for r in dev_requirements()}
    assert not names & dev, f"dev-only distributions installed with the wheel: {names & dev}"


def dev_requirements() -> list[str]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        "dev"
    ]


@pytest.mark.timeout(300)
def test_publish_builds_the_sdist_and_the_wheel_at_the_version(tmp_path: Path) -> None:
    """``hack/publish.sh dist``, the release workflow's build of what goes to PyPI."""
    try:
        import build  # noqa: F401
    except ImportError:
        skip_or_fail("the 'build' package is missing (the dev extra has it): make venv")
    version = python_version(release_version(REPO))  # what pip and PyPI call it
    built = publish("dist", str(tmp_path), "--no-isolation")
    assert built.returncode == 0, built.stderr[-4000:]
    sdist, wheel_path = (Path(line) for line in built.stdout.split())
    assert (sdist.name, wheel_path.name) == (
        f"payloadrun-{version}.tar.gz",
        f"payloadrun-{version}-py3-none-any.whl",
    )
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
        root = f"payloadrun-{version}"
        shipped_files = (
            "pyproject.toml",
            "README.md",
            "LICENSE",
            "sidecars/payloadrun/__init__.py",
        )
        for shipped in shipped_files:
            assert f"{root}/{shipped}" in names, shipped
        assert archive.extractfile(f"{root}/LICENSE").read() == LICENSE.read_bytes()
    assert not [n for n in names if n.startswith((f"{root}/tests/", f"{root}/cluster/"))]
    with zipfile.ZipFile(wheel_path) as released:
        tops = {PurePosixPath(n).parts[0] for n in released.namelist()}
        assert wheel_license(released) == LICENSE.read_bytes()
    assert {t for t in tops if not t.endswith(".dist-info")} == PRODUCT_PACKAGES
