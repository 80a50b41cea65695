"""What could go wrong in a long-context decision, checked item by item against this run.

Each item is a known way to fool oneself (from the project's brief). For each, this run says
whether it guards against it and how, citing its own measured figures, or that it does not
exercise it (a demonstration not run, a mechanism not in the config). The text is built from
the run's results, so a run that skipped a demonstration cannot claim its guard.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ctxlab.workshop.result import fmt

Results = dict[str, Any]


def _fig(res: Results, key: str) -> dict[str, Any] | None:
    demo = res["demos"].get(key)
    return demo["figures"] if demo and demo["status"] == "run" else None


def _not_run(res: Results, key: str, number: int) -> str:
    demo = res["demos"].get(key)
    status = demo["status"] if demo else "not selected"
    return f"not exercised: demonstration {number} was {status}"


def _useful(res: Results) -> tuple[str, str]:
    nums = {r["name"]: r["tokens"] for r in res["context_numbers"]}
    configured = fmt(nums["configured maximum length"])
    if res.get("useful_context") is None:
        return "partly guarded", (
            f"the configured maximum ({configured} tokens) is its own row of the context "
            "numbers, but this run did not measure useful context (the eval is off)"
        )
    eff = nums["measured useful context"]
    said = f"{fmt(eff)} tokens" if eff is not None else "below the shortest tested length"
    return "guarded", (
        f"the configured maximum ({configured} tokens) and the measured useful context "
        f"({said}, from the eval's effective length) are separate rows of the context numbers"
    )


def _payload_vs_compute(res: Results) -> tuple[str, str]:
    f = _fig(res, "warm_prefix")
    if f is None:
        return "not exercised", _not_run(res, "warm_prefix", 2)
    return "guarded", (
        f"demonstration 2 separates them: reuse removed prefill work (median TTFT "
        f"{fmt(f['ttft_cold_ms'], 1)} -> {fmt(f['ttft_warm_ms'], 1)} ms) while decode, which "
        f"reads the whole KV payload at every step, kept its pace (TPOT {fmt(f['tpot_cold_ms'], 2)}"
        f" -> {fmt(f['tpot_warm_ms'], 2)} ms)"
    )


def _paging_bytes(res: Results) -> tuple[str, str]:
    f = _fig(res, "page_size")
    if f is None:
        return "not exercised", _not_run(res, "page_size", 3)
    return "guarded", (
        f"demonstration 3 reads the bytes of one token slot from the pool at every page size "
        f"({fmt(f['slot_bytes'])} bytes each time): paging changes waste and reuse, not the "
        "size of a token"
    )


def _hit_requests(res: Results) -> tuple[str, str]:
    f = _fig(res, "prefix_miss")
    if f is None:
        return "not exercised", _not_run(res, "prefix_miss", 1)
    return "guarded", (
        f"reuse is counted in tokens: in demonstration 1 the middle change is a hit request "
        f"that reused {fmt(f['reused_mid'])} tokens and recomputed {fmt(f['recomputed_mid'])}"
    )


def _lru(res: Results) -> tuple[str, str]:
    f = _fig(res, "eviction")
    if f is None:
        return "not exercised", _not_run(res, "eviction", 4)
    return "guarded", (
        f"the prefix cache is reported as an LRU cache of exact token blocks: in demonstration "
        f"4 the arrival order alone moved reuse from {fmt(f['reused_grouped'])} to "
        f"{fmt(f['reused_interleaved'])} tokens, which no memory of meaning would do"
    )


def _tenants(res: Results) -> tuple[str, str]:
    f = _fig(res, "prefix_miss")
    if f is None:
        return "not exercised", _not_run(res, "prefix_miss", 1)
    return "guarded", (
        f"demonstration 1 sent the same prompt under another tenant's cache_salt: it reused "
        f"{fmt(f['reused_tenant'])} tokens"
    )


def _summaries(res: Results) -> tuple[str, str]:
    f = _fig(res, "compaction")
    if f is None:
        return "not exercised", _not_run(res, "compaction", 5)
    names = [k.removeprefix("accuracy_") for k in f if k.startswith("accuracy_")]
    per = "; ".join(
        f"{name}: {fmt(f[f'tokens_after_{name}'])} tokens, {fmt(f[f'in_prompt_{name}'])} of "
        f"{fmt(f['facts'])} answers in the prompt when asked, {fmt(f[f'accuracy_{name}'], 1)}% "
        "answered right"
        for name in names
    )
    return "guarded", (
        f"demonstration 5 judges each strategy by the planted facts it kept, the ones a search "
        f"still finds and the ones lost, and by the answers, beside its tokens ({per})"
    )


def _recall_only(res: Results) -> tuple[str, str]:
    f = _fig(res, "retrieval_depth")
    if f is None:
        return "not exercised", _not_run(res, "retrieval_depth", 6)
    return "guarded", (
        f"demonstration 6 reports answer accuracy and citation precision beside recall@k: "
        f"recall {fmt(f['recall_lo_pct'], 1)}% -> {fmt(f['recall_hi_pct'], 1)}% over all "
        f"{fmt(f['questions'])} questions, accuracy {fmt(f['accuracy_lo_pct'], 1)}% -> "
        f"{fmt(f['accuracy_hi_pct'], 1)}% and citation precision "
        f"{fmt(f['citation_precision_lo_pct'], 1)}% -> {fmt(f['citation_precision_hi_pct'], 1)}% "
        + (
            f"on all {fmt(f['answered'])} questions"
            if f["answered"] == f["questions"]
            else f"on a seeded subset of {fmt(f['answered'])}"
        )
        + ", smallest k to largest"
    )


def _ratios(res: Results) -> tuple[str, str]:
    return "guarded", (
        "storage tables carry no quality column and the report draws no quality conclusion "
        "from bytes; the task table is measured separately and names its own layer"
    )


def _recurrent(res: Results) -> tuple[str, str]:
    if _fig(res, "recurrent_vs_kv") is None:
        return "not exercised", _not_run(res, "recurrent_vs_kv", 7)
    return "guarded", (
        "demonstration 7 calls the recurrent state a fixed, lossy summary and claims only "
        "capacity and latency for it; it says that no quality decision is established"
    )


def _offload(res: Results) -> tuple[str, str]:
    return "not exercised", (
        "no demonstration offloads KV to a slower tier; the simulator models offload through "
        "one queued link (`ctxlab simulate --offload-bytes`), which this config does not use"
    )


def _p99(res: Results) -> tuple[str, str]:
    f = _fig(res, "recurrent_vs_kv")
    text = (
        "every latency is reported as percentiles (p50, p95, p99) or a median with its minimum "
        "and maximum, never as a mean alone"
    )
    if f is not None:
        text += (
            "; in demonstration 7 the KV-heavy model's short workload has p50 TTFT "
            f"{fmt(f['kv_short_p50'], 1)} ms and p99 {fmt(f['kv_short_p99'], 1)} ms, with "
            f"{fmt(f['kv_short_preemptions'])} preemptions behind the tail"
        )
    return "guarded", text


def _disaggregation(res: Results) -> tuple[str, str]:
    f = _fig(res, "disaggregation")
    if f is None:
        return "not exercised", _not_run(res, "disaggregation", 9)
    return "guarded", (
        "demonstration 9 ran prefill and decode in two processes and counted both sides: the "
        f"second process held {fmt(f['child_rss_mib'], 1)} MiB resident ("
        f"{fmt(f['weights_mib'], 1)} MiB of it a second copy of the weights), each long prompt "
        f"moved {fmt(f['kv_mib'], 2)} MiB of KV in {fmt(f['kv_ms'], 1)} ms, and the running "
        f"decodes' ITL p99 while long prompts prefilled went from {fmt(f['colo_itl_p99'], 1)} ms "
        f"colocated to {fmt(f['dis_itl_p99'], 1)} ms, at TTFT p50 {fmt(f['colo_ttft_p50'], 1)} "
        f"against {fmt(f['dis_ttft_p50'], 1)} ms"
    )


def _pricing(res: Results) -> tuple[str, str]:
    f = _fig(res, "warm_prefix")
    if f is None:
        return "not exercised", _not_run(res, "warm_prefix", 2)
    return "partly guarded", (
        f"the cost tables price a miss and a hit separately (hosted "
        f"{fmt(f['hosted_cold_1000'], 4)} against {fmt(f['hosted_warm_1000'], 4)} per 1,000 "
        "requests) and self-hosted cost from measured CPU seconds; every request here "
        "succeeded, so failures cost nothing in this run, and idle reserve is not priced"
    )


ITEMS: tuple[tuple[str, Callable[[Results], tuple[str, str]]], ...] = (
    ("configured context reported as useful context", _useful),
    ("KV payload and prefill compute treated as one complexity", _payload_vs_compute),
    ("paging credited with smaller bytes per token", _paging_bytes),
    ("hit requests counted instead of reused tokens", _hit_requests),
    ("an LRU cache called semantic memory", _lru),
    ("cross-tenant reuse without an isolation key", _tenants),
    ("summary quality judged by token reduction alone", _summaries),
    ("retrieval recall without answer and citation quality", _recall_only),
    ("MQA/GQA/MLA storage ratios read as quality claims", _ratios),
    ("recurrent state treated as lossless history", _recurrent),
    ("offload without queueing", _offload),
    ("averages hiding p99 collapse", _p99),
    ("disaggregation without duplicate weights and transfer", _disaggregation),
    ("pricing without misses, failures or idle reserve", _pricing),
)


def evaluate(res: Results) -> list[dict[str, str]]:
    out = []
    for risk, check in ITEMS:
        status, how = check(res)
        out.append({"risk": risk, "status": status, "how": how})
    return out
