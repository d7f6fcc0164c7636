"""Package discovery for the layout fixed by the architecture: ``libs/`` is ``dispo.libs``,
``sdk/`` is ``dispo.sdk``, ``tools/`` is ``dispo.tools`` and ``services/<service>/`` is
``dispo.<service>`` (the roots are ``package-dir`` in pyproject.toml; docs/architecture.md).

Everything else is declared in pyproject.toml; only the package list is computed here, so that
every folder under a root ships, including those without ``__init__.py`` (each service's
``migrations/`` and ``migrations/versions/``, which Alembic loads as files), and a new
subpackage needs no edit. tests/platform/test_packaging.py checks the built wheel.
"""

import tomllib
from pathlib import Path

from setuptools import find_namespace_packages, setup

HERE = Path(__file__).resolve().parent
ROOTS: dict[str, str] = tomllib.loads((HERE / "pyproject.toml").read_text())["tool"]["setuptools"][
    "package-dir"
]


def packages() -> list[str]:
    found = []
    for name, root in ROOTS.items():
        found.append(name)
        subpackages = find_namespace_packages(
            str(HERE / root), exclude=["__pycache__", "*.__pycache__"]
        )
        found += [f"{name}.{sub}" for sub in subpackages]
    return sorted(found)


setup(packages=packages())
