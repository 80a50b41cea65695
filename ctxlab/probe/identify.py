"""Which server this is: its URL without credentials, the model it serves, and the engine
and version where the server tells them, read from endpoints that engines really have:
vLLM `/version`, llama.cpp `/props` (slots, per-slot context, build), SGLang
`/get_server_info`, and the `owned_by` of `/v1/models` (ctxlab serve says "ctxlab").

It is also the first check of a run: an unreachable URL, a refused key, a server that is
not OpenAI-compatible and a model it does not serve each end here in one sentence.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import httpx

from ctxlab.errors import CtxlabError
from ctxlab.peer import fields
from ctxlab.peer.deadline import Reply, request
from ctxlab.peer.url import base_url, public, redact
from ctxlab.probe.client import ProbeClient


@dataclass
class ServerInfo:
    url: str  # without user:password
    model: str
    models: list[str]
    engine: str  # vllm, sglang, llama.cpp, ctxlab or unknown
    version: str
    max_model_len: int | None  # per request (llama.cpp: per slot)
    slots: int | None = None  # llama.cpp: parallel slots, each keeps one prompt
    has_tokenize: bool = False
    has_metrics: bool = False
    extra: dict[str, str] = field(default_factory=dict)
    model_root: str = ""  # vLLM's `root` in /v1/models: the folder or hub id it loaded

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def label(self, code: bool = False) -> str:
        """One line naming the server; a model id that is a file path is shown by its name.
        `code`: URL and model in Markdown code spans (a report's numbers are its figures;
        a port is not one)."""
        ver = f" {self.version}" if self.version else ""
        model = self.model.rsplit("/", 1)[-1] if len(self.model) > 48 else self.model
        q = "`" if code else ""
        return f"{self.engine}{ver} at {q}{self.url}{q}, model {q}{model}{q}"


def public_url(url: str) -> str:
    """The URL without credentials (user:password@) or a query string."""
    return public(url)


def check_url(url: str) -> str:
    """The server root (`ctxlab.peer.url.base_url`'s rule: a trailing /v1 is dropped)."""
    return base_url(url, "--server")


def identify(client: ProbeClient, model: str | None) -> ServerInfo:
    """Read /v1/models and the engine's info endpoints; the model to probe is `model` or the
    server's only one."""
    url = client.url
    src = client.source("GET /v1/models")
    try:
        r = request(
            client.http, "GET", client.base_url + "/v1/models", client.deadline(15.0),
            headers=client.headers(),
        )  # fmt: skip
    except httpx.HTTPError as exc:
        if isinstance(exc, httpx.TimeoutException):
            raise CtxlabError(
                f"{url} accepted GET /v1/models but gave no complete answer within "
                f"{client.deadline(15.0).seconds:g} s; is it stuck or overloaded?"
            ) from None
        raise CtxlabError(
            f"cannot reach {url}: {type(exc).__name__} ({redact(str(exc))})"
        ) from None
    if r.status_code in (401, 403):
        raise CtxlabError(
            f"{url} refused the API key (HTTP {r.status_code}); give the right one with --api-key"
        )
    try:
        doc = json.loads(r.body)
    except (ValueError, UnicodeDecodeError):
        doc = None
    if r.status_code != 200 or not isinstance(doc, dict) or "data" not in doc:
        raise CtxlabError(
            f"{url} is not an OpenAI-compatible server: GET /v1/models answered HTTP "
            f"{r.status_code} without a model list"
        )
    found = fields.model_cards(src, doc)
    ids = [i for i, _ in found]
    if not ids:
        raise CtxlabError(f"{url} serves no model (GET /v1/models is empty)")
    if model is None:
        if len(ids) > 1:
            raise CtxlabError(
                f"{url} serves {len(ids)} models ({', '.join(ids)}); pick one with --model"
            )
        model = ids[0]
    elif model not in ids:
        raise CtxlabError(f"{url} does not serve model {model!r}; it serves {', '.join(ids)}")
    card = found[ids.index(model)][1]
    info = ServerInfo(url, model, ids, "unknown", "", _count(src, card, "max_model_len"))
    info.model_root = fields.text(src, card.get("root"), "root") or ""
    owned = fields.text(src, card.get("owned_by"), "owned_by") or ""
    if owned == "ctxlab":
        info.engine = "ctxlab"
        from ctxlab import __version__

        info.version = ""  # the server does not say; the client's version is not its own
        info.extra["note"] = f"owned_by ctxlab (probe client is ctxlab {__version__})"
    _read_engine(client, info, owned)
    metrics = client.get("/metrics")
    info.has_metrics = (
        metrics is not None and metrics.status_code == 200 and "# TYPE" in metrics.text
    )
    info.has_tokenize = _tokenize_works(client, info)
    return info


def _json_object(reply: Reply | None) -> dict[str, object] | None:
    """An optional endpoint's JSON object; None when it is absent or answers otherwise."""
    if reply is None or reply.status_code != 200:
        return None
    try:
        doc = json.loads(reply.body)
    except (ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def _read_engine(client: ProbeClient, info: ServerInfo, owned: str) -> None:
    p = _json_object(client.get("/props"))
    if p is not None and "total_slots" in p:
        src = client.source("GET /props")
        info.engine = "llama.cpp"
        info.version = str(fields.text(src, p.get("build_info"), "build_info") or "")
        info.slots = _count(src, p, "total_slots")
        gen = fields.obj(src, p.get("default_generation_settings"),
                         "default_generation_settings", required=False) or {}  # fmt: skip
        n_ctx = fields.count(src, gen.get("n_ctx"), "default_generation_settings.n_ctx")
        info.max_model_len = n_ctx or info.max_model_len
        return
    if info.engine != "unknown":
        return
    v = _json_object(client.get("/version"))
    if v is not None and "version" in v:
        version = fields.text(client.source("GET /version"), v["version"], "version", True)
        info.engine, info.version = ("vllm" if owned == "vllm" else owned or "vllm"), str(version)
        return
    s = _json_object(client.get("/get_server_info"))
    if s is not None:
        src = client.source("GET /get_server_info")
        info.engine = "sglang"
        version = s.get("version")
        info.version = str(version) if isinstance(version, str | int | float) else ""
        page = fields.count(src, s.get("page_size"), "page_size")
        if page is not None:
            info.extra["page_size (server info)"] = str(page)
        return
    if owned:
        info.engine = owned


def _tokenize_works(client: ProbeClient, info: ServerInfo) -> bool:
    """/tokenize exists on llama.cpp ({"content"}) and vLLM ({"model", "prompt"}) and
    answers a list of token ids."""
    body = {"content": " the", "prompt": " the", "model": info.model}
    try:
        doc = _json_object(client.post("/tokenize", body))
    except httpx.HTTPError:
        return False
    return doc is not None and _token_ids(client, doc) is not None


def tokenize(client: ProbeClient, info: ServerInfo, text: str) -> list[int] | None:
    """The server's own token ids for `text` (no special tokens), or None."""
    if not info.has_tokenize:
        return None
    body = {"content": text, "prompt": text, "model": info.model, "add_special_tokens": False}
    try:
        doc = _json_object(client.post("/tokenize", body, cap=client.timeout))
    except httpx.HTTPError:
        return None
    return _token_ids(client, doc) if doc is not None else None


def _token_ids(client: ProbeClient, doc: dict[str, object]) -> list[int] | None:
    """`tokens` as whole numbers (llama.cpp may give {"id", "piece"} objects: their ids);
    a list of anything else is refused in one sentence."""
    src = client.source("POST /tokenize")
    toks = fields.items(src, doc.get("tokens"), "tokens", required=False)
    if toks is None:
        return None
    out = []
    for k, t in enumerate(toks):
        if isinstance(t, dict):
            t = t.get("id")
        out.append(int(fields.count(src, t, f"tokens[{k}]", required=True) or 0))
    return out


def _count(src: fields.Source, doc: dict[str, object], key: str) -> int | None:
    return fields.count(src, doc.get(key), key)
