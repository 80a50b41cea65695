"""The import graph of ctxlab: arrows only point down the stack, and nothing imports in a circle.

Every `import` and `from ... import` in every module counts: at the top, inside a function
(a deferred import still couples the two modules) and under `TYPE_CHECKING`. `from pkg
import name` is an arrow to the module `pkg.name` when that is a module, else to `pkg`. The
layers are DESIGN.md's table, top to bottom, below the helpers every layer may use and
above which sit the CLI's commands; a package not placed here fails the test, so a new
package is placed on purpose.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "ctxlab"

# DESIGN.md's layers, lowest first; a module may import its own layer and those below.
LAYERS: list[tuple[str, set[str]]] = [
    (
        "helpers",
        {
            "ctxlab",
            "cache_dir",
            "errors",
            "inputs",
            "json_output",
            "lazy",
            "native",  # builds C kernels into the cache: model, engine and kv load them
            "outputs",
            "peer",
            "progress",
            "stats",
            "data",
        },
    ),
    ("representation", {"arch", "plan"}),
    ("allocation", {"kv"}),
    ("retention and selection", {"policy"}),
    ("execution", {"model", "engine", "engine_options"}),
    ("serving", {"serve", "sim", "bench", "probe", "lab", "kvevents"}),
    ("model use", {"eval"}),
    ("application", {"memory", "rag"}),
    ("interop", {"hf"}),
    ("lab", {"workshop"}),
    ("command line", {"commands", "cli"}),
]
RANK = {pkg: i for i, (_, pkgs) in enumerate(LAYERS) for pkg in pkgs}


def modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the ctxlab modules it imports (by any import statement anywhere in it)."""
    mods = modules()
    graph: dict[str, set[str]] = defaultdict(set)

    def known(name: str) -> str:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names
                ]
            for t in targets:
                if t == "ctxlab" or t.startswith("ctxlab."):
                    target = known(t)
                    if target and target != mod:
                        graph[mod].add(target)
    return graph


def layer_of(mod: str) -> int:
    top = mod.split(".")[1] if "." in mod else mod
    assert top in RANK, f"{top!r} is in no layer of LAYERS: place it (DESIGN.md's table)"
    return RANK[top]


def upward(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} -> {b}" for a, bs in graph.items() for b in bs if layer_of(b) > layer_of(a))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    nodes = set(graph) | {b for bs in graph.values() for b in bs}
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[v] = min(low[v], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_every_package_has_a_layer():
    for mod in modules():
        layer_of(mod)


def test_no_import_points_up_the_stack():
    assert upward(import_graph()) == []


def test_no_library_package_imports_the_commands():
    graph = import_graph()
    lib = [a for a in graph if layer_of(a) < RANK["commands"]]
    assert [f"{a} -> {b}" for a in lib for b in graph[a] if b.startswith("ctxlab.commands")] == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_the_checks_can_fail():
    """The graph sees what it must: a circle and an upward arrow are reported."""
    graph = {"ctxlab.kv.a": {"ctxlab.engine.b"}, "ctxlab.engine.b": {"ctxlab.kv.a"}}
    assert upward(graph) == ["ctxlab.kv.a -> ctxlab.engine.b"]
    assert cycles(graph) == [["ctxlab.engine.b", "ctxlab.kv.a"]]
    real = import_graph()  # a deferred import and a package's own re-export are arrows
    assert "ctxlab.engine.attention" in real["ctxlab.engine.runner"]
    assert "ctxlab.sim.synthetic" in real["ctxlab.sim.trace"]
