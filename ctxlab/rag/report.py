"""What `rag evaluate` reports, in separate tables: retrieval, task and cost.

Retrieval rows say whether the evidence came back (recall@k, MRR within the top k), task
rows whether the model answered and cited correctly, cost rows what the context costs.
`verdict` turns the gold-passage row into one sentence: is the model or the retrieval the
limit? Every proportion carries its 95 % interval (`ctxlab.stats`: Wilson for 0/1 scores,
a bootstrap of the mean for fractional ones) and the count it is over; `comparisons` holds
paired changes in recall@k between retrievers over the same questions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class RetrievalRow:
    retriever: str
    k: int
    recall: float  # mean recall@k over questions
    mrr: float  # mean reciprocal rank within the top k
    questions: int
    recall_low: float | None = None  # 95 % interval of the mean recall@k
    recall_high: float | None = None


@dataclass(frozen=True)
class TaskRow:
    setting: str  # "hybrid@2", "gold passages", "no passages"
    questions: int
    accuracy: float
    citation_precision: float | None  # over answers that cite; None if none did
    citation_recall: float
    cited_by_model: float  # share of answers whose citations the model wrote itself
    accuracy_by_kind: dict[str, float]
    correct: int = 0
    accuracy_low: float | None = None  # Wilson 95 % interval of the accuracy
    accuracy_high: float | None = None
    citing_answers: int = 0  # answers that cite: what citation precision is over
    citation_precision_low: float | None = None
    citation_precision_high: float | None = None
    citation_recall_low: float | None = None
    citation_recall_high: float | None = None


@dataclass(frozen=True)
class CostRow:
    retriever: str
    k: int
    prompt_tokens: float  # mean prompt tokens per question (exact, chat template included)
    prefill_s: float | None  # mean measured prefill seconds (None: not measured)
    prefill_samples: int
    dollars_per_1k_questions: float


@dataclass(frozen=True)
class RecallComparison:
    """recall@k of `retriever` minus that of `baseline`, paired over the same questions."""

    baseline: str
    retriever: str
    k: int
    change: float
    low: float  # 95 % paired-bootstrap interval of the change
    high: float
    questions: int
    verdict: str  # "better", "worse" or "within noise"


@dataclass
class EvalReport:
    settings: dict[str, object]
    retrieval: list[RetrievalRow] = field(default_factory=list)
    task: list[TaskRow] = field(default_factory=list)
    cost: list[CostRow] = field(default_factory=list)
    comparisons: list[RecallComparison] = field(default_factory=list)
    per_question: list[dict[str, object]] = field(default_factory=list)
    verdict: str = ""

    def as_dict(self) -> dict[str, object]:
        return {
            "settings": self.settings,
            "retrieval": [asdict(r) for r in self.retrieval],
            "task": [asdict(r) for r in self.task],
            "cost": [asdict(r) for r in self.cost],
            "comparisons": [asdict(r) for r in self.comparisons],
            "verdict": self.verdict,
            "per_question": self.per_question,
        }


def verdict(report: EvalReport, answer_k: int, retriever: str) -> str:
    """One sentence: is the model or the retrieval the limit?"""
    gold = next((r for r in report.task if r.setting == "gold passages"), None)
    row = next((r for r in report.task if r.setting == f"{retriever}@{answer_k}"), None)
    rec = next((r for r in report.retrieval if r.retriever == retriever and r.k == answer_k), None)
    if gold is None or row is None or rec is None:
        return "no verdict: it needs the gold-passages row and the retriever's row."
    model_gap = 1.0 - gold.accuracy
    retrieval_gap = gold.accuracy - row.accuracy
    who = "the model, not retrieval," if model_gap >= retrieval_gap else "retrieval"
    return (
        f"{who} is the main limit: with only the gold passages the model answers "
        f"{gold.accuracy:.0%}{_ci(gold)} (so {model_gap:.0%} is lost by the model), "
        f"{retriever}@{answer_k} retrieves {rec.recall:.0%} of the evidence and the answers "
        f"reach {row.accuracy:.0%}{_ci(row)} ({retrieval_gap:+.0%} below the gold-passage "
        f"ceiling; {gold.questions} questions)."
    )


def _ci(row: TaskRow) -> str:
    """' [61%, 78%]' when the row has its interval, else nothing."""
    if row.accuracy_low is None or row.accuracy_high is None:
        return ""
    return f" [{row.accuracy_low:.0%}, {row.accuracy_high:.0%}]"
