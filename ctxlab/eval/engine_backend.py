"""Answer eval samples with ctxlab's own engine, measuring what each answer kept resident.

The prompt is the model's chat template around the instruction, with the answer prefix
opening the assistant turn, the same ids the sizing counted. Answers are greedy, so a score
difference between two policies on the same sample is the policy's doing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ctxlab.eval.openai_backend import Generation
from ctxlab.eval.runner import PolicyRun
from ctxlab.eval.sample import TaskSample, TokenCounter


def prompt_ids(tokenizer: Any, instruction: str, answer_prefix: str) -> list[int]:
    """Chat-formatted instruction plus the answer prefix as the assistant's first words."""
    ids = tokenizer.apply_chat([{"role": "user", "content": instruction}])
    return ids + tokenizer.hf.encode(answer_prefix, add_special_tokens=False)


def token_counter(tokenizer: Any) -> TokenCounter:
    def count(instruction: str, answer_prefix: str) -> int:
        return len(prompt_ids(tokenizer, instruction, answer_prefix))

    return count


def make_policy_for(run: PolicyRun) -> Any:
    """The engine's policy object for a run; None means the plain engine (full cache)."""
    if run.policy == "full" and run.budget is None:
        return None
    from ctxlab.policy.registry import make_policy

    params = {"position_mode": run.position_mode} if run.position_mode else {}
    return make_policy(run.policy, run.budget, **params)


@dataclass
class EngineBackend:
    """One engine per policy run; the loaded weights are shared between runs."""

    loaded: Any
    run: PolicyRun
    kv_pool_tokens: int = 65536
    block_size: int = 16
    max_num_batched_tokens: int = 2048
    name: str = "ctxlab"

    def __post_init__(self) -> None:
        from ctxlab.engine.llm import LLM

        self.policy = make_policy_for(self.run)
        self.llm = LLM(
            self.loaded,
            kv_pool_tokens=self.kv_pool_tokens,
            block_size=self.block_size,
            max_num_batched_tokens=self.max_num_batched_tokens,
            policy=self.policy,
        )

    @property
    def kv_dtype(self) -> str:
        """How the pool stores K/V: the model's dtype, or a quantized format's name."""
        fmt = getattr(self.llm.engine.kv, "kv_format", None)
        dtype = next(self.loaded.model.parameters()).dtype
        return fmt or str(dtype).removeprefix("torch.")

    @property
    def position_mode(self) -> str:
        return getattr(self.policy, "position_mode", "original")

    def generate(self, samples: Sequence[TaskSample]) -> list[Generation]:
        from ctxlab.engine.sampling import SamplingParams

        tok = self.loaded.tokenizer
        outs: list[Generation | None] = [None] * len(samples)
        groups: dict[int, list[int]] = {}
        for i, sample in enumerate(samples):  # one batch per answer budget
            groups.setdefault(sample.max_new_tokens, []).append(i)
        for max_tokens, members in groups.items():
            ids = [
                prompt_ids(tok, samples[i].instruction, samples[i].answer_prefix) for i in members
            ]
            params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
            for i, prompt, out in zip(members, ids, self.llm.generate(ids, params), strict=True):
                outs[i] = Generation(out.text, out.metrics.resident_kv_bytes, len(prompt))
        return [g for g in outs if g is not None]
