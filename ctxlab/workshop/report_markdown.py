"""The report as Markdown (out/workshop/report.md): the document's blocks, one by one."""

from __future__ import annotations

from ctxlab.workshop.document import Block


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(blocks: list[Block]) -> str:
    lines: list[str] = []
    for b in blocks:
        if b.kind == "h1":
            lines += [f"# {b.text}", ""]
        elif b.kind == "h2":
            lines += [f"## {b.text}", ""]
        elif b.kind == "h3":
            lines += [f"### {b.text}", ""]
        elif b.kind == "p":
            lines += [b.text, ""]
        elif b.kind == "list":
            lines += [f"- {item}" for item in b.items] + [""]
        elif b.kind == "table":
            lines += [f"**{b.text}**", ""]
            lines.append("| " + " | ".join(_cell(c) for c in b.columns) + " |")
            lines.append("|" + "|".join("---" for _ in b.columns) + "|")
            lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in b.rows]
            lines.append("")
            if b.note:
                lines += [f"_{b.note}_", ""]
        elif b.kind == "img":
            lines += [f"![{b.note}]({b.text})", ""]
        else:
            raise ValueError(f"unknown block kind {b.kind!r}")
    return "\n".join(lines)
