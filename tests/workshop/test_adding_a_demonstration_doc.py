"""docs/adding-a-demonstration.md shows the repository's own change: its registration lines,
its declaration and its config table are checked against the tree, so the page cannot drift
(no model needed)."""

from __future__ import annotations

import re
from pathlib import Path

from ctxlab.workshop.demonstration import Demonstration
from ctxlab.workshop.registry import BY_KEY

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "adding-a-demonstration.md").read_text(encoding="utf-8")


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", DOC, flags=re.S)


def test_the_registration_lines_are_the_registrys() -> None:
    registry = (ROOT / "ctxlab" / "workshop" / "registry.py").read_text(encoding="utf-8")
    (diff,) = _blocks("diff")
    added = [line[1:] for line in diff.splitlines() if line.startswith("+")]
    assert added == ["    demo_long_vs_retrieval,", "    demo_long_vs_retrieval.DEMO,"]
    for line in added:
        assert line in registry.splitlines(), line
    assert "long_vs_retrieval" in BY_KEY


def test_the_declaration_and_table_are_the_modules_own() -> None:
    module = (ROOT / "ctxlab" / "workshop" / "demo_long_vs_retrieval.py").read_text(
        encoding="utf-8"
    )
    declaration, section = _blocks("python")
    assert declaration in module and declaration.startswith("DEMO = Demonstration(")
    assert section in module and section.startswith("class LongContextSection(Section):")
    fields = set(Demonstration.__dataclass_fields__)
    for name in re.findall(r"^    (\w+)=", declaration, flags=re.M):
        assert name in fields, name


def test_every_named_file_exists() -> None:
    for path in re.findall(r"`((?:ctxlab|tests|docs)/[\w/.-]+\.(?:py|md))`", DOC):
        assert (ROOT / path).exists(), path
