"""The report as one self-contained HTML file: inline CSS, plots as PNG data URIs, no CDN.

It opens from disk, from an e-mail attachment or an archive without the output folder.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

from ctxlab.workshop.document import Block

_CSS = """
body { font-family: system-ui, sans-serif; max-width: 72rem; margin: 2rem auto; padding: 0 1rem;
       color: #1b1b1b; line-height: 1.45; }
table { border-collapse: collapse; margin: 0.4rem 0 0.3rem; font-size: 0.88rem; }
th, td { border: 1px solid #ccc; padding: 0.2rem 0.5rem; vertical-align: top; }
th { background: #f2f2f2; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
caption { text-align: left; font-weight: 600; padding: 0.3rem 0; }
p.note { color: #555; font-size: 0.85rem; margin-top: 0; }
img { max-width: 100%; border: 1px solid #ddd; }
code { background: #f4f4f4; padding: 0 0.2rem; }
"""

_NUMERIC = re.compile(r"^-?[\d,]+(\.\d+)?%?$")


def _inline(text: str) -> str:
    """Escape, then render **bold** and `code` spans (the only Markdown the blocks use)."""
    out = html.escape(text)
    out = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", out)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", out)


def _image(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<p><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></p>'


def render_html(blocks: list[Block], out_dir: Path) -> str:
    parts = [
        '<!doctype html><html lang="en"><head><meta charset="utf-8">',
        "<title>ctxlab workshop report</title>",
        f"<style>{_CSS}</style></head><body>",
    ]
    for b in blocks:
        if b.kind in ("h1", "h2", "h3"):
            parts.append(f"<{b.kind}>{_inline(b.text)}</{b.kind}>")
        elif b.kind == "p":
            parts.append(f"<p>{_inline(b.text)}</p>")
        elif b.kind == "list":
            parts.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in b.items) + "</ul>")
        elif b.kind == "table":
            head = "".join(f"<th>{_inline(c)}</th>" for c in b.columns)
            body = "".join(
                "<tr>"
                + "".join(
                    f'<td class="num">{_inline(c)}</td>'
                    if _NUMERIC.match(c)
                    else f"<td>{_inline(c)}</td>"
                    for c in row
                )
                + "</tr>"
                for row in b.rows
            )
            parts.append(
                f"<table><caption>{_inline(b.text)}</caption><tr>{head}</tr>{body}</table>"
            )
            if b.note:
                parts.append(f'<p class="note">{_inline(b.note)}</p>')
        elif b.kind == "img":
            parts.append(_image(out_dir / b.text, b.note))
        else:
            raise ValueError(f"unknown block kind {b.kind!r}")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
