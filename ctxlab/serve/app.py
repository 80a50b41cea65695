"""The FastAPI app: OpenAI's `/v1/completions`, `/v1/chat/completions` and `/v1/models`, plus
`/health` and `/metrics`, over one `EngineLoop`.

A handler checks the API key (when there is a key file) and the body, submits its prompts,
waits until the engine thread admitted or refused every one (so a refused request is a 4xx,
never a 200 stream that breaks), then streams the updates as SSE chunks or collects them
into one body. A client that goes away (a closed stream, or a dropped connection while a
plain request waits) aborts its prompts; their blocks go back to the pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from ctxlab.engine.llm_engine import LLMEngine
from ctxlab.engine.request import RequestOutput
from ctxlab.errors import CtxlabError
from ctxlab.inputs import loads_json
from ctxlab.serve.engine_loop import EngineLoop, QueueFull, Ticket, TooManyPrompts, Update
from ctxlab.serve.errors import APIError, error_body, install_handlers, validation_error
from ctxlab.serve.metrics import ServeMetrics
from ctxlab.serve.protocol import ChatCompletionRequest, CompletionRequest
from ctxlab.serve.responses import DONE, Reply, finish_reason, sse
from ctxlab.serve.step_log import StepLog
from ctxlab.serve.tenants import Tenants, cache_salt

DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions
MAX_BODY_BYTES = 8 * 2**20
DISCONNECT_POLL_S = 0.25


@dataclass
class ServeSettings:
    model_name: str
    max_waiting: int = 256
    request_timeout: float = 600.0
    metrics_prefix: str = "ctxlab"
    tenants: Tenants | None = None
    step_log: Path | None = None  # write every engine step here (JSON lines)
    kv_events: str | None = None  # publish KV events here, in vLLM's format (loopback)
    kv_events_replay: str | None = None  # and answer replay requests here


class _ClientGone(Exception):
    pass


def create_app(engine: LLMEngine, settings: ServeSettings) -> FastAPI:
    metrics = ServeMetrics(settings.model_name, settings.metrics_prefix)
    metrics.describe_cache(engine)
    step_log = None if settings.step_log is None else StepLog(engine, settings.step_log)
    loop = EngineLoop(engine, metrics, settings.max_waiting, settings.request_timeout, step_log)
    publisher = None
    if settings.kv_events is not None:  # bound now: a taken port fails before serving
        from ctxlab.kvevents.publisher import EventPublisher

        publisher = EventPublisher(settings.kv_events, settings.kv_events_replay)
        engine.kv.observe(publisher)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.closing = asyncio.Event()  # set by the server on SIGTERM (`server.py`)
        app.state.event_loop = asyncio.get_running_loop()
        loop.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            loop.stop()
            if publisher is not None:
                engine.kv.observe(None)
                publisher.close()

    app = FastAPI(title="ctxlab serve", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.engine_loop = loop
    app.state.metrics = metrics
    install_handlers(app)

    @app.get("/health")
    async def health() -> Response:
        if not loop.alive:
            return JSONResponse(error_body(503, "the engine thread is not running"), 503)
        return JSONResponse({})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        _tenant(request, settings)
        card = {
            "id": settings.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "ctxlab",
            "max_model_len": loop.max_model_len,
        }
        return JSONResponse({"object": "list", "data": [card]})

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _answer(request, loop, settings, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _answer(request, loop, settings, chat=True)

    return app


def _tenant(request: Request, settings: ServeSettings) -> str | None:
    if settings.tenants is None:
        return None
    return settings.tenants.tenant_of(request.headers.get("authorization"))


async def _body(request: Request) -> bytes:
    """The body, read in pieces up to MAX_BODY_BYTES (a larger one is refused before it is
    all in memory); a client that closes mid-body is `_ClientGone`, not an ASGI traceback."""
    parts: list[bytes] = []
    size = 0
    try:
        async for part in request.stream():
            size += len(part)
            if size > MAX_BODY_BYTES:
                raise APIError(400, f"the body is over {MAX_BODY_BYTES // 2**20} MiB.")
            parts.append(part)
    except ClientDisconnect:
        raise _ClientGone from None
    return b"".join(parts)


async def _parse(request: Request, cls: type[BaseModel]) -> Any:
    raw = await _body(request)
    try:
        doc = loads_json(raw, "the body")
    except CtxlabError as exc:  # bad JSON, nested too deep, a non-finite number, not text
        raise APIError(400, str(exc), code="json_invalid") from None
    if not isinstance(doc, dict):
        raise APIError(400, "the body must be a JSON object.")
    try:
        return cls.model_validate(doc)
    except ValidationError as exc:
        raise validation_error(exc) from None


async def _answer(request: Request, loop: EngineLoop, settings: ServeSettings, chat: bool) -> Any:
    tenant = _tenant(request, settings)
    try:
        req = await _parse(request, ChatCompletionRequest if chat else CompletionRequest)
    except _ClientGone:
        return Response(status_code=499)  # nobody reads it; the server logs nothing
    if req.model != settings.model_name:
        raise APIError(
            400,
            f"model {req.model!r} is not served here; this server serves {settings.model_name!r}.",
            param="model",
            code="model_not_found",
        )
    if chat:
        prompts: list[Any] = [[m.as_template_message() for m in req.messages]]
        max_tokens = req.requested_tokens  # None: what the context and pool allow
    else:
        prompts = req.prompts()
        max_tokens = req.max_tokens or DEFAULT_COMPLETION_TOKENS
    queue: asyncio.Queue[Update] = asyncio.Queue()
    salt = cache_salt(tenant, req.cache_salt)
    tickets = [
        loop.new_ticket(i, p, max_tokens, req.sampling, salt, queue) for i, p in enumerate(prompts)
    ]
    try:
        loop.submit(tickets)
    except TooManyPrompts as exc:
        raise APIError(400, str(exc), param="prompt") from None
    except QueueFull as exc:
        raise APIError(429, str(exc), code="queue_full", headers={"Retry-After": "1"}) from None
    reply = Reply(req.model, chat, req.include_usage, req.continuous_usage)
    texts = [""] * len(tickets)
    try:
        pending = await _admit(queue, tickets, request)
        if req.stream:
            stream = _stream(queue, tickets, pending, texts, reply, loop, request.app)
            headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
            return StreamingResponse(stream, media_type="text/event-stream", headers=headers)
        outputs = await _collect(queue, tickets, pending, texts, request)
    except _ClientGone:
        loop.abort(tickets)
        return Response(status_code=499)
    except BaseException:
        loop.abort(tickets)
        raise
    return JSONResponse(reply.body(texts, outputs))


async def _next(queue: asyncio.Queue[Update], request: Request | None) -> Update:
    """The next update; with `request`, raise _ClientGone if the client disconnects first."""
    if request is None:
        return await queue.get()
    getter = asyncio.ensure_future(queue.get())
    try:
        while True:
            done, _ = await asyncio.wait({getter}, timeout=DISCONNECT_POLL_S)
            if done:
                return getter.result()
            if await request.is_disconnected():
                raise _ClientGone
    finally:
        if not getter.done():
            getter.cancel()


SHUTTING_DOWN = APIError(503, "the server is shutting down; this stream ends here.")


async def _next_or_closing(queue: asyncio.Queue[Update], closing: asyncio.Event) -> Update | None:
    """The next update, or None once the server begins a graceful shutdown."""
    if closing.is_set():
        return None
    getter = asyncio.ensure_future(queue.get())
    waiter = asyncio.ensure_future(closing.wait())
    try:
        done, _ = await asyncio.wait({getter, waiter}, return_when=asyncio.FIRST_COMPLETED)
        return getter.result() if getter in done else None
    finally:
        for task in (getter, waiter):
            if not task.done():
                task.cancel()


def _refusal(upd: Update) -> APIError:
    return APIError(400 if upd.user_fault else 500, upd.message)


def _failure(upd: Update) -> APIError | None:
    """The error a finished prompt stands for, or None when it finished normally."""
    if upd.kind == "timeout":
        return APIError(408, "the request took longer than the server's request timeout.")
    out = upd.output
    if out is None or out.finish_reason == "abort":
        return APIError(503, "the request was stopped because the server is shutting down.")
    if out.finish_reason == "error":
        err = out.error
        user = err is not None and err.user_fault
        return APIError(400 if user else 500, err.message if err else "the request failed.")
    return None


async def _admit(
    queue: asyncio.Queue[Update], tickets: list[Ticket], request: Request
) -> list[Update]:
    """Wait until every prompt is admitted (or raise its refusal); updates that came with
    them (early tokens) are returned in order, to be handled first."""
    admitted = 0
    early: list[Update] = []
    while admitted < len(tickets):
        upd = await _next(queue, request)
        if upd.kind == "refused":
            raise _refusal(upd)
        if upd.kind == "admitted":
            admitted += 1
        else:
            early.append(upd)
    return early


async def _collect(
    queue: asyncio.Queue[Update],
    tickets: list[Ticket],
    pending: list[Update],
    texts: list[str],
    request: Request,
) -> list[RequestOutput]:
    outputs: list[RequestOutput | None] = [None] * len(tickets)
    left = len(tickets)
    while left:
        upd = pending.pop(0) if pending else await _next(queue, request)
        texts[upd.index] += upd.text
        if upd.kind in ("done", "timeout"):
            err = _failure(upd)
            if err is not None:
                raise err
            outputs[upd.index] = upd.output
            left -= 1
    return [o for o in outputs if o is not None]


async def _stream(
    queue: asyncio.Queue[Update],
    tickets: list[Ticket],
    pending: list[Update],
    texts: list[str],
    reply: Reply,
    loop: EngineLoop,
    app: FastAPI,
) -> AsyncIterator[str]:
    outputs: list[RequestOutput | None] = [None] * len(tickets)
    first = [True] * len(tickets)
    left = len(tickets)
    closing: asyncio.Event = app.state.closing
    try:
        while left:
            upd = pending.pop(0) if pending else await _next_or_closing(queue, closing)
            if upd is None:  # SIGTERM: end the stream as a stream ends, not by a cut
                yield sse(SHUTTING_DOWN.body())
                yield DONE
                return
            i = upd.index
            if upd.kind == "token":
                counts = (tickets[i].prompt_tokens, upd.completion_tokens)
                yield reply.chunk(i, upd.text, first[i], counts=counts)
                first[i] = False
                continue
            if upd.kind not in ("done", "timeout"):
                continue
            err = _failure(upd)
            if err is not None:
                yield sse(err.body())
                yield DONE
                return
            assert upd.output is not None
            m = upd.output.metrics
            counts = (m.prompt_tokens, m.output_tokens)
            yield reply.chunk(i, upd.text, first[i], finish_reason(upd.output), counts)
            outputs[i] = upd.output
            left -= 1
        if reply.include_usage:
            yield reply.usage_chunk([o for o in outputs if o is not None])
        yield DONE
    finally:
        loop.abort(tickets)  # a no-op for prompts that finished; frees the rest
