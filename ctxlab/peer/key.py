"""API keys as ctxlab sends them: one check, and the key never in a sentence.

A key goes out in an HTTP header (`Authorization: Bearer KEY`), which carries visible ASCII
only. A key with a newline was sent to httpx, whose refusal quoted the whole header (the
key) in the error ctxlab printed; a key with an accented letter ended in a
UnicodeEncodeError traceback. Every command that sends a key builds its header here.
"""

from __future__ import annotations

from ctxlab.errors import CtxlabError


def check_key(key: str | None, flag: str = "--api-key") -> str | None:
    """`key` when a header can carry it (visible ASCII, no space); one sentence naming the
    position of the first character it cannot, never the key itself."""
    if key is None:
        return None
    bad = next((i for i, ch in enumerate(key) if not 0x21 <= ord(ch) <= 0x7E), None)
    if bad is not None:
        raise CtxlabError(
            f"{flag} holds a character an HTTP header cannot carry at position {bad + 1} of "
            f"{len(key)} (a space, a line break, a control character or a non-ASCII letter); "
            "the key is not shown here: check how it was pasted."
        )
    return key


def bearer(key: str | None, flag: str = "--api-key") -> dict[str, str]:
    """The Authorization header for `key` (none for no key or an empty one)."""
    checked = check_key(key, flag)
    return {"Authorization": f"Bearer {checked}"} if checked else {}
