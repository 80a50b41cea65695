"""The report's content, built once from results.json as a list of blocks.

Markdown and HTML render the same blocks (`report_markdown`, `report_html`), so the two
reports cannot disagree, and every number either prints was read back from results.json
(tables print their stored cells; prose was written with `Figures.say`). Sections: the
opening summary (what was decided, on what, the headline figures), status and run,
predictions against observations, the six context numbers, the storage / serving /
retrieval / task / cost tables (each naming its layer), each demonstration with its gains
explained twice, the "what could go wrong" list, and the files.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ctxlab.workshop.registry import BY_KEY, REGISTERED
from ctxlab.workshop.result import LAYERS, JSONObject, fmt, is_number


@dataclass
class Block:
    kind: str  # h1 h2 h3 p list table img
    text: str = ""
    items: list[str] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    note: str = ""


def _table(title: str, columns: list[str], rows: list[list[str]], note: str = "") -> Block:
    return Block("table", title, columns=columns, rows=rows, note=note)


def _stored_table(t: JSONObject) -> Block:
    cols = t["columns"]
    rows = [
        [fmt(cell, col["digits"]) for cell, col in zip(row, cols, strict=True)] for row in t["rows"]
    ]
    return _table(f"{t['title']} ({t['mode']})", [c["name"] for c in cols], rows, t.get("note", ""))


def build_document(res: JSONObject) -> list[Block]:
    doc: list[Block] = [Block("h1", "ctxlab workshop report")]
    doc += _summary(res)
    doc += _status(res)
    doc += _servers(res)
    doc += _predictions(res)
    doc += _context(res)
    doc += _layers(res)
    doc += _demos(res)
    doc += _peers(res)
    doc += _checklist(res)
    doc += _files(res)
    return doc


def _summary(res: JSONObject) -> list[Block]:
    """What was decided, on what machine and software, and each demonstration's headline."""
    run, counts = res["run"], res["verdict_counts"]
    verdicts = res["verdicts"]
    failed = [f"{v['demo']}. {v['metric']}" for v in verdicts if v["verdict"] == "failed"]
    decided = (
        f"Of the predictions written before the run, {fmt(counts['held'])} held, "
        f"{fmt(counts['failed'])} failed"
        + (f" ({', '.join(failed)})" if failed else "")
        + f", {fmt(counts.get('within noise', 0))} were within noise and "
        f"{fmt(counts['not measurable'])} not measurable; the run is {res['status']}."
        + (
            f" Only demonstrations {', '.join(str(n) for n in run['only'])} were selected "
            "(`--only`): the predictions of the others are not judged."
            if run.get("only")
            else ""
        )
    )
    server = res.get("server")
    where = f"`{run.get('engine', 'ctxlab engine')}`" + (
        f"; requests through {server['label']}" if server else ""
    )
    on = (
        f"On `{run.get('cpu_model') or 'an unnamed CPU'}` ({fmt(run['cores'])} cores, "
        f"{fmt(run['torch_threads'])} torch threads), ctxlab `{run.get('ctxlab_version') or '?'}`"
        f" at commit `{run.get('git_commit') or 'unknown (not a git checkout)'}`, torch "
        f"`{run.get('torch_version') or '?'}`, {where}; model `{run['model']}`"
        + ("; --quick sizes" if run["quick"] else "")
        + "."
    )
    heads = [
        f"{d['number']}. {d['title']}: "
        + "".join(f"{f}. " for f in [_measured(res, d)] if f)
        + d["summary"]
        for d in res["demos"].values()
        if d["status"] == "run" and d["summary"]
    ]
    out = [Block("h2", "Summary"), Block("p", decided), Block("p", on)]
    if heads:
        out += [Block("p", "Headline figures:"), Block("list", items=heads)]
    return out


