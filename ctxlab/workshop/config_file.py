"""Reading the experiment contract: the user's TOML merged over the embedded default.

`load_config(path, quick, full)` reads the user's file (or none), merges it over the embedded
default (`default_config.DEFAULT_TOML`; a `[predictions.<demo>]` table replaces the default's
table for that demo, every other table merges key by key), merges `[quick]` or `[full]` on
top when asked, and validates the result (`config.WorkshopConfig`). A size table the user's
file writes is validated on every run, so a mistake in it never waits for its flag. Any
mistake is one sentence naming the key and the file. Nothing here imports torch.
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


def _sentence(exc: ValidationError, source: str, user: dict, size: tuple[str, dict] | None) -> str:
    """The first error as one sentence: the key, the file, what is wrong. `size`: the size
    table (`quick` or `full`) and the user's part of it, when the error is in its merge."""
    err = exc.errors(include_url=False)[0]
    loc = tuple(err["loc"])
    names = tuple(p for p in loc if not isinstance(p, int))
    key = _key(loc)
    if size is not None:
        name, user_size = size
        key = f"{name}.{key}" if loc else f"[{name}]"
        where = source if _has_path(user_size, names) else "the embedded default config"
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
        return f"{where}" + (f" [{size[0]}]" if size is not None else "") + f": {msg}."
    return f"{where}: {key}{shown}: {msg[:1].lower() + msg[1:] if msg else 'invalid'}."


SIZES = ("quick", "full")  # the size tables merged over the config on request


def load_config(
    path: Path | None = None, quick: bool = False, full: bool = False
) -> WorkshopConfig:
    """The validated contract: the default, the user's file merged over it, then `[quick]`
    (`--quick`: small sizes for CI) or `[full]` (`--full`: the samples the default run leaves
    out to fit its time budget) on top."""
    if quick and full:
        raise CtxlabError("--quick and --full are two sizes of one run; choose one.")
    source = str(path) if path is not None else "the embedded default config"
    user: TomlTable = {}
    if path is not None:
        if not path.is_file():
            raise CtxlabError(f"workshop config {path} does not exist or is not a file.")
        user = load_toml(path, "workshop config")
    doc = merge(default_document(), user)
    tables = {name: doc.pop(name, {}) for name in SIZES}
    try:
        cfg = WorkshopConfig.model_validate(doc)
    except ValidationError as exc:
        raise CtxlabError(_sentence(exc, source, user, None)) from None
    # A size table the user wrote is checked on every run, so a mistake in it never waits for
    # its flag; the default's own are checked when asked for (the default's [full] answers
    # all 100 questions, which a smaller corpus of the user's need not hold).
    sized: dict[str, WorkshopConfig] = {}
    asked = "quick" if quick else "full" if full else None
    for name, table in tables.items():
        if not isinstance(table, dict):
            raise CtxlabError(f"{source}: [{name}] must be a table of overrides.")
        if name != asked and name not in user:
            continue
        user_size = user.get(name) if isinstance(user.get(name), dict) else {}
        try:
            sized[name] = WorkshopConfig.model_validate(merge(doc, table))
        except ValidationError as exc:
            raise CtxlabError(_sentence(exc, source, user, (name, user_size))) from None
    return sized[asked] if asked is not None else cfg
