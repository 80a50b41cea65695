"""Aggregation tasks (RULER): common-word and frequent-word extraction.

Common words (cwe): a numbered list where ten words appear `common_freq` times and the rest
`rare_freq` times; the haystack size is the number of rare words. RULER's 30 repetitions
only fit from about 4K tokens, so below that the common frequency grows with the list (never
under rare + 1, capped at `common_freq`): the task stays the same question at every length.
Frequent words (fwe): coded words drawn from a zeta (Zipf) distribution with alpha 2;
the answer is the three most frequent. Both test whether the model can count over the whole context,
which retention policies that keep "important" tokens can break without any needle being lost.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

import numpy as np

from ctxlab.eval import vocab
from ctxlab.eval.sample import Draft, Metric


@dataclass(frozen=True)
class CommonWordsTask:
    name: str = "cwe"
    num_common: int = 10
    common_freq: int = 30
    rare_freq: int = 3
    max_new_tokens: int = 120
    metric: Metric = "all"

    def draft(self, n_units: int, depth: float | None, seed: int) -> Draft:
        rng = random.Random(seed)
        words = rng.sample(vocab.plain_words(), self.num_common + n_units)
        common, rare = words[: self.num_common], words[self.num_common :]
        freq = min(self.common_freq, self.rare_freq + 1 + n_units // 10)
        listing = common * freq + rare * self.rare_freq
        rng.shuffle(listing)
        numbered = " ".join(f"{i + 1}. {w}" for i, w in enumerate(listing))
        instruction = (
            "Below is a numbered list of words. Some words appear more often than the others; "
            f"remember the ones that appear most often.\n\n{numbered}\n\n"
            f"Question: What are the {self.num_common} most common words in the list above?"
        )
        prefix = f"Answer: The {self.num_common} words that appear most often in the list are:"
        return Draft(instruction, prefix, tuple(common))


@dataclass(frozen=True)
class FrequentWordsTask:
    name: str = "fwe"
    alpha: float = 2.0
    vocab_size: int = 2000
    top: int = 3
    max_new_tokens: int = 50
    metric: Metric = "all"

    def draft(self, n_units: int, depth: float | None, seed: int) -> Draft:
        rng = random.Random(seed)
        coded = []
        while len(coded) < self.vocab_size:
            word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(5))
            if word not in coded:
                coded.append(word)
        sampler = np.random.default_rng(seed)
        ranks: list[int] = []
        while len(ranks) < n_units:
            draw = sampler.zipf(self.alpha, size=max(n_units, 16))
            ranks.extend(int(r) for r in draw if r <= self.vocab_size)
        text_words = [coded[r - 1] for r in ranks[:n_units]]
        counts = Counter(text_words)
        answer = tuple(w for w, _ in counts.most_common(self.top))
        instruction = (
            "Read the following coded text and track how often each coded word appears.\n\n"
            f"{' '.join(text_words)}\n\n"
            f"Question: What are the {self.top} most frequently appearing coded words in the "
            "text above? Do not explain."
        )
        prefix = f"Answer: The {self.top} most frequently appearing words in the coded text are:"
        return Draft(instruction, prefix, answer)
