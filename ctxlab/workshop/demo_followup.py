"""Demonstration 10: the question after compression.

A compressed KV cache is usually judged on the question it was compressed for: the query
sits in the observation window at the prompt's end, the best case for SnapKV, H2O and their
kin. A conversation asks again. Here each of `documents` seeded documents (noise filler with
`facts` planted facts, "the special magic number for K is: V") is sent once as a chat turn
asking about one fact; the engine compresses the cache at the end of that prompt, under each
configured retention policy at each budget, and keeps it (`LLM.generate(..., hold=True)`).
The other facts are then asked as follow-up turns against that same compressed cache
(`LLM.follow_up`: the new turn's tokens are appended; nothing is recomputed and nothing
evicted comes back). Rows: the full cache; each policy at each budget (a share of the
prompt); recall of evicted blocks from a far tier (`recall` wrapping `recall_base`) beside
its base alone at the same pool share; and a fresh prefill of the whole document per
question, the no-loss baseline at its own cost.

One engine serves every row (`LLM.set_policy` between rows): the prefix cache holds each
document as first computed, before any cut, so a row reuses the prefill and makes its own
cut at the prompt's end. Accuracy is paired against the full cache over the same questions
(paired bootstrap, exact McNemar beside it), with n and Wilson intervals; KV bytes resident
are read from the pool; TTFT is the engine's own. The report is written by
`followup_report.py`.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from ctxlab.progress import Tracker
from ctxlab.workshop.config import Pos, Section
from ctxlab.workshop.demonstration import (
    Demonstration,
    Metric,
    Plot,
    ServerMode,
)
from ctxlab.workshop.followup_records import Doc, Fact, Measured, Row, RowKind
from ctxlab.workshop.result import DemoResult
from ctxlab.workshop.session import Session

if TYPE_CHECKING:
    from ctxlab.engine import LLM, RequestOutput
    from ctxlab.workshop.server_findings import ServerRun

# What a policy reads decides its class (declared by each policy class, `Policy.needs`):
# attention of the prompt's last queries or of each decode step: it sees the question.
QUERY_NEEDS = frozenset({"obs_attn", "acc_attn", "step_attn", "query"})
Kind = Literal["query-aware", "key-based", "positional"]


def kind_of(needs: frozenset[str]) -> Kind:
    """A retention policy's class from what it asks the engine to observe."""
    if needs & QUERY_NEEDS:
        return "query-aware"
    return "key-based" if "keys" in needs else "positional"


# -- the documents and the turns ------------------------------------------------------------
def documents(c: FollowupSection, seed: int) -> list[Doc]:
    """`c.documents` documents of `c.filler_units` filler sentences with `c.facts` facts (a
    distinct 4-digit number each: a short answer keeps every decode round short) at even
    depths with seeded jitter; the asked order is a seeded shuffle, so question 1 is at a
    different depth in each document."""
    from ctxlab.eval import haystack, vocab

    docs = []
    for d in range(c.documents):
        rng = random.Random(seed * 1_000_003 + d)
        keys = vocab.distinct_keys(rng, c.facts)
        values = [str(v) for v in rng.sample(range(1000, 10000), c.facts)]
        depths = [(i + 0.2 + 0.6 * rng.random()) / c.facts for i in range(c.facts)]
        filler = haystack.filler_units(c.haystack, c.filler_units, rng, "numbers", frozenset(keys))
        sentences = [fact_sentence(k, v) for k, v in zip(keys, values, strict=True)]
        units, _ = haystack.insert_at_depths(filler, list(zip(depths, sentences, strict=True)))
        order = rng.sample(range(c.facts), c.facts)
        asked = tuple(Fact(keys[i], values[i], depths[i]) for i in order)
        docs.append(Doc(haystack.join_units(units, c.haystack), asked))
    return docs


def fact_sentence(key: str, value: str) -> str:
    return f"The special magic number for {key} is: {value}."


