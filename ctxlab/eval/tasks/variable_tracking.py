"""Variable tracking (RULER): follow a chain of assignments hidden in noise.

"VAR ABCDE = 12345", then "VAR FGHIJ = VAR ABCDE", and so on for `hops` links; the model must
name every variable that ends up holding the value. The links are spread evenly through the
filler (the first at the requested depth when one is given), so the model has to track state
across the whole context, not find one sentence.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ctxlab.eval import haystack, vocab
from ctxlab.eval.sample import Draft, Metric


@dataclass(frozen=True)
class VariableTrackingTask:
    name: str = "vt"
    hops: int = 4
    chains: int = 1
    max_new_tokens: int = 30
    metric: Metric = "all"

    def draft(self, n_units: int, depth: float | None, seed: int) -> Draft:
        rng = random.Random(seed)
        names: list[str] = []
        while len(names) < (self.hops + 1) * self.chains:
            name = vocab.variable_name(rng)
            if name not in names:
                names.append(name)
        start = 0.0 if depth is None else depth
        inserts: list[tuple[float, str]] = []
        asked_value = ""
        asked_names: tuple[str, ...] = ()
        for c in range(self.chains):
            chain = names[c * (self.hops + 1) : (c + 1) * (self.hops + 1)]
            value = str(rng.randint(10_000, 99_999))
            statements = [f"VAR {chain[0]} = {value}."]
            statements += [f"VAR {chain[i]} = VAR {chain[i - 1]}." for i in range(1, len(chain))]
            for i, text in enumerate(statements):
                at = start + (1.0 - start) * i / len(statements) if c == 0 else rng.random()
                inserts.append((at, text))
            if c == 0:
                asked_value, asked_names = value, tuple(chain)
        filler = haystack.filler_units("noise", n_units, random.Random(seed + 1))
        units, _ = haystack.insert_at_depths(filler, inserts)
        instruction = (
            "Memorize and track the chain(s) of variable assignment hidden in the following "
            f"text.\n\n{' '.join(units)}\n\n"
            f"Question: Find all variables that are assigned the value {asked_value} in the text "
            "above."
        )
        prefix = (
            f"Answer: Following the chain(s) of variable assignment above, {len(asked_names)} "
            f"variables are assigned the value {asked_value}, they are:"
        )
        return Draft(instruction, prefix, asked_names)
