"""A KV budget, parsed once into one typed value: tokens per lane, or a share of the prompt.

One meaning per spelling, and none that hinges on a trailing ".0":
- a whole number written without a decimal point (`256`, `"256"`) is a count of tokens;
- a number written with one, or a Python float (`0.25`, `"0.25"`, `1.0`), is a share of
  the prompt in (0, 1]; `1.0` is the whole prompt;
- anything else (`0`, `-5`, `"2.0"`, `2.5`, `True`, `"abc"`) is one sentence.

Every policy stores its budget as a `Budget` (never as a bare number under another name),
and the engine turns it into tokens for a given prompt with `tokens_for`. Sinks and windows
a policy always keeps are its own business (`ScorerPolicy`), not the budget's.
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass

from ctxlab.errors import CtxlabError

_WHOLE = re.compile(r"[+-]?\d+")
_FORMS = "a token count (e.g. 256) or a share of the prompt in (0, 1] (e.g. 0.25)"


@dataclass(frozen=True)
class Budget:
    """Exactly one of `tokens` (>= 1) and `ratio` (in (0, 1]) is set."""

    tokens: int | None = None
    ratio: float | None = None

    def __post_init__(self) -> None:
        if (self.tokens is None) == (self.ratio is None):
            raise ValueError("a Budget holds exactly one of tokens and ratio")
        if self.tokens is not None and self.tokens < 1:
            raise ValueError(f"a token budget must be >= 1, got {self.tokens}")
        if self.ratio is not None and not 0.0 < self.ratio <= 1.0:
            raise ValueError(f"a ratio budget must lie in (0, 1], got {self.ratio}")

    @classmethod
    def parse(cls, value: Budget | int | float | str) -> Budget:
        """The budget a user wrote (CLI string, Python int or float), or one sentence why not."""
        if isinstance(value, Budget):
            return value
        if isinstance(value, bool):
            raise CtxlabError(f"a budget is {_FORMS}, got {value!r}.")
        shown: object = value
        if isinstance(value, str):
            text = shown = value.strip()
            if _WHOLE.fullmatch(text):
                value = int(text)
            else:
                try:
                    value = float(text)
                except ValueError:
                    raise CtxlabError(
                        f"budget {text!r} is neither a token count (e.g. 256) nor a share of "
                        "the prompt in (0, 1] (e.g. 0.25)."
                    ) from None
        if isinstance(value, numbers.Integral):
            if value < 1:
                raise CtxlabError(f"budgets are positive: give {_FORMS}; got {shown}.")
            return cls(tokens=int(value))
        if isinstance(value, numbers.Real):
            v = float(value)
            if v <= 0:  # negatives and zero (NaN fails both tests below)
                raise CtxlabError(f"budgets are positive: give {_FORMS}; got {shown}.")
            if not 0.0 < v <= 1.0 or math.isnan(v):
                raise CtxlabError(
                    f"budget {shown} has a decimal point, so it is a share of the prompt, which "
                    "must lie in (0, 1]; write a token count without one (e.g. 256)."
                )
            return cls(ratio=v)
        raise CtxlabError(f"a budget is {_FORMS}, got {value!r}.")

    @property
    def is_ratio(self) -> bool:
        return self.ratio is not None

    def tokens_for(self, prompt_len: int) -> int:
        """Tokens per lane this budget allows for a prompt of `prompt_len` tokens (>= 1)."""
        if self.tokens is not None:
            return self.tokens
        assert self.ratio is not None
        return max(1, math.floor(self.ratio * prompt_len))

    def __str__(self) -> str:
        return str(self.tokens) if self.tokens is not None else repr(self.ratio)


# Defaults of the policies' `budget` fields (module constants: a dataclass default is one
# shared value, and a `Budget` is immutable).
TOKENS_256 = Budget(tokens=256)
TOKENS_512 = Budget(tokens=512)