def question(key: str) -> str:
    return f"What is the special magic number for {key} in the text?"


def answer_prefix(key: str) -> str:
    return f"The special magic number for {key} is"


def first_turn(tok: Any, doc: Doc) -> list[int]:
    """Question 1 as a chat turn: the document, the question, and the answer's first words
    (so the question's key is in the observation window, as a chat turn has it)."""
    text = (
        "A long text follows. Some special magic numbers are hidden in it; remember them, you "
        f"will be asked about them afterwards.\n\n{doc.text}\n\n{question(doc.facts[0].key)}"
    )
    ids = tok.apply_chat([{"role": "user", "content": text}])
    return ids + tok.hf.encode(" " + answer_prefix(doc.facts[0].key), add_special_tokens=False)


def fresh_turn(tok: Any, doc: Doc, i: int) -> list[int]:
    """Question i with the whole document, as one new request (the fresh-prefill row)."""
    return first_turn(tok, Doc(doc.text, (doc.facts[i],)))


def turn_markers(tok: Any) -> tuple[str, str]:
    """(what ends an answer and opens the next user turn, what opens the assistant's) in the
    model's own chat template; plain paragraphs for a model without one."""
    from ctxlab.model.tokenizer import plain_chat_text

    chat = [
        {"role": "user", "content": "\x01"},
        {"role": "assistant", "content": "\x02"},
        {"role": "user", "content": "\x03"},
    ]
    if tok.has_chat_template:
        text = tok.hf.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    else:
        text = plain_chat_text(chat, add_generation_prompt=True)
    after = text[text.index("\x02") + 1 :]
    return after[: after.index("\x03")], after[after.index("\x03") + 1 :]


def next_turn(tok: Any, markers: tuple[str, str], last: RequestOutput, key: str) -> list[int]:
    """The tokens a follow-up appends to a held conversation: the end of the answer (unless
    the model already ended it with its end-of-turn token), the question, the answer's
    first words."""
    joint, opening = markers
    eos = set(tok.eos_token_ids)
    if last.token_ids and last.token_ids[-1] in eos:
        ended = tok.decode([last.token_ids[-1]], skip_special_tokens=False)
        joint = joint.removeprefix(ended)
    text = joint + question(key) + opening + " " + answer_prefix(key)
    return tok.hf.encode(text, add_special_tokens=False)


def right(answer: str, value: str) -> bool:
    return value in answer


