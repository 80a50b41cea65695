"""The requests `ctxlab watch --requests` explains: JSON lines, one request each.

Each line is `{"at": SECONDS_SINCE_EPOCH, "token_ids": [..], "salt": "tenant" | null}`:
when the request was sent (on the publisher's machine, so on its clock) and its prompt's
token ids as the server tokenized them. A line that is not one is one sentence naming it.
"""

from __future__ import annotations

from pathlib import Path

from ctxlab.errors import CtxlabError
from ctxlab.inputs.structured import loads_json
from ctxlab.inputs.text import read_text
from ctxlab.kvevents.residency import Request


def read_requests(path: Path) -> list[Request]:
    out: list[Request] = []
    for n, line in enumerate(read_text(path, "--requests file").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        doc = loads_json(line, where)
        if not isinstance(doc, dict):
            raise CtxlabError(f"{where} is not a JSON object with at and token_ids.")
        at, ids, salt = doc.get("at"), doc.get("token_ids"), doc.get("salt")
        if isinstance(at, bool) or not isinstance(at, int | float):
            raise CtxlabError(f"{where} has no number 'at' (seconds since the epoch).")
        if not isinstance(ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids
        ):
            raise CtxlabError(f"{where} has no list 'token_ids' of non-negative integers.")
        if salt is not None and not isinstance(salt, str):
            raise CtxlabError(f"{where} has a 'salt' that is not a string.")
        out.append(Request(float(at), tuple(ids), salt))
    return out
