"""Size a task's haystack so prompt plus answer budget fills the target length.

RULER sizes each sample by the tokenizer's count, not by characters: a "4K" sample is one
whose formatted prompt plus the tokens it may generate is at most 4,096 tokens, with the
largest haystack that still fits. The count is monotonic in the number of filler units, so a
doubling search for an upper bound and a binary search below it find that size with
O(log n) tokenizer calls.
"""

from __future__ import annotations

from ctxlab.errors import CtxlabError
from ctxlab.eval.sample import TaskSample, TokenCounter
from ctxlab.eval.tasks import Task


def make_sample(
    task: Task, target_length: int, depth: float | None, seed: int, count: TokenCounter
) -> TaskSample:
    """The sample of `task` with the largest haystack whose total fits `target_length`."""
    if target_length <= 0:
        raise CtxlabError(f"target length must be positive, got {target_length}")
    if depth is not None and not 0.0 <= depth <= 1.0:
        raise CtxlabError(f"depth must be between 0 and 1, got {depth}")
    budget = target_length - task.max_new_tokens

    def total(units: int) -> int:
        draft = task.draft(units, depth, seed)
        return count(draft.instruction, draft.answer_prefix)

    if total(0) > budget:
        raise CtxlabError(
            f"target length {target_length} is too short for task {task.name}: its prompt "
            f"without any filler plus {task.max_new_tokens} answer tokens needs "
            f"{total(0) + task.max_new_tokens} tokens"
        )
    low, high = 0, 1
    while total(high) <= budget:
        low, high = high, high * 2
    while high - low > 1:  # invariant: total(low) fits, total(high) does not
        mid = (low + high) // 2
        if total(mid) <= budget:
            low = mid
        else:
            high = mid
    draft = task.draft(low, depth, seed)
    return TaskSample(
        task=task.name,
        instruction=draft.instruction,
        answer_prefix=draft.answer_prefix,
        references=draft.references,
        metric=task.metric,
        target_length=target_length,
        depth=depth,
        seed=seed,
        max_new_tokens=task.max_new_tokens,
        prompt_tokens=count(draft.instruction, draft.answer_prefix),
        haystack_units=low,
    )