# -- running the rows -----------------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    """Which row a run of the conversations fills: its class, its policy's index in
    `followup.policies` and its budget (a share of the prompt, or tokens)."""

    kind: RowKind
    policy: int | None = None
    share: float | None = None
    tokens: int | None = None


def _conversations(
    llm: LLM, tok: Any, docs: list[Doc], prompts: list[list[int]], s: Setting, c: FollowupSection
) -> Row:
    """Question 1 for every document at once, held; then each follow-up for all of them
    at once, against the caches question 1 left."""
    from ctxlab.engine import SamplingParams

    params = SamplingParams(max_tokens=c.answer_tokens)
    markers = turn_markers(tok)
    outs = llm.generate(prompts, params, hold=True)
    rids = [o.request_id for o in outs]
    kv = llm.engine.kv
    ttft, tpot, computed = [], [], []
    try:
        q1 = tuple(right(o.text, d.facts[0].value) for o, d in zip(outs, docs, strict=True))
        resident_q1 = tuple(kv.resident_bytes(llm.engine.seqs[r].kv) for r in rids)
        preemptions = sum(o.metrics.preemptions for o in outs)
        per_doc: list[list[bool]] = [[] for _ in docs]
        for i in range(1, c.facts):
            turns = [
                next_turn(tok, markers, o, d.facts[i].key) for o, d in zip(outs, docs, strict=True)
            ]
            outs = llm.follow_up(rids, turns, params)
            for j, (o, d) in enumerate(zip(outs, docs, strict=True)):
                per_doc[j].append(right(o.text, d.facts[i].value))
                ttft.append(o.metrics.ttft * 1e3)
                tpot.append(o.metrics.tpot * 1e3)
                computed.append(o.metrics.prompt_tokens - o.metrics.reused_tokens)
                preemptions += o.metrics.preemptions
        resident_end = tuple(kv.resident_bytes(llm.engine.seqs[r].kv) for r in rids)
        far = getattr(llm.engine.runtime, "far", None)
        far_out, far_in = (None, None) if far is None else (far.tier.bytes_out, far.tier.bytes_in)
    finally:
        llm.release(rids)
    return Row(
        s.kind,
        s.policy,
        s.share,
        s.tokens,
        q1,
        tuple(x for doc in per_doc for x in doc),
        resident_q1,
        resident_end,
        tuple(ttft),
        tuple(tpot),
        tuple(computed),
        preemptions,
        far_out,
        far_in,
    )


def _fresh(llm: LLM, tok: Any, docs: list[Doc], c: FollowupSection) -> tuple[Row, list[float]]:
    """The no-loss baseline: each question as a new request with the whole document. Its
    TTFT is measured cold, one request at a time (question 1: nothing of the document is
    cached yet; this also fills the prefix cache every other row reuses); its follow-ups are
    answered from the prefix cache, which serves the same prompt's blocks (their TTFT is
    not the fresh prefill's and is not reported)."""
    from ctxlab.engine import SamplingParams

    params = SamplingParams(max_tokens=c.answer_tokens)
    cold, q1, resident = [], [], []
    for d in docs:
        (out,) = llm.generate([first_turn(tok, d)], params)
        cold.append(out.metrics.ttft * 1e3)
        q1.append(right(out.text, d.facts[0].value))
        resident.append(out.metrics.resident_kv_bytes)
    per_doc: list[list[bool]] = [[] for _ in docs]
    for i in range(1, c.facts):
        outs = llm.generate([fresh_turn(tok, d, i) for d in docs], params)
        for j, (o, d) in enumerate(zip(outs, docs, strict=True)):
            per_doc[j].append(right(o.text, d.facts[i].value))
    follow = tuple(x for doc in per_doc for x in doc)
    row = Row(
        "fresh prefill", None, None, None, tuple(q1), follow, tuple(resident), tuple(resident),
        (), (), (), 0, None, None,
    )  # fmt: skip
    return row, cold


def settings(c: FollowupSection) -> list[tuple[Setting, Any, Any]]:
    """(setting, policy, budget) of every compressed row, in table order: each policy at
    each budget, then recall's base alone at its share and recall (a built object)."""
    from ctxlab.policy.registry import POLICIES

    out: list[tuple[Setting, Any, Any]] = []
    for i, name in enumerate(c.policies):
        kind = kind_of(POLICIES[name].needs)
        for b in c.budgets:
            out.append((Setting(kind, i, share=b), name, b))
    if c.recall_tokens:
        from ctxlab.policy import make_policy

        recall = make_policy("recall", c.recall_tokens, base=c.recall_base)
        share = c.recall_tokens - recall.recall_tokens()
        out.append((Setting("recall base", tokens=share), c.recall_base, share))
        out.append((Setting("recall", tokens=c.recall_tokens), recall, None))
    return out


def steps(session: Session) -> int:
    c = DEMO.config(session.cfg)
    return 2 + len(settings(c))


