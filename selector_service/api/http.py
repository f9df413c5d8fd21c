"""The HTTP server's own bounds, enforced before a request reaches the app (and so before authentication).

uvicorn (0.54, with httptools 0.9 as its parser) bounds none of these itself, which is why this module
exists: its httptools protocol appends the URL and every header it is sent without a limit
(`HttpToolsProtocol.on_url` and `on_header`; httptools itself joins a header's pieces in
`_on_header_value`), arms no timer while a request head or body arrives (its only timer is the idle
keep-alive one, armed after a response), and its `limit_concurrency` answers 503 only once a request
head is complete, so a client that never completes one holds its connection forever. (uvicorn's h11
protocol bounds the head with `h11_max_incomplete_event_size`, and nothing else.)

`BoundedProtocol` is uvicorn's httptools protocol with, per connection:

- **a head size and count** (`max_header_bytes` for the request line and headers together,
  `max_headers` headers): beyond either, 431 and the connection is closed;
- **a head timeout** (`header_timeout_s`): a request head must arrive whole within it, counted from the
  connection's opening (or from the first byte of a later request on it); else 408 and closed;
- **a body deadline** (`body_timeout_s` plus one second per `body_min_bytes_per_s` bytes received, the
  rule of Apache's mod_reqtimeout): a client that keeps to that rate is never cut off, one that trickles
  is answered 408 (or, once the app has answered, just closed) within about `body_timeout_s`. Time while
  the server itself has paused reading (the app has not consumed what arrived) does not count;
- **a connection limit** (`max_connections` per process): a connection beyond it is answered 503 at once
  and closed, so a flood of idle connections cannot take the process's file descriptors.

Every limit is a setting (settings.py, docs/operations.md#limits); `serve` passes them to uvicorn as the
`http` protocol class: `protocol_class(settings)` in the single-process server, `WorkerProtocol` (built
from the environment `serve` prepared) in each worker of `--workers N`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from selector_service.api.metrics import CONNECTIONS_REFUSED as REFUSED

log = logging.getLogger("selector_service.http")

#: How often a connection receiving a request head or body checks its deadline (seconds).
TICK_S = 0.25
#: How long a refused connection's late bytes are read and dropped before it is closed (seconds).
LINGER_S = 2.0


@dataclass(frozen=True)
class HttpLimits:
    max_header_bytes: int
    max_headers: int
    header_timeout_s: float
    body_timeout_s: float
    body_min_bytes_per_s: int
    max_connections: int

    @classmethod
    def of(cls, settings: Any) -> HttpLimits:
        return cls(
            max_header_bytes=settings.max_header_bytes,
            max_headers=settings.max_headers,
            header_timeout_s=settings.header_timeout_s,
            body_timeout_s=settings.body_timeout_s,
            body_min_bytes_per_s=settings.body_min_bytes_per_s,
            max_connections=settings.max_connections,
        )


def _answer(status: int, reason: str, detail: str) -> bytes:
    """A whole `{"detail"}` response that closes the connection, written by the protocol itself."""
    body = json.dumps({"detail": detail}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class BoundedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol within `limits` (the module docstring says what each does)."""

    limits: HttpLimits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # reading a request head (from the connection's start, or a request's)
        self._head_bytes = 0
        self._header_count = 0
        self._head_started = time.monotonic()
        self._in_body = False  # the head is complete, the body is not
        self._body_started = 0.0
        self._body_bytes = 0
        self._refused = False
        self._ticking: asyncio.TimerHandle | None = None

    # ---- connection -----------------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._refuse(
                503,
                "Service Unavailable",
                f"this server already holds {self.limits.max_connections} connections "
                "(SELECTOR_MAX_CONNECTIONS); retry later",
                linger=False,  # nothing read yet, and a refused connection must not stay
            )
            return
        self._head_started = time.monotonic()
        self._tick_later()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._ticking is not None:
            self._ticking.cancel()
            self._ticking = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if not self._in_head:
            if self._in_body:
                self._body_bytes += len(data)
            super().data_received(data)
            return
        room = self.limits.max_header_bytes - self._head_bytes
        take = data if len(data) <= room else data[:room]
        self._head_bytes += len(take)
        super().data_received(take)
        if self._refused or self.transport.is_closing() or len(take) == len(data):
            return
        # The head may end inside this piece: what the limit allowed was fed, the rest only if it did.
        if self._reading_head():
            self._too_large(
                f"request line and headers over {self.limits.max_header_bytes} bytes (SELECTOR_MAX_HEADER_BYTES)"
            )
            return
        self.data_received(data[room:])

    def _reading_head(self) -> bool:
        """Whether a request head is still arriving: read afresh after feeding the parser, whose callbacks
        (on_headers_complete, on_message_begin) change it."""
        return self._in_head

    # ---- parser callbacks -----------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if not self._in_head:  # a later request on this connection: its head starts now
            self._in_head, self._head_bytes, self._header_count = True, 0, 0
            self._head_started = time.monotonic()
            self._tick_later()
        super().on_message_begin()

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._refused:
            return
        self._header_count += 1
        if self._header_count > self.limits.max_headers:
            self._too_large(f"more than {self.limits.max_headers} headers (SELECTOR_MAX_HEADERS)")
            return
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._refused:
            return  # never reaches the app
        self._in_head = False
        self._in_body, self._body_started, self._body_bytes = True, time.monotonic(), 0
        super().on_headers_complete()
        self._tick_later()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_body = False
        if not self._refused:
            super().on_message_complete()

    # ---- deadlines ------------------------------------------------------------------------------
    def _tick_later(self) -> None:
        if self._ticking is None and not self._refused:
            self._ticking = self.loop.call_later(TICK_S, self._tick)

    def _tick(self) -> None:
        self._ticking = None
        if self._refused or self.transport is None or self.transport.is_closing():
            return
        now = time.monotonic()
        if self._in_head:
            if now - self._head_started > self.limits.header_timeout_s:
                self._time_out(f"the request head did not arrive within {self.limits.header_timeout_s:g} s "
                               "(SELECTOR_HEADER_TIMEOUT_S)")  # fmt: skip
                return
        elif self._in_body:
            if self.flow is not None and self.flow.read_paused:
                self._body_started += TICK_S  # the app has not read what came: the client is not late
            allowed = self.limits.body_timeout_s + self._body_bytes / self.limits.body_min_bytes_per_s
            if now - self._body_started > allowed:
                self._time_out(
                    f"the request body arrived slower than {self.limits.body_min_bytes_per_s} bytes/s after "
                    f"{self.limits.body_timeout_s:g} s (SELECTOR_BODY_TIMEOUT_S, SELECTOR_BODY_MIN_BYTES_PER_S)"
                )
                return
        else:
            return  # between requests: uvicorn's keep-alive timeout closes an idle connection
        self._tick_later()

    # ---- refusals -------------------------------------------------------------------------------
    def _too_large(self, why: str) -> None:
        self._refuse(431, "Request Header Fields Too Large", f"{why}; send fewer or shorter headers")

    def _time_out(self, why: str) -> None:
        cycle = self.cycle
        if cycle is not None and not self._in_head:
            # The app may be reading the body: it sees the client gone, and what it sends is dropped.
            answered = cycle.response_started
            cycle.disconnected = True
            cycle.message_event.set()
            if answered:
                self._refused = True
                REFUSED.labels("closed").inc()
                self.transport.close()
                return
        self._refuse(408, "Request Timeout", why)

    def _refuse(self, status: int, reason: str, detail: str, linger: bool = True) -> None:
        """Answers `status` and closes. With `linger`, the answer is followed by the end of the stream
        and what the client still sends is read and dropped for up to LINGER_S before the close: a
        client still writing its head would otherwise get a reset instead of the answer."""
        self._refused = True
        REFUSED.labels(str(status)).inc()
        log.debug("closing a connection from %s: %s %s", self.client, status, detail)
        if self.cycle is not None:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.write(_answer(status, reason, detail))
        if linger and self.transport.can_write_eof():
            self.transport.write_eof()
            if self.flow is not None:
                self.flow.resume_reading()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()


def protocol_class(settings: Any) -> type[BoundedProtocol]:
    """A BoundedProtocol subclass with the limits of `settings`."""
    return type("BoundedProtocol", (BoundedProtocol,), {"limits": HttpLimits.of(settings)})


class WorkerProtocol(BoundedProtocol):
    """The protocol of `serve --workers N`'s workers, which uvicorn imports by name: its limits come
    from the environment serve prepared, read when the worker first builds one."""

    _limits: HttpLimits | None = None

    @property
    def limits(self) -> HttpLimits:  # type: ignore[override]  # the base's attribute, read lazily here
        if WorkerProtocol._limits is None:
            from selector_service.settings import Settings

            WorkerProtocol._limits = HttpLimits.of(Settings())
        return WorkerProtocol._limits
