"""The ASGI middlewares around the routes, outermost first as create_app adds them: ContractVersion (names
the contract's version on every answer, 400 for a client of another version), BodyLimit (413 before
a large body is read), RequestMetrics (count and time every request) and InternalErrors (an unexpected
exception becomes a 500 `{"detail"}` on a connection that stays usable)."""

from __future__ import annotations

import logging
import time

from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rlvr_selector_client import contract
from selector_service.api import metrics
from selector_service.api.errors import OUT_OF_MEMORY
from selector_service.errors import PayloadTooLarge

log = logging.getLogger("selector_service")


class ContractVersion:
    """Names the contract's version (`contract.CONTRACT`) in a header of every answer, and refuses with
    400 a request whose header names another version, saying which package to upgrade. A request without
    the header (curl, a generated client) is served."""

    _HEADER = contract.CONTRACT_HEADER.lower().encode()
    _VALUE = str(contract.CONTRACT).encode()

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def named(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (self._HEADER, self._VALUE)]
            await send(message)

        for key, value in scope.get("headers", []):
            if key == self._HEADER:
                problem = contract.mismatch(value.decode("latin-1"), contract.CONTRACT)
                if problem:
                    await send_json(named, 400, problem)
                    return
        await self.app(scope, receive, named)


class BodyLimit:
    """Refuses bodies over `limit` bytes with 413, by Content-Length or while streaming."""

    def __init__(self, app: ASGIApp, limit: int, import_limit: int) -> None:
        self.app, self.default_limit, self.import_limit = app, limit, import_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        importing = scope.get("path", "").endswith("/import")
        limit = self.import_limit if importing else self.default_limit
        too_large = _too_large(limit, importing)
        for key, value in scope.get("headers", []):
            if key == b"content-length" and value.isdigit() and int(value) > limit:
                await send_json(send, 413, too_large)
                return
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise PayloadTooLarge(too_large)
            return message

        tracked = _TrackedSend(send)
        try:
            await self.app(scope, limited_receive, tracked)
        except PayloadTooLarge as exc:
            if not tracked.started:
                await send_json(send, 413, exc.detail)


def _too_large(limit: int, importing: bool) -> str:
    if importing:  # an export is one file: it cannot be sent in pieces
        return (
            f"dataset export over {limit} bytes, this service's import limit; start the service with a "
            "larger SELECTOR_MAX_IMPORT_BYTES to import it"
        )
    return (
        f"request body over {limit} bytes (SELECTOR_MAX_BODY_BYTES); send smaller requests, e.g. the "
        "results of a step in several observes"
    )


class InternalErrors:
    """Answers an unexpected exception with a 500 `{"detail"}` and keeps the connection usable.

    Starlette's own handler for `Exception` sends its response and then re-raises, and the server then
    drops the keep-alive connection without saying so: the client's next request on it (say, a valid
    observe) fails with a reset, an outcome it cannot tell from a lost write.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        tracked = _TrackedSend(send)
        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            if tracked.started:
                raise
            if isinstance(exc, ClientDisconnect):  # the client left (or the server cut it off): no answer
                log.debug("client gone during %s %s", scope.get("method"), scope.get("path"))
                return
            if isinstance(exc, MemoryError):  # an allocation failed: nothing was applied, say so (507)
                log.warning("out of memory while answering %s %s", scope.get("method"), scope.get("path"))
                await send_json(send, 507, OUT_OF_MEMORY)
                return
            log.exception("unhandled error")
            await send_json(send, 500, f"internal error ({type(exc).__name__}); see the service log")


class RequestMetrics:
    """Counts and times every request by its route template (bounded label values)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = {"code": 500}

        async def wrapped(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        t0 = time.perf_counter()
        try:
            await self.app(scope, receive, wrapped)
        finally:
            route = scope.get("route")
            endpoint = getattr(route, "path", None) or "unmatched"
            method = scope.get("method", "")
            metrics.REQUESTS.labels(endpoint, method, str(status["code"])).inc()
            metrics.LATENCY.labels(endpoint, method).observe(time.perf_counter() - t0)


class _TrackedSend:
    """Passes every message on to `send` and remembers whether the response has started (after which a
    middleware can no longer answer with a response of its own)."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.started = False

    async def __call__(self, message: Message) -> None:
        self.started = self.started or message["type"] == "http.response.start"
        await self.send(message)


async def send_json(send: Send, status: int, detail: str) -> None:
    """Sends a whole `{"detail": ...}` response from inside a middleware (no route, no handler)."""
    body = JSONResponse({"detail": detail}).body
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
