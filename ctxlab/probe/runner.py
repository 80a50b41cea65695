"""One probe run: identify the server, check the token rule, then the sections in order
(prefix caching, isolation, capacity, step-time profile), each bounded by the run's budget.

A section the budget cannot pay for is skipped with the reason. A server that dies mid-run,
or answers something the probe cannot use (a malformed stream, a field of the wrong type, an
HTTP error) after the calibration, ends the run: the sections done so far are kept, the
failing one is listed under `failed` with the one-sentence reason, the later ones under
`not_run`, and `report.error` says what happened (the caller writes the report and exits
non-zero). A failure before anything was measured (identification, calibration) raises.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ctxlab.errors import CtxlabError
from ctxlab.probe import capacity, isolation, prediction, prefix, steptime, window
from ctxlab.probe import events as probe_events
from ctxlab.probe.calibration import CALIBRATION, calibrate
from ctxlab.probe.client import Budget, BudgetSpent, ProbeClient, ServerGone
from ctxlab.probe.figures import Figure
from ctxlab.probe.hints import cached_tokens_hint
from ctxlab.probe.identify import ServerInfo, check_url, identify
from ctxlab.probe.metrics import published_block_size, published_capacity, scrape, usage_gauge
from ctxlab.probe.prompts import TokenRule, Words
from ctxlab.probe.report import ProbeReport

SECTIONS = ("prefix", "isolation", "capacity", "profile")


@dataclass
class ProbeConfig:
    server: str
    model: str | None = None
    api_key: str | None = None
    sections: tuple[str, ...] = SECTIONS
    max_requests: int = 1000
    max_tokens: int = 400_000
    max_seconds: float = 900.0
    longest: int = 300  # the staircase's longest divergence position
    quick: bool = True
    timeout: float = 300.0
    nonce: int = field(default_factory=lambda: secrets.randbits(32))
    profile_design: steptime.ProfileDesign | None = None  # library callers: their own design
    arch: str | None = None  # the served model's architecture for the planner's prediction
    kv_events: str | None = None  # the server's KV-event publisher, listened to throughout
    architecture: prediction.Architecture | None = field(default=None, init=False)

    def check(self) -> ProbeConfig:
        check_url(self.server)
        bad = [s for s in self.sections if s not in SECTIONS]
        if bad or not self.sections:
            raise CtxlabError(
                f"--sections {','.join(bad) or '(empty)'}: use a comma list of "
                f"{', '.join(SECTIONS)}"
            )
        if self.max_requests < 1 or self.max_tokens < 1 or not self.max_seconds > 0:
            raise CtxlabError("--max-requests, --max-tokens and --max-seconds must be positive")
        if not 16 <= self.longest <= 100_000:
            raise CtxlabError(f"--longest {self.longest} must be between 16 and 100000 tokens")
        if self.arch is not None:
            self.architecture = prediction.user_architecture(self.arch)
        if self.kv_events is not None:
            probe_events.check_endpoint(self.kv_events)
        return self

    def design(self) -> steptime.ProfileDesign:
        if self.profile_design is not None:
            return self.profile_design
        return steptime.QUICK if self.quick else steptime.FULL


def plan(cfg: ProbeConfig) -> dict[str, int]:
    """Requests and prompt tokens each section sends at most (capacity: what the budget
    leaves, since it sends until the cache evicts)."""
    out: dict[str, int] = {"calibration requests": 2, "calibration tokens": sum(CALIBRATION)}
    if "prefix" in cfg.sections:
        r, t = prefix.planned(cfg.longest)
        out |= {"prefix requests": r, "prefix tokens": t}
    if "isolation" in cfg.sections:
        r, t = isolation.planned()
        out |= {"isolation requests": r, "isolation tokens": t}
    if "profile" in cfg.sections:
        r, t = cfg.design().planned()
        out |= {"profile requests": r + 1, "profile tokens": t + 32}
    fixed_r = sum(v for k, v in out.items() if k.endswith("requests"))
    fixed_t = sum(v for k, v in out.items() if k.endswith("tokens"))
    if "capacity" in cfg.sections:
        out |= {
            "capacity requests (at most)": max(0, cfg.max_requests - fixed_r),
            "capacity tokens (at most)": max(0, cfg.max_tokens - fixed_t),
        }
    out["total requests (at most)"] = min(
        cfg.max_requests, sum(v for k, v in out.items() if "requests" in k)
    )
    out["total prompt tokens (at most)"] = min(
        cfg.max_tokens, sum(v for k, v in out.items() if "tokens" in k and "total" not in k)
    )
    return out


def run(
    cfg: ProbeConfig,
    step: Callable[[str], None] | None = None,
    on_identified: Callable[[ServerInfo, dict[str, int]], None] | None = None,
) -> ProbeReport:
    """Run the probe; raises CtxlabError before anything is measured (bad URL, key, model),
    otherwise always returns a report (its `error` says if the server died mid-run). With
    `kv_events`, the server's KV events are read throughout and the capacity they show is
    added beside the published and the measured one (`report.residency` holds them)."""
    cfg.check()
    listener = probe_events.EventListener(cfg.kv_events).start() if cfg.kv_events else None
    try:
        report = _run(cfg, step, on_identified)
    finally:
        res = listener.stop() if listener is not None else None
    if listener is not None and res is not None:
        pub = report.figure("capacity", "capacity published in /metrics")
        value = pub.value if pub is not None and pub.how == "measured" else None
        got = probe_events.capacity(res, listener, value if isinstance(value, int) else None)
        report.add("capacity" if "capacity" in report.sections else "KV events", [got.figure])
        report.residency = res
        report.details["kv events"] = {
            "endpoint": listener.endpoint,
            "batches": listener.subscriber.received_batches,
            "gaps": [
                {"first": g.first, "last": g.last, "replayed": g.replayed, "missing": g.missing}
                for g in listener.subscriber.gaps
            ],
            "events_dropped": listener.subscriber.dropped_events,
        }
    return report


def _run(
    cfg: ProbeConfig,
    step: Callable[[str], None] | None,
    on_identified: Callable[[ServerInfo, dict[str, int]], None] | None,
) -> ProbeReport:
    say = step or (lambda _m: None)
    budget = Budget(cfg.max_requests, cfg.max_tokens, cfg.max_seconds)
    client = ProbeClient(cfg.server, cfg.model or "", cfg.api_key, budget, cfg.timeout)
    try:
        info = identify(client, cfg.model)
        client.model = info.model
        report = ProbeReport(info, plan(cfg), cfg.nonce)
        if on_identified is not None:
            on_identified(info, report.plan)
        try:
            words, rule = calibrate(client, info, cfg.nonce)
            report.token_rule = f"prompt tokens = words + {rule.offset} (checked by {rule.how})"
            say("calibrated")
            _sections(cfg, client, info, words, rule, report, say)
        except ServerGone as exc:
            report.error = (
                f"the server at {info.url} stopped answering during the probe ({exc}); the "
                "sections finished before it are kept"
            )
            _stopped(cfg, report, f"the server stopped answering: {exc}")
        except CtxlabError as exc:
            if not report.running:
                raise  # nothing measured yet: one sentence, exit 2, no report
            why = str(exc).rstrip(".")
            report.error = (
                f"the {report.running} section failed ({why}); the sections finished before "
                "it are kept"
            )
            _stopped(cfg, report, why)
        except BudgetSpent:
            report.not_run.setdefault("calibration", "the budget is smaller than the calibration")
        report.sent = {"requests": budget.requests, "prompt tokens": budget.tokens}
        return report
    finally:
        client.close()


def _stopped(cfg: ProbeConfig, report: ProbeReport, why: str) -> None:
    """The section that was running when the run ended, marked with `why`; every later
    selected section listed as not run."""
    if not report.running:
        return
    report.failed[report.running] = why
    later = cfg.sections[cfg.sections.index(report.running) + 1 :]
    for name in later:
        report.not_run[name] = f"the run ended in the {report.running} section, before it"


def _sections(
    cfg: ProbeConfig,
    client: ProbeClient,
    info: ServerInfo,
    words: Words,
    rule: TokenRule,
    report: ProbeReport,
    say: Callable[[str], None],
) -> None:
    page: int | None = None
    if "prefix" in cfg.sections:
        report.running = "prefix"
        try:
            pre = prefix.measure(client, words, rule, cfg.longest, say)
            figures = pre.figures()
            if not pre.cached_source:  # no cached-token report: name the flag that adds it
                figures = _with_hint(figures, cached_tokens_hint(info.engine))
            report.add("prefix caching", figures)
            report.details["staircase"] = pre.staircase()
            report.add("prefix caching", [kind_of_cache(info, pre.granularity)])
            if isinstance(pre.granularity.value, int):
                page = pre.granularity.value
                report.add("prefix caching", _past_window(cfg, info, pre, page))
        except BudgetSpent:
            report.not_run["prefix"] = (
                "the budget ran out (--max-requests / --max-tokens / --max-seconds)"
            )
    if "isolation" in cfg.sections:
        report.running = "isolation"
        try:
            iso = isolation.measure(client, words, rule, cfg.nonce, say, page)
            figures = iso.figures()
            if iso.reused and iso.reused.get("same salt") is None:
                figures = _with_hint(figures, cached_tokens_hint(info.engine))
            report.add("isolation", figures)
            report.details["isolation"] = iso.reused
        except BudgetSpent:
            report.not_run["isolation"] = (
                "the budget ran out (--max-requests / --max-tokens / --max-seconds)"
            )
    report.running = "capacity" if "capacity" in cfg.sections else report.running
    samples = scrape(client) if info.has_metrics else None
    if "capacity" in cfg.sections:
        pub = published_capacity(samples)
        if info.engine == "llama.cpp" and info.slots and info.max_model_len:
            pub = Figure(
                "capacity published in /props", info.slots * info.max_model_len, "measured",
                f"{info.slots} slots x {info.max_model_len} tokens of context each (/props); "
                "each slot keeps one prompt", "tokens",
            )  # fmt: skip
        figures = [pub]
        before = (client.budget.requests, client.budget.tokens, time.monotonic())
        if page is None and "prefix" not in cfg.sections:
            page = published_block_size(samples)  # the server's own word, confirmed below
        if page is None:
            report.not_run["capacity"] = (
                "needs the cache granularity from the prefix section or a block size in /metrics"
            )
        else:
            try:
                published = pub.value if pub.how == "measured" and page > 1 else None
                cap = capacity.measure(
                    client, words, rule, page, info.max_model_len or 2048, say,
                    published=published if isinstance(published, int) else None,
                )  # fmt: skip
                figures.insert(0, cap.capacity)
                report.details["capacity trials"] = cap.trials
                sent_r = client.budget.requests - before[0]
                sent_t = client.budget.tokens - before[1]
                figures.insert(1, Figure(
                    "sent by the capacity section", f"{sent_r:,} requests, {sent_t:,} tokens",
                    "measured", f"{len(cap.trials)} fill{'s' if len(cap.trials) != 1 else ''} in "
                    f"{time.monotonic() - before[2]:.0f} s",
                ))  # fmt: skip
            except BudgetSpent:
                report.not_run["capacity"] = (
                    "the budget ran out (--max-requests / --max-tokens / --max-seconds)"
                )
        figures.append(usage_gauge(scrape(client) if info.has_metrics else None))
        figures += _predicted(cfg, info, samples, pub, figures, page, report)
        report.add("capacity", figures)
    if "profile" in cfg.sections:
        report.running = "profile"
        try:
            prof = steptime.measure(client, words, rule, cfg.design(), say, info.slots)
            report.add("step times", prof.figures())
            report.details["profile steps"] = prof.steps
            report.details["profile missing"] = prof.missing
            report.details["profile"] = steptime.profile_document(
                prof,
                info.label(),
                info.model,
                page,
                _pool(report, samples),
                "quick" if cfg.quick else "full",
            )
        except BudgetSpent:
            report.not_run["profile"] = (
                "the budget ran out (--max-requests / --max-tokens / --max-seconds)"
            )


def _past_window(
    cfg: ProbeConfig, info: ServerInfo, pre: prefix.PrefixResult, page: int
) -> list[Figure]:
    """What the server reuses past the served model's sliding window (none without one)."""
    arch = cfg.architecture or prediction.served_architecture(info)
    found = window.sliding_window(arch.spec) if not isinstance(arch, str) else None
    if found is None:
        return []
    return [window.past_window(pre.points, *found, page, left_out=pre.left_out())]


