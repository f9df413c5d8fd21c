"""An unexpected error is a 500 `{"detail"}` on a connection that stays usable: a client's next request
on the same keep-alive connection (say, an observe) must not fail with a reset."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import uvicorn
from fastapi import FastAPI

from selector_service.api.middleware import InternalErrors, RequestMetrics


def _serve(app) -> tuple[uvicorn.Server, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    return server, f"http://127.0.0.1:{port}"


def test_a_500_keeps_the_connection_usable():
    app = FastAPI()

    @app.get("/boom")
    async def boom():
        raise ValueError("a bug")

    @app.get("/fine")
    async def fine():
        return {"ok": True}

    app.add_middleware(InternalErrors)
    app.add_middleware(RequestMetrics)
    server, url = _serve(app)
    try:
        with httpx.Client(base_url=url, timeout=10) as c:
            r = c.get("/boom")
            assert r.status_code == 500 and r.json() == {
                "detail": "internal error (ValueError); see the service log"
            }
        # Two requests sent back to back on one connection (as a client does that reuses it before it
        # could see the server close it): both must be answered.
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            request = "GET {} HTTP/1.1\r\nHost: x\r\n\r\n"
            sock.sendall((request.format("/boom") + request.format("/fine")).encode())
            received = b""
            while received.count(b"HTTP/1.1 ") < 2 or not received.endswith(b'{"ok":true}'):
                part = sock.recv(65536)
                if not part:
                    break
                received += part
        assert received.startswith(b"HTTP/1.1 500"), received[:200]
        assert b"HTTP/1.1 200" in received and received.endswith(b'{"ok":true}'), received
    finally:
        server.should_exit = True
