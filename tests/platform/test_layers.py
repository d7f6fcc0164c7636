"""The layers of docs/architecture.md, read from the code: each package imports only the
layers below it (ADR-0087).

    dispo.tools                  the operator's command, the local stack, the benchmarks
    dispo.<service>, dispo.auth  the services and the auth context
    dispo.sdk                    the client customers import
    dispo.libs                   the kernel and the service runtime

The kernel imports nothing above it; the SDK only the kernel; a service the kernel, the auth
context and the SDK, never another service; the tools anything. The roots are pyproject's
package-dir, so a new service is checked without an edit here.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROOTS: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
    "package-dir"
]
KERNEL, SDK, TOOLS, AUTH = "dispo.libs", "dispo.sdk", "dispo.tools", "dispo.auth"
SERVICES = set(ROOTS) - {KERNEL, SDK, TOOLS}  # the auth context is placed as a service

# What each layer may import besides itself.
MAY_IMPORT: dict[str, set[str]] = {
    KERNEL: set(),
    SDK: {KERNEL},
    TOOLS: set(ROOTS),
    **{service: {KERNEL, SDK, AUTH} for service in SERVICES},
}
# Imports across the layers still to move below them (none now).
NOT_YET_BELOW: set[tuple[str, str]] = set()


def layer_of(module: str) -> str | None:
    """The package root a ``dispo.`` module belongs to (None: not one of ours)."""
    owners = [name for name in ROOTS if module == name or module.startswith(f"{name}.")]
    return max(owners, key=len) if owners else None


def imported_modules(path: Path) -> Iterator[str]:
    """Every absolute module a file imports, by statement or by ``import_module("...")``."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            in {"import_module", "__import__"}
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.args[0].value


def crossings(layer: str) -> set[tuple[str, str]]:
    """(file, module) for each import of a layer that reaches a layer it may not import; a
    module is named once (``from dispo.tools.bench import latency_line``: dispo.tools.bench)."""
    allowed = MAY_IMPORT[layer] | {layer}
    found = set()
    for path in sorted((ROOT / ROOTS[layer]).rglob("*.py")):
        above = {m for m in imported_modules(path) if layer_of(m) not in {None, *allowed}}
        file = str(path.relative_to(ROOT))
        found |= {(file, m) for m in above if not any(m.startswith(f"{o}.") for o in above)}
    return found


def test_the_kernel_imports_neither_the_sdk_nor_the_tools_nor_any_service():
    assert crossings(KERNEL) == set()


def test_the_sdk_imports_only_the_kernel():
    assert crossings(SDK) == set()


def test_a_service_imports_the_kernel_the_auth_context_and_the_sdk_but_no_other_service():
    found = {crossing for service in sorted(SERVICES) for crossing in crossings(service)}
    assert found - NOT_YET_BELOW == set(), "a service reaches above its layer"
    assert NOT_YET_BELOW - found == set(), "moved below: take it off NOT_YET_BELOW"


def private_imports(layer: str, package: str) -> set[tuple[str, str]]:
    """(file, module) for each import of a layer that reaches a private (``_``) module of
    ``package``."""
    found = set()
    for path in sorted((ROOT / ROOTS[layer]).rglob("*.py")):
        file = str(path.relative_to(ROOT))
        found |= {
            (file, m)
            for m in imported_modules(path)
            if m.startswith(f"{package}._") and m.count(".") == package.count(".") + 1
        }
    return found


def test_services_and_tools_import_only_the_sdks_public_names():
    """The SDK's ``_`` modules are its internals (its docstring): a service or a tool uses
    its public names, and what it shares with the SDK below both, in the kernel (as the
    requests of the gateway's task reads, dispo.libs.task_requests)."""
    users = sorted(SERVICES | {TOOLS})
    found = {crossing for layer in users for crossing in private_imports(layer, SDK)}
    assert found == set()


def test_the_walk_sees_every_kind_of_import(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "import dispo.gateway.app\n"
        "from dispo.tools.stack import state\n"
        "from . import sibling\n"
        "import importlib\n"
        "importlib.import_module('dispo.pool.bench')\n"
    )
    modules = set(imported_modules(source))
    assert {"dispo.gateway.app", "dispo.tools.stack", "dispo.pool.bench"} <= modules
    assert layer_of("dispo.tools.stack.state") == TOOLS
    assert layer_of("dispo.libs.auth.server") == KERNEL
    assert layer_of("dispo.auth.store") == AUTH
    assert layer_of("grpc") is None
    source.write_text("from dispo.sdk._client import list_request\nfrom dispo.sdk import _types\n")
    assert {"dispo.sdk._client", "dispo.sdk._types"} <= set(imported_modules(source))