def measure(session: Session, tracker: Tracker) -> Measured:
    c = DEMO.config(session.cfg)
    tok = session.loaded.tokenizer
    docs = documents(c, session.cfg.model.seed)
    prompts = [first_turn(tok, d) for d in docs]
    longest = max(prompts, key=len)
    need = len(longest) + c.facts * (c.answer_tokens + 48)
    if need > session.cfg.model.max_model_len:
        from ctxlab.errors import CtxlabError

        raise CtxlabError(
            f"followup: a conversation needs about {need} tokens, more than "
            f"model.max_model_len {session.cfg.model.max_model_len}; lower filler_units or facts."
        )
    t0 = time.perf_counter()
    llm = session.llm(
        pool_tokens=c.pool_tokens,
        max_num_seqs=max(c.documents, 1),
        max_num_batched_tokens=max(session.cfg.engine.max_num_batched_tokens, len(longest)),
    )
    fresh, cold = _fresh(llm, tok, docs, c)
    tracker.advance()
    rows = [_conversations(llm, tok, docs, prompts, Setting("full"), c), fresh]
    tracker.advance()
    for setting, policy, budget in settings(c):
        llm.set_policy(policy, budget)
        rows.append(_conversations(llm, tok, docs, prompts, setting, c))
        tracker.advance()
    llm.set_policy(None)
    return Measured(
        tuple(rows),
        tuple(docs),
        tuple(len(p) for p in prompts),
        tuple(cold),
        session.slot_bytes(llm),
        tuple(c.budgets),
        c.budgets[0],
        time.perf_counter() - t0,
    )


def refused_here(model: Path, c: FollowupSection) -> str | None:
    """Why the configured policies cannot all run on `model` (a policy, or recall, refused
    beside sliding-window layers: `ctxlab.policy.windowed`), read from its header; None when
    they can."""
    from ctxlab.engine_options import has_sliding_layers
    from ctxlab.policy.windowed import REFUSED

    named = [n for n in c.policies if n in REFUSED]
    recall = bool(c.recall_tokens) and "recall" in REFUSED
    if not (named or recall) or not has_sliding_layers(model):
        return None
    fixes = [f"leave {', '.join(named)} out of followup.policies"] if named else []
    fixes += ["set followup.recall_tokens = 0"] if recall else []
    why = "; ".join(f"{n}: {REFUSED[n]}" for n in [*named, *(["recall"] if recall else [])])
    return (
        f"the model {model.name} has sliding-window layers, beside which these cannot run "
        f"({why}); {' and '.join(fixes)} (`ctxlab policies` lists what runs)"
    )


def run(session: Session, tracker: Tracker) -> DemoResult:
    from ctxlab.workshop import followup_report as report

    refused = refused_here(session.loaded.source_path, DEMO.config(session.cfg))
    if refused is not None:  # said before the engine refuses it, and the run goes on
        res = DemoResult.of(DEMO, "not measurable")
        res.summary = f"Not measurable as configured: {refused}."
        res.notes.append(res.summary)
        return res
    m = measure(session, tracker)
    c = DEMO.config(session.cfg)
    res = DemoResult.of(DEMO, "run", "measured")
    claims = report.verdicts(res, m)
    report.tables(session, res, m, c)
    report.explain(session, res, m, claims, c, FULL_DOCUMENTS)
    res.plots.append(report.draw(m, c, DEMO.plot("10_followup.png").path(session.out)))
    return res


def _not_through_a_server(session: Session, run: ServerRun) -> DemoResult:
    from ctxlab.workshop.server_demos import not_measurable

    return not_measurable(DEMO, NOT_THROUGH_A_SERVER)


NOT_THROUGH_A_SERVER = (
    "an OpenAI-compatible API neither lets a client choose the server's retention policy nor "
    "keeps one request's compressed cache for the next question (each request is prefilled "
    "anew or served from the uncompressed prefix cache), so the question after compression "
    "cannot be asked through it"
)