def _measured(res: JSONObject, demo: JSONObject) -> str:
    """A demonstration's headline figures: its metrics the config requires, baseline ->
    observed as measured, with the verdict where one was judged ("" when none was measured)."""
    prefix = f"{demo['key']}."
    wanted = [
        r.removeprefix(prefix) for r in res["config"]["required_metrics"] if r.startswith(prefix)
    ]
    judged = {v["metric"]: v["verdict"] for v in res["verdicts"] if v["key"] == demo["key"]}
    shown = []
    for name in wanted:
        o = demo["observations"].get(name)
        if o is None or not all(is_number(o[k]) for k in ("baseline", "observed")):
            continue
        verdict = f" ({judged[name]})" if name in judged else ""
        was, now = fmt(o["baseline"], o["digits"]), fmt(o["observed"], o["digits"])
        shown.append(f"{name} {was} -> {now}{verdict}")
    return "; ".join(shown)


def _status(res: JSONObject) -> list[Block]:
    run = res["run"]
    status = res["status"]
    head = "Status: complete" if status == "complete" else f"Status: {status.upper()}"
    load0 = " / ".join(fmt(x, 2) for x in run["load_average_start"]) or "n/a"
    load1 = " / ".join(fmt(x, 2) for x in run["load_average_end"]) or "n/a"
    counts = res["verdict_counts"]
    where = _server_lines(res)
    return [
        Block("p", f"**{head}**: {res['status_reason']}."),
        Block(
            "list",
            items=[
                *where,
                f"model: {run['model']}; config: {run['config']}"
                + ("; --quick sizes" if run["quick"] else "")
                + (
                    f"; demonstrations selected: {', '.join(str(n) for n in run['only'])}"
                    if run["only"]
                    else ""
                ),
                f"wall time {fmt(run['wall_s'], 1)} s, CPU time {fmt(run['cpu_s'], 1)} s "
                f"({fmt(run['torch_threads'])} torch threads, {fmt(run['cores'])} cores)",
                "load average (one, five, fifteen minutes) at the start "
                f"{load0}, at the end {load1}",
                f"predictions: {fmt(counts['held'])} held, {fmt(counts['failed'])} failed, "
                f"{fmt(counts.get('within noise', 0))} within noise, "
                f"{fmt(counts['not measurable'])} not measurable",
            ],
        ),
    ]


def _server_lines(res: JSONObject) -> list[str]:
    """Through servers: each one named (URL without credentials, model, engine and version
    where it tells them), and what each demonstration did with the first one (its
    `ServerMode`)."""
    server = res.get("server")
    if not server:
        return []
    through: list[str] = []
    instead: list[str] = []
    local: list[str] = []
    cannot: dict[str, list[str]] = {}  # one reason, the demonstrations it stopped
    for d in res["demos"].values():
        demo = BY_KEY.get(d["key"])
        if demo is None or d["status"] == "not selected":
            continue
        n = str(d["number"])
        if d["status"] == "not measurable" and d["tables"] and demo.server.instead:
            instead.append(f"{n} {demo.server.instead}")
        elif d["status"] == "not measurable":
            why = d["summary"].removeprefix("Not measurable through the server: ").rstrip(".")
            cannot.setdefault(why, []).append(n)
        elif d["status"] == "run" and demo.server.uses_server:
            through.append(n)
        elif d["status"] == "run":
            local.append(n)
    ran_local = ", ".join(local) + (" and the eval" if res.get("useful_context") else "")
    lines = [
        f"server: {server['label']}; "
        + (
            f"demonstrations {', '.join(through)} went through it"
            if through
            else "no demonstration went through it"
        )
        + "".join(f"; {x}" for x in instead)
        + (
            "; not measurable through it: "
            + "; ".join(f"{', '.join(ns)} ({why})" for why, ns in cannot.items())
            if cannot
            else ""
        )
        + (f"; {ran_local} ran on the local engine" if local else "")
    ]
    others = res.get("servers", [])[1:]
    if others:
        sides = " and ".join(
            [
                "the probe summary",
                *(f"demonstration {d.number}" for d in REGISTERED if d.server.instead),
            ]
        )
        measured = sorted(
            {d["number"] for p in (res.get("peers") or {}).values() for d in p["demos"].values()}
        )
        lines.append(
            f"also probed side by side ({sides}): "
            + "; ".join(f"{s['name']}: {s['label']}" for s in others)
            + (
                f"; each also measured through demonstrations {', '.join(map(str, measured))}"
                " (their tables follow the first server's)"
                if measured
                else ""
            )
        )
    if res.get("error"):
        lines.append(f"stopped early: {res['error']}")
    return lines


