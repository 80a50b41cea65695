"""Package attributes imported on first use (PEP 562), so importing a package costs nothing
until a name is used: `ctxlab rag ask` through a server never loads numpy or torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable, MutableMapping


def lazy_attributes(
    package: str, where: dict[str, str], namespace: MutableMapping[str, object]
) -> Callable[[str], object]:
    """A module `__getattr__` that imports `name` from `where[name]` once and keeps it in
    the package's `namespace` (so the next lookup is an ordinary attribute)."""

    def __getattr__(name: str) -> object:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)
        namespace[name] = value
        return value

    return __getattr__