# -- declarations ---------------------------------------------------------------------------
class FollowupSection(Section):
    """Demonstration 10: follow-up questions against one compressed cache."""

    documents: Pos  # conversations: question 1 per document, facts - 1 follow-ups each
    facts: Annotated[int, Field(ge=2, le=16)]
    filler_units: Pos
    haystack: Literal["noise", "essay", "needle"]
    policies: list[str] = Field(min_length=1)
    budgets: list[Annotated[float, Field(gt=0, lt=1)]] = Field(min_length=1)
    recall_base: str
    recall_tokens: Annotated[int, Field(ge=0)]  # 0: no recall rows
    answer_tokens: Pos
    pool_tokens: Pos

    @field_validator("policies")
    @classmethod
    def _names(cls, names: list[str]) -> list[str]:
        from ctxlab.policy.registry import REGISTERED

        for name in names:
            if name not in REGISTERED:
                raise ValueError(f"{name!r} is not a policy (known: {', '.join(REGISTERED)})")
        if len(set(names)) != len(names):
            raise ValueError("policies must be distinct")
        return names

    @field_validator("recall_base")
    @classmethod
    def _base(cls, name: str) -> str:
        from ctxlab.policy.registry import REGISTERED

        if name not in REGISTERED:
            raise ValueError(f"{name!r} is not a policy (known: {', '.join(REGISTERED)})")
        return name

    @model_validator(mode="after")
    def _shape(self) -> FollowupSection:
        if sorted(set(self.budgets), reverse=True) != self.budgets:
            raise ValueError("budgets must be distinct and in decreasing order")
        return self


def _preflight(c: FollowupSection) -> None:
    """Every configured policy must evict (a retention policy): said before the model loads."""
    from ctxlab.errors import CtxlabError
    from ctxlab.policy.registry import POLICIES

    for name in [*c.policies, c.recall_base]:
        cls = POLICIES[name]
        if cls.stack_layer != "retention" or cls.evicts is not True:
            raise CtxlabError(
                f"followup: {name} is not a retention policy that evicts; the demonstration "
                "compares what policies keep (choose e.g. snapkv, h2o, streaming)."
            )
    if c.recall_tokens:
        from ctxlab.policy import make_policy

        make_policy("recall", c.recall_tokens, base=c.recall_base)  # raises when too small


_FULL = "full cache (held after question 1)"
_QA = "query-aware policies at the first budget (mean per question)"
METRICS = (
    Metric(
        "q1_accuracy_query_aware_pct",
        "%",
        _FULL,
        _QA,
        "question 1 answered right (the question the cache was compressed for)",
    ),
    Metric(
        "followup_accuracy_query_aware_pct",
        "%",
        _FULL,
        _QA,
        "follow-up questions answered right against the same compressed cache",
    ),
    Metric(
        "q1_accuracy_positional_pct",
        "%",
        _FULL,
        "positional policies at the first budget (mean per question)",
        "question 1 answered right under a policy that keeps tokens by position",
    ),
    Metric(
        "followup_accuracy_positional_pct",
        "%",
        _FULL,
        "positional policies at the first budget (mean per question)",
        "follow-ups answered right under a policy that keeps tokens by position",
    ),
    Metric(
        "followup_accuracy_recall_pct",
        "%",
        "recall's base policy alone at its share of the budget",
        "recall (the same base plus blocks recalled from the far tier)",
        "follow-ups answered right with and without recall of evicted blocks",
    ),
    Metric(
        "followup_accuracy_fresh_pct",
        "%",
        _FULL,
        "a fresh prefill of the whole document per question",
        "follow-ups answered right without any loss, held cache or recomputed",
    ),
    Metric(
        "kv_bytes_resident",
        "bytes",
        "full cache after question 1 (mean per conversation)",
        "every policy at the first budget (mean per conversation)",
        "KV bytes one conversation holds in the pool between its questions",
    ),
    Metric(
        "followup_ttft_ms",
        "ms",
        "a fresh prefill of the document and the question (cold, median)",
        "a follow-up against the held full cache (median)",
        "time to the first token of the follow-up's answer",
    ),
    Metric(
        "recall_tpot_ms",
        "ms",
        "recall's base policy alone (median per follow-up)",
        "recall (median per follow-up)",
        "time per output token of a follow-up's answer: what reading the far tier costs",
    ),
)

