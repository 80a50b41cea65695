"""The workshop has one registry: the files that run, document, plot and select the
demonstrations name none of them by key or number (everything they need is declared on
`Demonstration`). A key as a string or an attribute (`cfg.eviction`), a set of numbers or a
number tested against a selection, or "demonstration 4" in a string fails here. No model
needed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from ctxlab.workshop.registry import REGISTERED

ROOT = Path(__file__).resolve().parents[2]
FILES = [
    "ctxlab/workshop/runner.py",
    "ctxlab/workshop/document.py",
    "ctxlab/workshop/context_numbers.py",
    "ctxlab/workshop/plots.py",
    "ctxlab/workshop/server_run.py",
    "ctxlab/workshop/server_findings.py",
    "ctxlab/workshop/request_backend.py",
    "ctxlab/workshop/session.py",
    "ctxlab/workshop/checklist.py",
    "ctxlab/workshop/verdicts.py",
    "ctxlab/commands/workshop.py",
]
KEYS = {d.key for d in REGISTERED}
NUMBERED = re.compile(r"\bdemonstrations? \d")


def hidden(source: str) -> list[str]:
    """Each place in `source` that names a registered demonstration."""
    found = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in KEYS:
                found.append(f"line {line}: the key {node.value!r}")
            if NUMBERED.search(node.value):
                found.append(f"line {line}: a numbered demonstration in {node.value[:60]!r}")
        elif isinstance(node, ast.Attribute) and node.attr in KEYS and _is_config(node.value):
            found.append(f"line {line}: the config section .{node.attr}")
        elif isinstance(node, ast.Set | ast.Tuple | ast.List) and _numbers(node.elts):
            found.append(f"line {line}: a collection of numbers")
        elif (
            isinstance(node, ast.Compare)
            and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)
            and _numbers([node.left])
        ):
            found.append(f"line {line}: a number tested for membership")
    return found


def _numbers(nodes: list[ast.expr]) -> bool:
    """Literal whole numbers, at least one of them a possible demonstration number."""
    values = [n.value for n in nodes if isinstance(n, ast.Constant) and type(n.value) is int]
    return bool(nodes) and len(values) == len(nodes) and any(v > 0 for v in values)


def _is_config(node: ast.expr) -> bool:
    """`cfg` or `x.cfg`: a demonstration's section read by its key (`cfg.engine.page_size`
    is the engine's page, not demonstration 3's section)."""
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    return name in ("cfg", "config")


@pytest.mark.parametrize("path", FILES)
def test_names_no_demonstration(path: str) -> None:
    assert hidden((ROOT / path).read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    "snippet",
    [
        'THROUGH_SERVER = ("prefix_miss", "warm_prefix")',
        "if only is not None and 4 not in only:\n    pass",
        "chat = only & {5, 6}",
        "section = session.cfg.eviction",
        'x = demos.get("retrieval_depth")',
        'why = "see demonstration 3"',
    ],
)
def test_the_scan_finds_a_hidden_list(snippet: str) -> None:
    assert hidden(snippet)
