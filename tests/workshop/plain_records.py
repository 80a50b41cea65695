"""The rule a demonstration's `measure` keeps: it returns frozen records, nothing formatted.

`problems` walks what `measure` returned and names every place that breaks the rule: a
dataclass that is not frozen, a mutable container (list, dict, set), a value that is not a
record, a number, a bool, None or a string, and a string held in a field whose type is not a
`Literal` (a closed set of labels) unless the test names the field as text the run produced
(a model's answer, a document). So a record cannot carry a sentence or a number formatted
for the report: those are made when rendering, from the records.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
import types
import typing

# strings demonstrations 10 and 11 hold because the run or the fixture produced them
FOLLOWUP_TEXTS = frozenset({"text", "key", "value"})  # a document, a fact's name and number
LONG_TEXTS = frozenset({"question_id", "text"})  # a gold question's id, the model's answer


def problems(
    value: object, texts: frozenset[str] = frozenset(), where: str = "measure"
) -> list[str]:
    """Every break of the rule in `value`, each as 'where: what' (empty: the rule holds)."""
    if value is None or isinstance(value, bool | int | float | enum.Enum):
        return []
    if isinstance(value, tuple | frozenset):
        out = []
        for i, item in enumerate(value):
            out += problems(item, texts, f"{where}[{i}]")
        return out
    if isinstance(value, list | dict | set):
        return [f"{where}: a mutable {type(value).__name__}"]
    if isinstance(value, str):
        return [f"{where}: a string outside a record's Literal field"]
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        return [f"{where}: a {type(value).__name__}, not a record"]
    cls = type(value)
    out = [] if cls.__dataclass_params__.frozen else [f"{where}: {cls.__name__} is not frozen"]  # type: ignore[attr-defined]
    for f in dataclasses.fields(value):
        item, at = getattr(value, f.name), f"{where}.{cls.__name__}.{f.name}"
        if isinstance(item, str):
            if f.name not in texts and not _is_literal(cls, f.type):
                out.append(f"{at}: a string in a field typed {f.type}, not a Literal")
            continue
        out += problems(item, texts, at)
    return out


def _is_literal(cls: type, hint: object) -> bool:
    """Whether a field's type (a string under postponed annotations) is a `Literal`."""
    if isinstance(hint, str):
        try:
            hint = eval(hint, vars(sys.modules[cls.__module__]))  # the field's type, as written
        except Exception:
            return hint.startswith(("Literal[", "typing.Literal["))
    return typing.get_origin(hint) is typing.Literal


def type_problems(tp: object, texts: frozenset[str] = frozenset(), where: str = "") -> list[str]:
    """The same rule read from the types alone (no run needed): every record type reachable
    from `tp` is a frozen dataclass whose fields hold records, tuples, numbers, bools, None,
    enums or Literals (a plain `str` only in a field named in `texts`)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp in (int, float, bool, type(None)) or origin is typing.Literal:
        return []
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return []
    if origin in (tuple, frozenset) or origin in (typing.Union, types.UnionType):
        return [p for a in args if a is not Ellipsis for p in type_problems(a, texts, where)]
    if not (isinstance(tp, type) and dataclasses.is_dataclass(tp)):
        return [f"{where or 'measure'}: {tp} is not a record, a tuple or a number"]
    at = f"{where}.{tp.__name__}" if where else tp.__name__
    out = [] if tp.__dataclass_params__.frozen else [f"{at} is not frozen"]  # type: ignore[attr-defined]
    try:
        hints = typing.get_type_hints(tp)
    except NameError as exc:
        return [*out, f"{at}: a field's type cannot be resolved ({exc})"]
    for f in dataclasses.fields(tp):
        hint = hints[f.name]
        if hint is str and f.name in texts:
            continue
        out += type_problems(hint, texts, f"{at}.{f.name}")
    return out
