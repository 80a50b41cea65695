"""One reported figure: its value, whether it was measured or inferred, and how.

"measured" means read off the server's own answers (cached tokens, timings, metrics);
"inferred" means derived from something else (TTFT against prompt length, a staircase's
step, a bracket of capacity) and the note says from what. A figure the server cannot give is
"not measurable" with the reason, never a guess.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

How = Literal["measured", "inferred", "not measurable"]


@dataclass(frozen=True)
class Figure:
    name: str
    value: float | int | str | bool | None
    how: How
    note: str = ""
    unit: str = ""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def shown(self) -> str:
        if self.value is None:
            return "-"
        if isinstance(self.value, bool):
            return "yes" if self.value else "no"
        if isinstance(self.value, float):
            text = f"{self.value:,.3g}" if abs(self.value) < 100 else f"{self.value:,.0f}"
        elif isinstance(self.value, int):
            text = f"{self.value:,}"
        else:
            text = str(self.value)
        return f"{text} {self.unit}".strip()
