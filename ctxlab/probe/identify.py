"""Which server this is: its URL without credentials, the model it serves, and the engine
and version where the server tells them, read from endpoints that engines really have:
vLLM `/version`, llama.cpp `/props` (slots, per-slot context, build), SGLang
`/get_server_info`, and the `owned_by` of `/v1/models` (ctxlab serve says "ctxlab").

It is also the first check of a run: an unreachable URL, a refused key, a server that is
not OpenAI-compatible and a model it does not serve each end here in one sentence.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from urllib.parse import urlsplit, urlunsplit

import httpx

from ctxlab.errors import CtxlabError
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
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))


def check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CtxlabError(f"--server {url!r} must be an http(s) URL, e.g. http://127.0.0.1:8000")
    if parts.path.rstrip("/").endswith("/v1"):
        raise CtxlabError(f"--server {url!r}: give the server root, without /v1")
    return url.rstrip("/")


def identify(client: ProbeClient, model: str | None) -> ServerInfo:
    """Read /v1/models and the engine's info endpoints; the model to probe is `model` or the
    server's only one."""
    url = public_url(client.base_url)
    try:
        r = client.http.get(client.base_url + "/v1/models", headers=client.headers(), timeout=15)
    except httpx.HTTPError as exc:
        raise CtxlabError(f"cannot reach {url}: {type(exc).__name__} ({exc})") from None
    if r.status_code in (401, 403):
        raise CtxlabError(
            f"{url} refused the API key (HTTP {r.status_code}); give the right one with --api-key"
        )
    try:
        doc = r.json()
        cards = doc["data"]
        ids = [str(c["id"]) for c in cards]
    except (ValueError, KeyError, TypeError):
        raise CtxlabError(
            f"{url} is not an OpenAI-compatible server: GET /v1/models answered HTTP "
            f"{r.status_code} without a model list"
        ) from None
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
    card = cards[ids.index(model)]
    info = ServerInfo(url, model, ids, "unknown", "", _int(card.get("max_model_len")))
    owned = str(card.get("owned_by", ""))
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


def _read_engine(client: ProbeClient, info: ServerInfo, owned: str) -> None:
    props = client.get("/props")
    if props is not None and props.status_code == 200:
        try:
            p = props.json()
        except ValueError:
            p = None
        if isinstance(p, dict) and "total_slots" in p:
            info.engine = "llama.cpp"
            info.version = str(p.get("build_info", ""))
            info.slots = _int(p.get("total_slots"))
            gen = p.get("default_generation_settings") or {}
            info.max_model_len = _int(gen.get("n_ctx")) or info.max_model_len
            return
    if info.engine != "unknown":
        return
    ver = client.get("/version")
    if ver is not None and ver.status_code == 200:
        try:
            v = ver.json()
        except ValueError:
            v = None
        if isinstance(v, dict) and "version" in v:
            info.engine, info.version = (
                ("vllm" if owned == "vllm" else owned or "vllm"),
                str(v["version"]),
            )
            return
    srv = client.get("/get_server_info")
    if srv is not None and srv.status_code == 200:
        try:
            s = srv.json()
        except ValueError:
            s = None
        if isinstance(s, dict):
            info.engine = "sglang"
            info.version = str(s.get("version", ""))
            if s.get("page_size") is not None:
                info.extra["page_size (server info)"] = str(s["page_size"])
            return
    if owned:
        info.engine = owned


def _tokenize_works(client: ProbeClient, info: ServerInfo) -> bool:
    """/tokenize exists on llama.cpp ({"content"}) and vLLM ({"model", "prompt"})."""
    try:
        r = client.http.post(
            client.base_url + "/tokenize",
            json={"content": " the", "prompt": " the", "model": info.model},
            headers=client.headers(),
            timeout=10,
        )
        return r.status_code == 200 and isinstance(r.json().get("tokens"), list)
    except (httpx.HTTPError, ValueError, AttributeError):
        return False


def tokenize(client: ProbeClient, info: ServerInfo, text: str) -> list[int] | None:
    """The server's own token ids for `text` (no special tokens), or None."""
    if not info.has_tokenize:
        return None
    body = {"content": text, "prompt": text, "model": info.model, "add_special_tokens": False}
    try:
        r = client.http.post(client.base_url + "/tokenize", json=body, headers=client.headers())
        toks = r.json().get("tokens")
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return [int(t) for t in toks] if isinstance(toks, list) else None


def _int(v: object) -> int | None:
    try:
        return int(v) if v is not None else None  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None
