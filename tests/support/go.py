"""Go from Debian's packages, for the Go example (examples/go): never the Go module proxy.
Installed with apt-get when a package is missing, as the console's tests install Chromium;
once installed they stay, so later runs only check them."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

# The Go toolchain, gRPC and protobuf for Go in GOPATH mode (under /usr/share/gocode), and
# protoc with both Go plugins. Without golang-github-golang-protobuf-1-5-dev the older
# github.com/golang/protobuf 1.3 is picked and the first call panics.
PACKAGES = (
    "golang-go",
    "golang-google-grpc-dev",
    "golang-google-protobuf-dev",
    "golang-github-golang-protobuf-1-5-dev",
    "protobuf-compiler",
    "protoc-gen-go",
    "protoc-gen-go-grpc",
)
TOOLS = ("go", "protoc", "protoc-gen-go", "protoc-gen-go-grpc")
LOCK = Path(tempfile.gettempdir()) / "dispo-go-packages.lock"


class GoUnavailable(RuntimeError):
    """Go cannot be installed here: no apt-get, or not allowed to use it."""


def missing_packages() -> list[str]:
    """The packages of ``PACKAGES`` dpkg does not hold installed."""
    if shutil.which("dpkg-query") is None:
        return list(PACKAGES)
    shown = subprocess.run(
        ["dpkg-query", "-W", "-f=${Package} ${db:Status-Status}\n", *PACKAGES],
        capture_output=True,
        text=True,
        check=False,
    )
    installed = {
        line.split()[0] for line in shown.stdout.splitlines() if line.split()[1:] == ["installed"]
    }
    return [package for package in PACKAGES if package not in installed]


def _apt_get(apt: str, *args: str) -> None:
    done = subprocess.run(
        [apt, *args],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        check=False,
    )
    if done.returncode != 0:
        output = (done.stdout + done.stderr)[-4000:]
        raise RuntimeError(f"apt-get {' '.join(args)} failed ({done.returncode}):\n{output}")


def ensure_go() -> Path:
    """The ``go`` binary, the packages of ``PACKAGES`` installed first when one is missing.
    GoUnavailable where apt-get cannot be used (no apt-get, not root); a failing apt-get
    is an error."""
    with LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one installer at a time across test workers
        missing = missing_packages()
        if missing:
            apt = shutil.which("apt-get")
            if apt is None:
                raise GoUnavailable(f"missing {' '.join(missing)} and no apt-get to install them")
            if os.geteuid() != 0:
                raise GoUnavailable(f"missing {' '.join(missing)}; apt-get needs root")
            _apt_get(apt, "update", "-qq")
            _apt_get(apt, "install", "-y", "-qq", "--no-install-recommends", *missing)
    absent = [tool for tool in TOOLS if shutil.which(tool) is None]
    if absent:
        raise RuntimeError(f"installed {' '.join(PACKAGES)} but {' '.join(absent)} not on PATH")
    go = shutil.which("go")
    assert go is not None
    return Path(go)


EXAMPLE_BUILD = Path(__file__).resolve().parents[2] / "examples" / "go" / "build.sh"
BUILD_LOCK = Path(tempfile.gettempdir()) / "dispo-go-example-build.lock"


def build_example() -> Path:
    """The folder of the Go example's binaries (``dispo-go``, ``ticket-worker``), built by
    its build.sh with Go installed first when missing (its build cache is kept under
    examples/go/build, so a later build is quick; one build at a time, as test workers share
    it). GoUnavailable as :func:`ensure_go`."""
    go = ensure_go()
    with BUILD_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time: they share examples/go/build
        built = subprocess.run(
            [str(EXAMPLE_BUILD)],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "PATH": f"{go.parent}{os.pathsep}{os.environ['PATH']}"},
            check=False,
        )
    if built.returncode != 0:
        raise RuntimeError(f"examples/go/build.sh failed:\n{built.stdout}{built.stderr}")
    return Path(built.stdout.strip().splitlines()[-1]).parent
