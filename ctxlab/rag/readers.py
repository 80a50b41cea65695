"""Documents from files: plain text, Markdown and PDF (text layer via pypdf).

A text or Markdown file may start with a front-matter block (`---`, `key: value` lines,
`---`) giving `doc_id`, `title` and `date` (YYYY-MM-DD). Without it the document id is the
file's path below the folder given (or its stem), the title its first heading, and the
date the file's modification day. Every file is read and checked before anything is
written, so one bad file stops an ingest without a partial import.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path

from ctxlab.errors import CtxlabError
from ctxlab.inputs import check_input_file, read_text, shown

SUFFIXES = (".txt", ".md", ".markdown", ".pdf")
_FRONT = re.compile(r"\A---\s*\n(.*?)\n---\s*\n", re.DOTALL)


@dataclass(frozen=True)
class SourceDoc:
    doc_id: str
    text: str
    date: str  # YYYY-MM-DD
    title: str
    source: str


def check_date(value: str, where: str) -> str:
    try:
        return date.fromisoformat(value.strip()).isoformat()
    except ValueError:
        raise CtxlabError(f"{where} has date {value!r}; write it as YYYY-MM-DD.") from None


def split_front_matter(text: str) -> tuple[dict[str, str], str]:
    match = _FRONT.match(text)
    if not match:
        return {}, text
    fields = {}
    for line in match.group(1).splitlines():
        if ":" in line:
            key, value = line.split(":", 1)
            fields[key.strip().lower()] = value.strip()
    return fields, text[match.end() :]


def read_document(path: Path, root: Path | None = None) -> SourceDoc:
    """One document; its id, title and source name keep undecodable bytes of the file name
    as escapes (`\\xff`), which SQLite and a terminal can hold."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise CtxlabError(f"{shown(path)} is not a .txt, .md or .pdf file.")
    check_input_file(path, "document")  # a FIFO or a link loop: refused, never opened
    body = _pdf_text(path) if suffix == ".pdf" else _text(path)
    fields, body = split_front_matter(body)
    body = body.strip()
    if not body:
        raise CtxlabError(f"{shown(path)} has no text to ingest (an empty file or a scanned PDF).")
    default_id = (path.relative_to(root) if root else Path(path.name)).with_suffix("").as_posix()
    mtime = datetime.fromtimestamp(path.stat().st_mtime, tz=UTC).date().isoformat()
    heading = next(
        (ln.lstrip("# ").strip() for ln in body.splitlines() if ln.strip()), shown(path.stem)
    )
    return SourceDoc(
        doc_id=fields.get("doc_id") or shown(default_id),
        text=body,
        date=check_date(fields["date"], shown(path)) if "date" in fields else mtime,
        title=fields.get("title") or heading[:120],
        source=shown(path),
    )


def collect(paths: list[Path]) -> list[SourceDoc]:
    """Every supported file under `paths`, read; oldest date first (versions in order)."""
    if not paths:
        raise CtxlabError("give at least one file or folder to ingest.")
    docs: list[SourceDoc] = []
    for p in paths:
        if not p.exists():
            check_input_file(p, "document")  # says why: missing, a dangling link, a loop
        if p.is_dir():
            # every visible entry named like a document, not only the regular files: a FIFO,
            # a dangling link or a device named notes.txt is refused by name (read_document),
            # never skipped in silence; hidden ones (an editor's `.#notes.md` lock, `.git/`)
            # are not documents, and `hidden_entries` counts them for the summary
            files = sorted(
                f
                for f in p.rglob("*")
                if f.suffix.lower() in SUFFIXES and not f.is_dir() and not _hidden(f, p)
            )
            if not files:
                raise CtxlabError(f"{shown(p)} holds no .txt, .md or .pdf files.")
            docs += [read_document(f, p) for f in files]
        else:
            docs.append(read_document(p))
    return sorted(docs, key=lambda d: (d.date, d.source))


def _hidden(path: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(root).parts)


def hidden_entries(paths: list[Path]) -> int:
    """How many entries named like a document the folder walks in `paths` left out as hidden."""
    return sum(
        _hidden(f, p)
        for p in paths
        if p.is_dir()
        for f in p.rglob("*")
        if f.suffix.lower() in SUFFIXES
    )


def _text(path: Path) -> str:
    return read_text(path, "document")


def _pdf_text(path: Path) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(path)
        if reader.is_encrypted:
            raise CtxlabError(f"{shown(path)} is an encrypted PDF; decrypt it first.")
        return "\n\n".join((page.extract_text() or "").strip() for page in reader.pages)
    except (PdfReadError, ValueError, KeyError, OSError):
        raise CtxlabError(f"{shown(path)} is not a readable PDF.") from None