def _predicted(
    cfg: ProbeConfig,
    info: ServerInfo,
    samples: list[tuple[str, dict[str, str], float]] | None,
    published: Figure,
    figures: list[Figure],
    page: int | None,
    report: ProbeReport,
) -> list[Figure]:
    """The planner's prediction for this server and the sentence saying which of predicted,
    published and measured disagrees."""
    arch = cfg.architecture or prediction.served_architecture(info)
    pred = prediction.predict(info, samples, arch)
    if pred.pool is not None:
        report.details["engine pool"] = pred.pool
    measured = next(
        (f.value for f in figures if f.name == "prefix-cache capacity" and f.how == "measured"),
        None,
    )
    pub = published.value if published.how == "measured" else None
    verdict = prediction.agreement(
        pred.tokens,
        pub if isinstance(pub, int) else None,
        measured if isinstance(measured, int) else None,
        page or 1,
    )
    return [*pred.figures, verdict]


def _pool(
    report: ProbeReport, samples: list[tuple[str, dict[str, str], float]] | None
) -> int | None:
    """The pool for the step profile: the measured capacity, else the published one."""
    for fig in (
        report.figure("capacity", "prefix-cache capacity"),
        report.figure("capacity", "capacity published in /metrics"),
        published_capacity(samples),
    ):
        if fig is not None and fig.how == "measured" and isinstance(fig.value, int):
            return fig.value
    return None


