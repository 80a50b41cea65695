"""One generated long-context test case and the token counter that sizes it.

A task builds its prompt from a haystack size (a count of filler units); `fit.py` searches for
the largest size whose prompt plus answer budget still fits the target length, counted by the
real tokenizer through a `TokenCounter`. The counter sees the instruction and the answer prefix
separately because a chat model puts them in different turns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Literal

Metric = Literal["all", "part"]

# (instruction text, answer prefix) -> tokens of the whole formatted prompt.
TokenCounter = Callable[[str, str], int]


@dataclass(frozen=True)
class Draft:
    """What a task produces for one haystack size, before sizing."""

    instruction: str
    answer_prefix: str
    references: tuple[str, ...]


@dataclass(frozen=True)
class TaskSample:
    task: str
    instruction: str
    answer_prefix: str
    references: tuple[str, ...]
    metric: Metric
    target_length: int
    depth: float | None
    seed: int
    max_new_tokens: int
    prompt_tokens: int
    haystack_units: int

    def to_row(self) -> dict[str, object]:
        row = asdict(self)
        row["references"] = list(self.references)
        return row


def whitespace_counter(instruction: str, answer_prefix: str) -> int:
    """A tokenizer-free counter for tests of pure logic; real runs use the model's tokenizer."""
    return len(instruction.split()) + len(answer_prefix.split())