def _servers(res: JSONObject) -> list[Block]:
    if not res.get("servers_table"):
        return []
    return [Block("h2", "The servers"), _stored_table(res["servers_table"])]


def _predictions(res: JSONObject) -> list[Block]:
    from ctxlab.workshop.config import Prediction
    from ctxlab.workshop.verdicts import describe

    rows = []
    for v in res["verdicts"]:
        metric = BY_KEY[v["key"]].metric(v["metric"])
        assert metric is not None
        p = Prediction(
            direction=v["direction"], tolerance=v["tolerance_pct"] / 100, range=v["range"]
        )
        d = v["digits"]
        change = "n/a" if v["change_pct"] is None else f"{fmt(v['change_pct'], 1)}%"
        rows.append(
            [
                f"{v['demo']}. {v['metric']}",
                f"{metric.baseline} -> {metric.observed}",
                describe(p),
                fmt(v["baseline"], d),
                fmt(v["observed"], d),
                change,
                v["verdict"],
                v["reason"],
            ]
        )
    out = [
        Block("h2", "Predictions against observations"),
        Block(
            "p",
            "Written in the config before the run; a failed prediction stays in this "
            "table, with the numbers that failed it. A prediction holds only when the whole "
            "95 % interval of the change is past its tolerance in the predicted direction; "
            "a change whose interval includes zero or the tolerance is within noise "
            "(docs/statistics.md).",
        ),
        _table(
            "Every prediction and its verdict",
            ["metric", "compared", "predicted", "baseline", "observed", "change", "verdict", "why"],
            rows,
        ),
    ]
    failed = [r for r, v in zip(rows, res["verdicts"], strict=True) if v["verdict"] == "failed"]
    if failed:
        out.append(Block("p", "Failed predictions:"))
        out.append(Block("list", items=[f"{r[0]}: predicted {r[2]}; {r[7]}" for r in failed]))
    return out


def _context(res: JSONObject) -> list[Block]:
    rows = [[r["name"], fmt(r["tokens"]), r["source"]] for r in res["context_numbers"]]
    return [
        Block("h2", "The six context numbers"),
        Block(
            "p", "Six different quantities that are all called context; none stands in for another."
        ),
        _table(
            "Context numbers for this run's model",
            ["number", "tokens", "where it comes from"],
            rows,
        ),
    ]


def _layers(res: JSONObject) -> list[Block]:
    out: list[Block] = []
    for layer, stack in LAYERS.items():
        out.append(Block("h2", f"{layer.capitalize()} results"))
        out.append(
            Block("p", f"Layer: {stack}. A gain in this table is evidence for this layer only.")
        )
        tables = [t for d in res["demos"].values() for t in d["tables"] if t["layer"] == layer]
        if layer == "task" and res.get("useful_context"):
            tables.append(res["useful_context"]["table"])
        for t in tables:
            out.append(_stored_table(t))
        if not tables:
            missing = [
                f"demonstration {d['number']} ({d['status']})"
                for d in res["demos"].values()
                if d["status"] != "run" and _owns(d["key"], layer)
            ]
            why = "; ".join(missing) if missing else "no demonstration of this run reports one"
            out.append(Block("p", f"No {layer} table in this run: {why}."))
    return out


def _owns(key: str, layer: str) -> bool:
    """Whether a demonstration that did not run would have filled this layer's table."""
    demo = BY_KEY.get(key)
    return demo is not None and layer in demo.layers