TOML = """\
# -- 10: the question after compression ------------------------------------------------------
[followup]
documents = 6                 # conversations; each asks question 1, then facts - 1 follow-ups
facts = 3                     # facts planted per document (each asked once)
filler_units = 170            # filler sentences per document (about 1,000 tokens on smollm2-135m)
haystack = "noise"            # noise, essay or needle filler (ctxlab.eval.haystack)
# retention policies (ctxlab policies), each at each budget (a share of question 1's prompt);
# their class (query-aware, key-based, positional) is read from what each policy observes
policies = ["snapkv", "pyramidkv", "h2o", "tova", "keydiff", "streaming", "window"]
budgets = [0.25, 0.1]         # decreasing; the class metrics read the first
recall_base = "snapkv"        # recall of evicted blocks from a far tier wraps this policy
recall_tokens = 128           # recall's whole budget (0: no recall rows); its base alone is
                              # run at the same pool share beside it
answer_tokens = 5             # greedy answer tokens (a space and a 4-digit number)
pool_tokens = 10240           # the engine's KV pool: every document cached plus held caches
"""

PREDICTIONS_TOML = """\
[predictions.followup]        # baseline: the full cache held after question 1, unless noted
# query-aware policies keep what question 1 looks at: question 1 holds, the follow-ups fall
q1_accuracy_query_aware_pct = { direction = "unchanged", tolerance = 0.25 }
followup_accuracy_query_aware_pct = { direction = "down" }
# positional policies keep the same tokens whatever is asked: both fall
q1_accuracy_positional_pct = { direction = "down" }
followup_accuracy_positional_pct = { direction = "down" }
# recall brings part of what was evicted back (baseline: its base alone), at a cost per token
followup_accuracy_recall_pct = { direction = "up" }
recall_tpot_ms = { direction = "up" }
# a fresh prefill loses nothing either: as right as the held full cache
followup_accuracy_fresh_pct = { direction = "unchanged", tolerance = 0.25 }
kv_bytes_resident = { direction = "down" }
# the held cache is not prefilled again: the follow-up's first token comes much sooner
followup_ttft_ms = { direction = "down", tolerance = 0.5 }
"""

QUICK_TOML = """\
[quick.followup]
documents = 3
facts = 2
filler_units = 60
policies = ["snapkv", "streaming"]
budgets = [0.25]
recall_tokens = 96
pool_tokens = 4096
"""

# --full: enough conversations that question 1 has 30 pairs per setting and the follow-ups
# twice that (the default's 6 and 12 leave most intervals spanning tens of points)
FULL_DOCUMENTS = 30
FULL_TOML = f"""\
[full.followup]
documents = {FULL_DOCUMENTS}                # question-1 pairs per setting; follow-up pairs:
                              # {FULL_DOCUMENTS} x (facts - 1): {2 * FULL_DOCUMENTS} at 3 facts
pool_tokens = 51200           # every document cached plus 30 held conversations
"""


DEMO = Demonstration(
    number=10,
    key="followup",
    title="The question after compression",
    section=FollowupSection,
    metrics=METRICS,
    layers=("storage", "serving", "task"),
    steps=steps,
    run=run,
    toml=TOML,
    predictions_toml=PREDICTIONS_TOML,
    quick_toml=QUICK_TOML,
    full_toml=FULL_TOML,
    required=("kv_bytes_resident", "followup_accuracy_query_aware_pct"),
    preflight=_preflight,
    server=ServerMode(
        variant=_not_through_a_server,
        instead="not measurable: a server's API neither sets its retention policy nor "
        "keeps a compressed cache between requests",
    ),
    plots=(
        Plot(
            "10_followup.png",
            "per setting, question 1 and follow-ups answered right (95 % intervals) against "
            "the KV bytes a conversation holds",
        ),
    ),
)