def _with_hint(figures: list[Figure], hint: str) -> list[Figure]:
    """The figures, each one the missing report left unmeasured or inferred naming the fix."""
    return [
        Figure(f.name, f.value, f.how, f"{f.note}; {hint}", f.unit) if f.how != "measured" else f
        for f in figures
    ]


def kind_of_cache(info: ServerInfo, granularity: Figure) -> Figure:
    """What kind of cache the staircase and the engine's own description say this is."""
    if granularity.value == 1 and info.engine == "llama.cpp":
        n = f"{info.slots} slots" if info.slots else "its slots"
        return Figure(
            "kind of cache", "one cached prompt per slot, longest common prefix", "inferred",
            f"token-granular staircase and llama.cpp's {n} (/props); a new prompt reuses the "
            "longest prefix it shares with the prompt its slot last held",
        )  # fmt: skip
    if granularity.value == 1:
        return Figure(
            "kind of cache",
            "token-granular prefix reuse",
            "inferred",
            "cached = divergence position (a radix tree or per-slot longest common prefix)",
        )
    if isinstance(granularity.value, int):
        return Figure(
            "kind of cache",
            f"shared pages of {granularity.value} tokens",
            "inferred",
            "only whole pages are reused; a prompt's last partial page never is",
        )
    return Figure("kind of cache", None, "not measurable", granularity.note)
