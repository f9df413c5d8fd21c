"""How errors leave the service: always `{"detail": "<what was wrong and what to do>"}`.

A client's mistake is a 4xx and changes nothing; an unreachable store is a 503. `ERRORS` documents these
answers on every token-checked route of the OpenAPI document; `add_error_handlers` installs the handlers
that produce them (the engine's ServiceError tree, FastAPI's validation errors, Starlette's HTTP errors).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from selector_service.contract.schemas import ErrorBody
from selector_service.errors import PayloadTooLarge, ServiceError

UNDECODABLE_BODY = (
    "body is not valid JSON: send a UTF-8 encoded JSON object (NaN and Infinity are not allowed)"
)

OUT_OF_MEMORY = (
    "the service ran out of memory for this request; nothing was applied. Retry later, send smaller requests, "
    "or lower SELECTOR_MEMORY_BUDGET_BYTES to what the machine and its limits allow"
)

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in {
        401: "missing bearer token",
        403: "wrong bearer token",
        404: "unknown dataset",
        409: "conflict (name taken with another spec, or step already closed)",
        413: "request too large",
        422: "invalid request",
        503: "store unreachable",
        507: "the dataset does not fit in the service's memory budget (nothing changed)",
    }.items()
}


async def service_error(_request: Request, exc: ServiceError) -> JSONResponse:
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)


async def memory_error(_request: Request, _exc: MemoryError) -> JSONResponse:
    """An allocation that failed while a request ran: a 507 like a refused admission, never a 500."""
    return JSONResponse({"detail": OUT_OF_MEMORY}, status_code=507)


async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    is_json = media == "application/json" or media.endswith("+json")
    if not is_json and any(tuple(err.get("loc", ())) == ("body",) for err in exc.errors()):
        # FastAPI reads a body as JSON only when it is sent as JSON; anything else reaches validation as
        # one string ("should be a valid dictionary"), which does not say why.
        sent = f"as {media!r}" if media else "without a Content-Type"
        detail = (
            f"the body was sent {sent}, not as JSON: send a JSON object with Content-Type: "
            "application/json (curl: -H 'Content-Type: application/json')"
        )
        return JSONResponse({"detail": detail}, status_code=422)
    return JSONResponse({"detail": validation_message(exc)}, status_code=422)


async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 400:
        # FastAPI turns any error while it reads and parses a JSON body into a 400: a streamed body
        # that BodyLimit cut off (-> 413), or bytes that are not UTF-8 (-> 422, like invalid JSON).
        if isinstance(exc.__cause__, PayloadTooLarge):
            return JSONResponse({"detail": exc.__cause__.detail}, status_code=413)
        return JSONResponse({"detail": UNDECODABLE_BODY}, status_code=422)
    return JSONResponse({"detail": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)


def add_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ServiceError, service_error)  # type: ignore[arg-type]  # Starlette types a handler as taking any Exception; it passes this class only
    app.add_exception_handler(MemoryError, memory_error)  # type: ignore[arg-type]  # Starlette types a handler as taking any Exception; it passes this class only
    app.add_exception_handler(RequestValidationError, validation_error)  # type: ignore[arg-type]  # Starlette types a handler as taking any Exception; it passes this class only
    app.add_exception_handler(StarletteHTTPException, http_error)  # type: ignore[arg-type]  # Starlette types a handler as taking any Exception; it passes this class only


def validation_message(exc: RequestValidationError) -> str:
    """FastAPI's list of validation errors as one line: `field: problem; ...` (at most ten of them)."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body",))
        msg = err.get("msg", "invalid")
        if err.get("type") == "extra_forbidden":
            msg = "unknown field (check the spelling against /openapi.json)"
        elif err.get("type") == "json_invalid":
            # Pydantic's own parser puts "at line L column C" in its reason; FastAPI's (for bodies that are
            # not one model) gives the offset of the error in the body as the last part of `loc`.
            reason = (err.get("ctx") or {}).get("error", "") or "cannot parse"
            reason = (
                reason[:1].lower() + reason[1:]
            )  # "Expecting value" reads like pydantic's "expected value"
            offset = loc.rpartition(".")[2]
            if offset.isdigit():
                reason = f"{reason} at character {int(offset) + 1}"
            loc = ""
            msg = f"body is not valid JSON ({reason}): send UTF-8 JSON; NaN and Infinity are not allowed"
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts[:10]) + (f" (and {len(parts) - 10} more)" if len(parts) > 10 else "")
