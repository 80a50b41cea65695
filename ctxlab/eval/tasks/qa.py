"""Question answering over generated documents, the gold one among distractors.

Every document is a short made-up biography ("Document 7: Vera Novak ... was born in
Quostamar ..."), so the answer cannot come from the model's prior knowledge, only from the
context. The gold document sits at the requested depth (RULER's QA and the lost-in-the-middle
setup of Liu et al. 2023 differ only in how many distractors there are and how the depth is
chosen). Scored by "part": any reference found counts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ctxlab.eval import haystack, vocab
from ctxlab.eval.sample import Draft, Metric

TRADES = "baker sailor weaver potter clerk miller glazier carpenter tanner cooper".split()


def _document(rng: random.Random, name: str, town: str) -> str:
    trade = rng.choice(TRADES)
    year = rng.randint(1700, 1899)
    return (
        f"{name} worked as a {trade} for most of a long life. Records from {year} describe a "
        f"careful worker who rarely travelled. {name} was born in the town of {town}. Friends "
        f"remembered a quiet person who kept a small garden."
    )


@dataclass(frozen=True)
class DocumentQATask:
    name: str = "qa"
    max_new_tokens: int = 32
    metric: Metric = "part"

    def draft(self, n_units: int, depth: float | None, seed: int) -> Draft:
        rng = random.Random(seed)
        gold_name, gold_town = vocab.person(rng), vocab.place(rng)
        gold = _document(rng, gold_name, gold_town)
        doc_rng = random.Random(seed + 1)
        distractors = []
        for _ in range(n_units):
            name, town = vocab.person(doc_rng), vocab.place(doc_rng)
            while name == gold_name or town == gold_town:
                name, town = vocab.person(doc_rng), vocab.place(doc_rng)
            distractors.append(_document(doc_rng, name, town))
        at = rng.random() if depth is None else depth
        docs, _ = haystack.insert_at_depths(distractors, [(at, gold)])
        body = "\n\n".join(f"Document {i + 1}: {d}" for i, d in enumerate(docs))
        instruction = (
            "Answer the question using only the documents below.\n\n"
            f"{body}\n\nQuestion: In which town was {gold_name} born? Answer with the town name."
        )
        return Draft(instruction, "Answer:", (gold_town,))
