"""The one reader for text files a user names: UTF-8 or one sentence with the byte offset.

Every file argument that holds text (a config, a trace, a prompt file, a history, a workshop
TOML, a document) is read here, so non-UTF-8 bytes are refused the same way everywhere,
never decoded to U+FFFD in silence and never a `UnicodeDecodeError` traceback; the path
must be a regular file (`paths.read_file_bytes`: a FIFO is refused, never waited on).
"""

from __future__ import annotations

from pathlib import Path

from ctxlab.errors import CtxlabError
from ctxlab.inputs.paths import read_file_bytes, shown

BOM = "\ufeff"


def read_text(path: str | Path, what: str = "file") -> str:
    """The file's text (a leading UTF-8 byte-order mark dropped); `what` names it in messages."""
    path = Path(path)
    data = read_file_bytes(path, what)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CtxlabError(
            f"{what} {shown(path)} is not UTF-8 text: byte {exc.start} (0x{data[exc.start]:02x}) "
            "does not decode; save it as UTF-8."
        ) from None
    return text.removeprefix(BOM)


def check_text(text: str, what: str) -> str:
    """A string that can be encoded as UTF-8 (no lone surrogates, e.g. from JSON `\\ud800`)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CtxlabError(
            f"{what} holds a lone surrogate (U+{ord(text[exc.start]):04X}) at character "
            f"{exc.start}, which is not text."
        ) from None
    return text
