"""The prefill's progress moves: per chunk when the prompt takes several engine steps, and a
spinner that names the count when one forward pass computes it (a bar sat at 0/4067 until
it finished). A fake engine stands for the real one: only its step accounting matters."""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import pytest

import ctxlab.commands._model as model_cmd


class _Seq:
    def __init__(self, prompt: int) -> None:
        self.num_prompt, self.num_computed, self.output_ids, self.finished = prompt, 0, [], False


class _Engine:
    """Prefill in chunks of `budget` tokens, then one token per step up to `max_tokens`."""

    def __init__(self, prompt: int, budget: int, max_tokens: int) -> None:
        self.seq = _Seq(prompt)
        self.scheduler = SimpleNamespace(max_num_batched_tokens=budget)
        self.seqs = {0: self.seq}
        self.max_tokens = max_tokens

    def encode(self, request: object) -> list[int]:
        return [1] * self.seq.num_prompt

    def check_context(self, n: int, max_tokens: int) -> None:
        pass

    def add_request(self, ids: list[int], params: object) -> int:
        return 0

    def has_unfinished(self) -> bool:
        return len(self.seq.output_ids) < self.max_tokens

    def step(self) -> None:
        s = self.seq
        if s.num_computed < s.num_prompt:
            s.num_computed = min(
                s.num_prompt, s.num_computed + self.scheduler.max_num_batched_tokens
            )
            if s.num_computed == s.num_prompt:
                s.output_ids.append(0)
        else:
            s.output_ids.append(0)

    def output(self, rid: int) -> str:
        return "out"


@pytest.fixture
def bars(monkeypatch):
    seen: list[dict] = []

    @contextmanager
    def fake(description, total=None, **_kwargs):
        bar = {"description": description, "total": total, "advances": []}
        seen.append(bar)
        yield SimpleNamespace(advance=lambda n=1: bar["advances"].append(n), describe=None)

    monkeypatch.setattr(model_cmd, "progress", fake)
    return seen


def test_a_chunked_prefill_advances_per_chunk(bars):
    engine = _Engine(prompt=4067, budget=1024, max_tokens=3)
    model_cmd.run_one(engine, "x", SimpleNamespace(max_tokens=3))
    prefill = bars[0]
    assert prefill["total"] == 4067 and "chunks of up to 1,024" in prefill["description"]
    assert prefill["advances"] == [1024, 1024, 1024, 995]  # it moves with every chunk


def test_a_one_pass_prefill_is_a_spinner_with_the_count(bars):
    engine = _Engine(prompt=4067, budget=8192, max_tokens=3)
    model_cmd.run_one(engine, "x", SimpleNamespace(max_tokens=3))
    prefill = bars[0]
    assert prefill["total"] is None  # no 0/4067 bar that cannot move
    assert prefill["description"] == "prefill of 4,067 tokens (one forward pass)"
    assert bars[1]["description"] == "decoding" and sum(bars[1]["advances"]) == 3