def _demos(res: JSONObject) -> list[Block]:
    out = [Block("h2", "The demonstrations")]
    for d in res["demos"].values():
        head = f"{d['number']}. {d['title']}"
        if d["status"] != "run":
            out.append(Block("h3", f"{head} ({d['status']})"))
            out += [Block("p", n) for n in d["notes"]] or [Block("p", f"It was {d['status']}.")]
            continue
        out.append(
            Block(
                "h3",
                f"{head} ({d['mode']}; {fmt(d['wall_s'], 1)} s wall, {fmt(d['cpu_s'], 1)} s CPU)",
            )
        )
        if d["summary"]:
            out.append(Block("p", d["summary"]))
        items = []
        for g in d["gains"]:
            storage = g["storage"] or ("this run has not established a decision in storage terms")
            product = g["product"] or ("this run has not established a decision in product terms")
            items.append(f"**{g['what']}**. Storage: {storage}. Product: {product}.")
        if items:
            out.append(Block("p", "Each gain explained twice, from the measured numbers:"))
            out.append(Block("list", items=items))
        out += [Block("p", n) for n in d["notes"]]
        out += [Block("img", p, note=f"demonstration {d['number']}") for p in d["plots"]]
    return out


def _peers(res: JSONObject) -> list[Block]:
    """Each further server's own pass: its tables beside the first server's, no verdicts."""
    peers = res.get("peers") or {}
    if not peers:
        return []
    out = [
        Block("h2", "The same demonstrations through the other servers"),
        Block(
            "p",
            "Each further server of the config ran the demonstrations that send a server "
            "requests, with its own page and its own request backend. The predictions were "
            "written for the run's server, so none is judged here; read these tables beside "
            "the first server's.",
        ),
    ]
    out += _side_by_side(res)
    for name, peer in peers.items():
        out.append(Block("h3", f"{name}: {peer['label']}"))
        if peer["error"]:
            out.append(Block("p", f"Stopped early: {peer['error']}."))
        for d in peer["demos"].values():
            head = f"{d['number']}. {d['title']}"
            line = d["summary"] or f"It was {d['status']}."
            out.append(Block("p", f"**{head}** ({d['status']}): {line}"))
            out += [_stored_table(t) for t in d["tables"]]
    return out


def _side_by_side(res: JSONObject) -> list[Block]:
    """One table per demonstration that a further server ran through its API: every figure
    it observed (baseline -> observed, as its metric is defined) on each server, in one row.
    A demonstration that only adds a server table to a local run (7) has no observation
    from the server, so it has no such table."""
    servers = {f"the run's server ({res['server']['engine']})": res["demos"]}
    servers.update({name: peer["demos"] for name, peer in res["peers"].items()})
    out = []
    for key in {k: None for p in res["peers"].values() for k in p["demos"]}:
        if not BY_KEY[key].server.uses_server:
            continue
        ran = {n: d[key] for n, d in servers.items() if d.get(key, {}).get("status") == "run"}
        if len(ran) < 2:
            continue
        metrics = {m: None for d in ran.values() for m in d["observations"]}
        rows = [[m] + [_observed(d["observations"].get(m)) for d in ran.values()] for m in metrics]
        number, title = BY_KEY[key].number, BY_KEY[key].title
        out.append(
            _table(
                f"Demonstration {number} on every server: {title.lower()}",
                ["figure (baseline -> observed)", *ran],
                rows,
                "each server's own pass; the predictions are judged on the run's server only",
            )
        )
    return out


def _observed(obs: JSONObject | None) -> str:
    if obs is None or obs["baseline"] is None or obs["observed"] is None:
        return "not measurable"
    return f"{fmt(obs['baseline'], obs['digits'])} -> {fmt(obs['observed'], obs['digits'])}"


def _checklist(res: JSONObject) -> list[Block]:
    rows = [[c["risk"], c["status"], c["how"]] for c in res["checklist"]]
    return [
        Block("h2", "What could go wrong, checked against this run"),
        _table(
            "Each known way to fool oneself, and what this run did about it",
            ["risk", "this run", "how"],
            rows,
        ),
    ]


def _files(res: JSONObject) -> list[Block]:
    files = [res["files"]["results"], res["files"]["html"]]
    if res.get("useful_context"):
        files.append(res["useful_context"]["rows_file"])
    for d in res["demos"].values():
        files += d["plots"]
    for peer in (res.get("peers") or {}).values():
        files += [p for d in peer["demos"].values() for p in d["plots"]]
    return [Block("h2", "Files"), Block("list", items=[f"`{f}`" for f in files])]
