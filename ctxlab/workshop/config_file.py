"""Reading the experiment contract: the user's TOML merged over the embedded default.

`load_config(path, quick)` reads the user's file (or none), merges it over the embedded
default (`default_config.DEFAULT_TOML`; a `[predictions.<demo>]` table replaces the default's
table for that demo, every other table merges key by key), merges `[quick]` on top when asked,
and validates the result (`config.WorkshopConfig`). The `[quick]` sizes are validated on every
run, so a bad `[quick]` table never waits for `--quick`. Any mistake is one sentence naming
the key and the file. Nothing here imports torch.
"""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path

from pydantic import ValidationError

from ctxlab.errors import CtxlabError
from ctxlab.inputs import load_toml
from ctxlab.workshop.default_config import DEFAULT_TOML
from ctxlab.workshop.registry import WorkshopConfig

TomlTable = dict[str, object]  # a parsed TOML document or table


def default_document() -> TomlTable:
    return tomllib.loads(DEFAULT_TOML)


def merge(base: TomlTable, over: TomlTable, path: tuple[str, ...] = ()) -> TomlTable:
    """`over` merged into a copy of `base`; tables merge, `predictions.<demo>` replaces."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        replace_whole = len(path) == 1 and path[0] == "predictions"
        if isinstance(value, dict) and isinstance(out.get(key), dict) and not replace_whole:
            out[key] = merge(out[key], value, (*path, key))
        else:
            out[key] = copy.deepcopy(value)
    return out


def _has_path(doc: object, loc: tuple[int | str, ...]) -> bool:
    for part in loc:
        if not isinstance(doc, dict) or part not in doc:
            return False
        doc = doc[part]
    return True


def _key(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "the config"


def _sentence(exc: ValidationError, source: str, user: dict, user_quick: dict | None) -> str:
    """The first error as one sentence: the key, the file, what is wrong."""
    err = exc.errors(include_url=False)[0]
    loc = tuple(err["loc"])
    names = tuple(p for p in loc if not isinstance(p, int))
    key = _key(loc)
    if user_quick is not None:
        key = f"quick.{key}" if loc else "[quick]"
        where = source if _has_path(user_quick, names) else "the embedded default config"
    else:
        where = source if _has_path(user, names) else "the embedded default config"
    if names[:1] == ("servers",):  # only a user's file lists servers
        where = source
    kind = err["type"]
    msg = str(err["msg"]).removeprefix("Value error, ")
    if kind == "extra_forbidden":
        parent = _key(loc[:-1]) if len(loc) > 1 else ""
        return f"{where}: unknown key {key!r}" + (f" in [{parent}]" if parent else "") + "."
    if kind == "missing":
        return f"{where}: key {key!r} is missing."
    value = err.get("input")
    secret = "api_key" in names  # a key is never echoed
    shown = "" if isinstance(value, dict | list) or secret else f" = {value!r}"
    if not loc:  # a check across sections: its message names the keys
        return f"{where}" + (" [quick]" if user_quick is not None else "") + f": {msg}."
    return f"{where}: {key}{shown}: {msg[:1].lower() + msg[1:] if msg else 'invalid'}."


def load_config(path: Path | None = None, quick: bool = False) -> WorkshopConfig:
    """The validated contract: the default, the user's file merged over it, `[quick]` last."""
    source = str(path) if path is not None else "the embedded default config"
    user: TomlTable = {}
    if path is not None:
        if not path.is_file():
            raise CtxlabError(f"workshop config {path} does not exist or is not a file.")
        user = load_toml(path, "workshop config")
    doc = merge(default_document(), user)
    quick_table = doc.pop("quick", {})
    user_quick = user.get("quick") if isinstance(user.get("quick"), dict) else None
    if not isinstance(quick_table, dict):
        raise CtxlabError(f"{source}: [quick] must be a table of overrides.")
    try:
        cfg = WorkshopConfig.model_validate(doc)
    except ValidationError as exc:
        raise CtxlabError(_sentence(exc, source, user, None)) from None
    # The quick sizes are checked on every run, so a bad [quick] table never waits for --quick.
    try:
        quick_cfg = WorkshopConfig.model_validate(merge(doc, quick_table))
    except ValidationError as exc:
        raise CtxlabError(_sentence(exc, source, user, user_quick or {})) from None
    return quick_cfg if quick else cfg
