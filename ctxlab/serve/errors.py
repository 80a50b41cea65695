"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

Every user mistake is a 4xx with one sentence (400 for a bad body, 401 for a bad API key,
429 when the queue is full); a 500 means the server failed, never the client. Pydantic's
validation errors are turned into one sentence naming the field.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


class APIError(Exception):
    """An answer that is an error: status, one sentence, and what OpenAI clients read."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def validation_error(exc: ValidationError) -> APIError:
    """The first problem of a pydantic error as one sentence naming the field."""
    err = exc.errors()[0]
    loc = [str(p) for p in err.get("loc", ()) if not str(p).startswith(("function-", "list["))]
    loc = [p for p in loc if p not in ("str", "int")]
    param = ".".join(loc) or None
    kind = err.get("type", "")
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    if kind == "extra_forbidden":
        text = f"unknown field {param!r}; this server does not take it"
    elif kind == "missing":
        text = f"{param} is required"
    elif kind == "model_type" and not loc:
        text = "the body must be a JSON object"
    elif kind == "literal_error" and param:
        text = f"{param} is not supported here ({msg[0].lower() + msg[1:]})"
    else:
        text = f"{param}: {msg}" if param else msg
    return APIError(400, text, param=param, code=kind or None)


def install_handlers(app: FastAPI) -> None:
    """Map every failure to OpenAI's error shape."""

    @app.exception_handler(APIError)
    async def _api(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            error_body(exc.status_code, str(exc.detail)), status_code=exc.status_code
        )

    @app.exception_handler(Exception)
    async def _crash(_: Request, exc: Exception) -> JSONResponse:
        message = f"the server failed on this request ({type(exc).__name__}: {exc})"
        return JSONResponse(error_body(500, message), status_code=500)
