"""Packages whose names load their modules on first use (PEP 562), so that a light module of
theirs can be imported without its siblings' dependencies (``--help`` reads option defaults)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_names(package: str, homes: Mapping[str, str]) -> Callable[[str], object]:
    """The package's module ``__getattr__``: each name of ``homes`` comes from the submodule it
    maps to, imported on first use and then kept on the package."""

    def get_attribute(name: str) -> object:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home}"), name)
        setattr(sys.modules[package], name, value)  # later look-ups skip this function
        return value

    return get_attribute
