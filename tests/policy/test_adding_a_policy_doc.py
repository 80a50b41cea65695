"""docs/adding-a-policy.md cannot drift from the tree.

- Its diff is the repository's own: the new file's lines are the file, every hunk of an
  existing file is there as written, and the whole change is one new file plus one added
  line (the registration).
- Its Python block of the policy class is a run of the policy's file.
- Every path it names exists, and every name it places in a file ("`REGISTERED`
  (`ctxlab/policy/registry.py`)") is defined there.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "adding-a-policy.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", DOC.read_text(encoding="utf-8"), re.M | re.S)


def file_diffs(diff: str) -> list[tuple[str, bool, list[str]]]:
    """(path, new file?, the diff lines after its `+++` line) per file of a unified diff."""
    out = []
    for part in re.split(r"^diff --git ", diff, flags=re.M)[1:]:
        lines = part.splitlines()
        path = lines[0].split(" b/")[-1]
        new = any(line.startswith("new file") for line in lines)
        body = lines[next(i for i, x in enumerate(lines) if x.startswith("+++ ")) + 1 :]
        out.append((path, new, body))
    return out


def hunks(body: list[str]) -> list[tuple[int, list[str]]]:
    """(first line of the new side, its lines with their marks) per hunk."""
    out: list[tuple[int, list[str]]] = []
    for line in body:
        m = re.match(r"@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@", line)
        if m:
            out.append((int(m.group(1)), []))
        else:
            out[-1][1].append(line)
    return out


def test_the_diff_is_the_repositorys_one_file_and_one_registration_line():
    (diff,) = blocks("diff")
    files = file_diffs(diff)
    assert [new for _, new, _ in files].count(True) == 1, "one new file"
    added_elsewhere = 0
    for path, new, body in files:
        text = (ROOT / path).read_text(encoding="utf-8").splitlines()
        for start, lines in hunks(body):
            assert not [x for x in lines if x.startswith("-")], (
                f"{path}: the change removes nothing"
            )
            new_side = [x[1:] for x in lines if x[:1] in ("+", " ")]
            assert text[start - 1 : start - 1 + len(new_side)] == new_side, f"{path} drifted"
            if new:
                assert len(new_side) == len(text), f"{path}: the diff shows the whole file"
            else:
                added_elsewhere += sum(x.startswith("+") for x in lines)
    assert added_elsewhere == 1, "one registration line besides the new file"
    registration = next(
        x[1:].strip() for p, new, b in files if not new for x in b if x.startswith("+")
    )
    assert registration.startswith('"keydiff": "ctxlab.policy.keydiff:KeyDiffPolicy"')


def test_the_policy_class_shown_is_the_files():
    shown = next(b for b in blocks("python") if "class KeyDiffPolicy" in b).splitlines()
    text = (ROOT / "ctxlab/policy/keydiff.py").read_text(encoding="utf-8").splitlines()
    at = text.index(shown[0])
    assert text[at : at + len(shown)] == shown


def test_every_path_and_placed_name_exists():
    doc = DOC.read_text(encoding="utf-8")
    paths = set(re.findall(r"`((?:ctxlab|tests|benchmarks|docs)/[\w/.-]+\.(?:py|md))`", doc))
    paths |= set(re.findall(r"\s((?:tests|benchmarks)/[\w/.-]+\.py)", doc))
    assert paths, "the page names files"
    for p in sorted(paths):
        assert (ROOT / p).is_file(), f"{p} (named in {DOC.name}) does not exist"
    placed = re.findall(r"`(\w+)`(?:\s*\w+)?\s*\(`((?:ctxlab)/[\w/.-]+\.py)`\)", doc)
    assert len(placed) >= 5, placed
    for name, p in placed:
        src = (ROOT / p).read_text(encoding="utf-8")
        defined = rf"^(?:class|def) {name}\b|^{name}\s*[:=]|^    def {name}\b"
        assert re.search(defined, src, re.M), f"`{name}` is not defined in {p}"


def test_the_registry_is_the_dict_the_page_names():
    from ctxlab.policy.registry import REGISTERED

    doc = DOC.read_text(encoding="utf-8")
    assert "`REGISTERED`" in doc and "POLICIES` tuple" not in doc
    assert isinstance(REGISTERED, dict) and "keydiff" in REGISTERED
