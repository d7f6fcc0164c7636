"""The SDK a customer imports: ``from dispo.sdk import Client``, its public names listed in
``__all__`` and nothing else public, its internals in ``_private`` modules (ADR-0087)."""

import importlib
import pkgutil
import types

import dispo.sdk
import pytest

PUBLIC = {
    "AsyncClient",
    "BulkAction",
    "CatalogueVersion",
    "CellSpec",
    "Client",
    "Completion",
    "DispoError",
    "Firing",
    "NodeChange",
    "NodeView",
    "ProbeAnswer",
    "RetryableError",
    "RunContext",
    "Schedule",
    "Signalled",
    "Submitted",
    "TERMINAL",
    "TaskEvent",
    "TaskEventPage",
    "TaskPage",
    "TaskRequest",
    "TaskSummary",
    "TaskView",
    "Worker",
    "WorkerQueue",
    "cell",
    "cells",
}


def test_the_public_names_are_the_curated_list_and_each_is_defined():
    assert set(dispo.sdk.__all__) == PUBLIC
    assert len(dispo.sdk.__all__) == len(PUBLIC)
    for name in PUBLIC:
        assert getattr(dispo.sdk, name) is not None, name


def test_nothing_else_is_public_and_only_the_cells_module_is_not_private():
    public_modules = {
        module.name
        for module in pkgutil.iter_modules(dispo.sdk.__path__)
        if not module.name.startswith("_")
    }
    assert public_modules == {"cells"}
    exposed = {
        name
        for name, value in vars(dispo.sdk).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert exposed <= PUBLIC


def test_the_old_path_is_gone():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("dispo.libs.sdk")
