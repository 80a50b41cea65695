"""Every `from ctxlab.X import name` names something X has, deferred imports included.

Commands and layers import inside functions (so `ctxlab --help` stays fast and torch loads
only where needed), and such an import fails only when its branch runs: a function that
moved away from `ctxlab.commands.options` broke `generate --offload-bytes` that way (issue
33). This reads every import statement of the package (no code runs) and checks that the
name is defined at the top level of the module it comes from, or is a submodule; a module
that makes names on demand (a module `__getattr__`) is imported to ask it.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ctxlab"


def _module_path(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _top_level_names(path: Path) -> tuple[set[str], bool]:
    """Names bound at the top level of a module (anywhere but inside a def or class), and
    whether it defines a module `__getattr__`."""
    names: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        else:
            for child in ast.walk(node):
                if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
                    names.add(child.id)
            stack.extend(
                c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt)
            )  # if/try/with blocks
    return names, "__getattr__" in names


def test_every_from_import_of_ctxlab_names_something_that_exists() -> None:
    cache: dict[str, tuple[set[str], bool]] = {}
    missing: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module):
                continue
            if node.module != "ctxlab" and not node.module.startswith("ctxlab."):
                continue
            source = _module_path(node.module)
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            namespace = ROOT.joinpath(*node.module.split(".")).is_dir()  # no __init__.py
            if source is None and not namespace:
                missing.append(f"{where}: no module {node.module}")
                continue
            if node.module not in cache:
                cache[node.module] = _top_level_names(source) if source else (set(), False)
            names, dynamic = cache[node.module]
            for alias in node.names:
                name = alias.name
                if name == "*" or name in names or _module_path(f"{node.module}.{name}"):
                    continue
                if dynamic and hasattr(importlib.import_module(node.module), name):
                    continue
                missing.append(f"{where}: {node.module} has no {name!r}")
    assert not missing, "imports of names that do not exist:\n" + "\n".join(missing)


def test_the_check_sees_a_moved_name(tmp_path: Path) -> None:
    names, _ = _top_level_names(PACKAGE / "engine_options.py")
    assert "has_sliding_layers" in names and "EngineOptions" in names
    options, _ = _top_level_names(PACKAGE / "commands" / "options.py")
    assert "has_sliding_layers" not in options  # what offload_options.py imported (issue 33)
