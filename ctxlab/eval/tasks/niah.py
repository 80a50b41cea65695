"""Needle in a haystack, in RULER's variants: single, multi-key, multi-value, multi-query.

A needle is "One of the special magic {kind} for {key} is: {value}." hidden in noise, essay
or distractor-needle filler. The asked needle sits at the requested depth; distractor keys and
extra values go at seeded random depths. Scored by "all": every asked value must appear.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ctxlab.eval import haystack, vocab
from ctxlab.eval.sample import Draft, Metric


@dataclass(frozen=True)
class NeedleTask:
    name: str
    haystack: haystack.HaystackKind = "noise"
    value_kind: vocab.ValueKind = "numbers"
    num_keys: int = 1  # needles with different keys; the first `num_queries` are asked
    num_values: int = 1  # values per asked key
    num_queries: int = 1
    max_new_tokens: int = 32
    metric: Metric = "all"

    def draft(self, n_units: int, depth: float | None, seed: int) -> Draft:
        needle_rng = random.Random(seed)
        keys = vocab.distinct_keys(needle_rng, self.num_keys)
        values = {
            key: [vocab.value(needle_rng, self.value_kind) for _ in range(self.num_values)]
            for key in keys
        }
        main_depth = needle_rng.random() if depth is None else depth
        inserts: list[tuple[float, str]] = []
        for k, key in enumerate(keys):
            for v, val in enumerate(values[key]):
                at = main_depth if (k == 0 and v == 0) else needle_rng.random()
                inserts.append((at, haystack.needle_sentence(self.value_kind, key, val)))
        filler = haystack.filler_units(
            self.haystack, n_units, random.Random(seed + 1), self.value_kind, frozenset(keys)
        )
        units, _ = haystack.insert_at_depths(filler, inserts)
        asked = keys[: self.num_queries]
        asked_text = ", ".join(asked[:-1]) + f" and {asked[-1]}" if len(asked) > 1 else asked[0]
        kind = self.value_kind
        instruction = (
            f"A long text follows. Some special magic {kind} are hidden in it; remember them, "
            f"you will be asked about them afterwards.\n\n"
            f"{haystack.join_units(units, self.haystack)}\n\n"
            f"What are all the special magic {kind} for {asked_text} mentioned in the text above?"
        )
        prefix = f"The special magic {kind} for {asked_text} mentioned in the text above are"
        refs = tuple(val for key in asked for val in values[key])
        return Draft(instruction, prefix, refs)
