"""API keys as ctxlab sends them: one check, and the key never in a sentence.

A key goes out in an HTTP header (`Authorization: Bearer KEY`), which carries visible ASCII
only. A key with a newline was sent to httpx, whose refusal quoted the whole header (the
key) in the error ctxlab printed; a key with an accented letter ended in a
UnicodeEncodeError traceback. Every command that sends a key builds its header here.
"""

from __future__ import annotations

from ctxlab.errors import CtxlabError


def check_key(key: str | None, flag: str = "--api-key") -> str | None:
    """`key` when it is visible ASCII with no space (HTTP allows a space inside a header
    value, but no API key holds one, and a pasted key with one is a mistake); one sentence
    naming the position of the first other character, never the key itself."""
    if key is None:
        return None
    bad = next((i for i, ch in enumerate(key) if not 0x21 <= ord(ch) <= 0x7E), None)
    if bad is not None:
        raise CtxlabError(
            f"{flag} holds a character at position {bad + 1} of {len(key)} that ctxlab does "
            "not send in a header (a space, a line break, a control character or a non-ASCII "
            "letter: no API key has one); the key is not shown here: check how it was pasted."
        )
    return key


def bearer(key: str | None, flag: str = "--api-key") -> dict[str, str]:
    """The Authorization header for `key` (none for no key or an empty one)."""
    checked = check_key(key, flag)
    return {"Authorization": f"Bearer {checked}"} if checked else {}
