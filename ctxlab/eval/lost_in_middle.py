"""Lost in the middle (Liu et al., 2023): the same question with the gold document moved.

k documents, the gold one at each position 0..k-1 in turn; everything else (names, towns,
distractors) stays fixed by the seed, so a change of score with position is the model's
position bias and not a change of the question.
"""

from __future__ import annotations

from ctxlab.eval.sample import TaskSample, TokenCounter
from ctxlab.eval.tasks.qa import DocumentQATask


def lost_in_middle_samples(num_documents: int, seed: int, count: TokenCounter) -> list[TaskSample]:
    """One sample per gold position; depth = position / (k - 1)."""
    if num_documents < 2:
        raise ValueError("lost in the middle needs at least two documents")
    task = DocumentQATask(name="lost_in_middle")
    samples = []
    for position in range(num_documents):
        depth = position / (num_documents - 1)
        draft = task.draft(num_documents - 1, depth, seed)
        tokens = count(draft.instruction, draft.answer_prefix)
        samples.append(
            TaskSample(
                task=task.name,
                instruction=draft.instruction,
                answer_prefix=draft.answer_prefix,
                references=draft.references,
                metric=task.metric,
                target_length=tokens + task.max_new_tokens,
                depth=depth,
                seed=seed,
                max_new_tokens=task.max_new_tokens,
                prompt_tokens=tokens,
                haystack_units=num_documents - 1,
            )
        )
    return samples
