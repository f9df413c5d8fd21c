"""An HTTP/1.1 proxy on loopback between the typed client and the service that injects faults into the
exchanges: what a flaky network, a gateway or a dying service does to a trainer's calls, on demand.

Each request the proxy reads gets one action, from a seeded schedule (`seed`, `faults`: the share of
requests that get a fault, `weights`: how the faults are drawn, `budget`: the most faults of each
action) or from `script` (actions in order, then "pass"):

- ``pass``: forwarded, its answer returned.
- ``drop``: forwarded (the service applies it), then the client's connection is closed without an answer.
- ``reset``: the connection is closed before the request is forwarded (nothing applied).
- ``cut``: forwarded, half of the answer returned, then the connection closed.
- ``stall``: forwarded, then no answer: the connection is held until the client gives up.
- ``drip``: forwarded, its answer returned one byte every `drip_s` seconds.
- ``busy``: not forwarded; the proxy answers 503 with an HTML page of its own (`retry_after`, when set,
  as its Retry-After).
- ``gateway``: forwarded, then the proxy answers 502 with an HTML page instead of the service's answer.
- ``twice``: forwarded twice, the second answer returned (a request duplicated on the way).
- ``kill``: forwarded, then `on_kill` is called (a test kills the service with SIGKILL there) and the
  connection closed.
- ``down``: the connection is closed unforwarded and the proxy stops listening for `down_s` seconds
  (every connection dropped meanwhile): connects are refused, as by a service that is not running.

While the service is unreachable the proxy answers 502, as a gateway does. `log` holds one `Exchange`
per request. The proxy stops by itself after `lifetime_s` seconds (or at `close()`); threads and
blocking sockets, as `store_proxy.StoreProxy`.
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from tests.service.store_proxy import _shut

ACTIONS = ("pass", "drop", "reset", "cut", "stall", "drip", "busy", "gateway", "twice", "kill", "down")
_PAGE = (
    "<!DOCTYPE html>\n<html>\n<head><title>{status} {reason}</title></head>\n<body>\n<center><h1>{status} "
    "{reason}</h1></center>\n<hr><center>fault-proxy</center>\n"
    + "<!-- padding -->\n" * 20
    + "</body>\n</html>\n"
)


@dataclass
class Exchange:
    """One request the proxy read: what it did with it and whether the service got it."""

    index: int
    action: str
    method: str
    path: str
    call: str | None  # the request's Selector-Call header
    request_id: str | None  # an observe's request id
    forwarded: bool = False  # sent to the service (it may have applied it)


class FaultProxy:
    def __init__(
        self,
        upstream_port: int,
        *,
        seed: int = 0,
        faults: float = 0.0,
        weights: Mapping[str, float] | None = None,
        budget: Mapping[str, int] | None = None,
        script: Sequence[str] = (),
        drip_s: float = 0.3,
        down_s: float = 0.5,
        retry_after: str | None = None,
        on_kill: Callable[[], None] | None = None,
        lifetime_s: float = 120.0,
    ) -> None:
        assert set(weights or {}) <= set(ACTIONS) and set(script) <= set(ACTIONS)
        self.upstream_port = upstream_port
        self.faults = faults
        self.weights = dict(weights or {})
        self.budget = dict(budget or {})
        self.script = list(script)
        self.drip_s, self.down_s, self.retry_after = drip_s, down_s, retry_after
        self.on_kill = on_kill
        self.rng = random.Random(seed)
        self.log: list[Exchange] = []
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._conns: set[socket.socket] = set()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()
        self._timer = threading.Timer(lifetime_s, self.close)
        self._timer.daemon = True
        self._timer.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._closed.set()
        self._timer.cancel()
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for s in [self.listener, *conns]:
            _shut(s)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- schedule -----------------------------------------------------------------------------------
    def _action(self) -> str:
        with self._lock:
            if self.script:
                action = self.script.pop(0)
            elif self.weights and self.rng.random() < self.faults:
                open_ = {
                    a: w for a, w in self.weights.items() if self.counts[a] < self.budget.get(a, 1 << 30)
                }
                action = self.rng.choices(list(open_), list(open_.values()))[0] if open_ else "pass"
            else:
                action = "pass"
            self.counts[action] += 1
            return action

    # --- sockets ------------------------------------------------------------------------------------
    def _accept(self, listener: socket.socket) -> None:
        while not self._closed.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            with self._lock:
                self._conns.add(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _down(self) -> None:
        """Stops listening and drops every connection for `down_s` seconds, then listens again."""
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for s in [self.listener, *conns]:
            _shut(s)
        time.sleep(self.down_s)
        if self._closed.is_set():
            return
        self.listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def _forward(self, request: tuple[bytes, bytes], exchange: Exchange) -> bytes:
        """Sends a request to the service on a connection of its own; returns its whole answer (OSError
        when the service is not there or dies before it answers)."""
        head, body = request
        with socket.create_connection(("127.0.0.1", self.upstream_port), timeout=30) as upstream:
            exchange.forwarded = True
            upstream.sendall(head + b"\r\n\r\n" + body)
            answer = _read_message(upstream)
        if answer is None:
            raise ConnectionResetError("the service closed the connection without an answer")
        return answer[0] + b"\r\n\r\n" + answer[1]

    def _serve(self, client: socket.socket) -> None:
        try:
            while not self._closed.is_set():
                request = _read_message(client)
                if request is None:
                    return
                action = self._action()
                exchange = _exchange(len(self.log), action, request)
                with self._lock:
                    self.log.append(exchange)
                if action in ("reset", "down"):
                    if action == "down":
                        threading.Thread(target=self._down, daemon=True).start()
                    return
                if action == "busy":
                    client.sendall(_page(503, "Service Temporarily Unavailable", self.retry_after))
                    continue
                try:
                    answer = self._forward(request, exchange)
                    if action == "twice":
                        answer = self._forward(request, exchange)
                except OSError:  # the service is down or died mid-request: a gateway's 502
                    client.sendall(_page(502, "Bad Gateway"))
                    continue
                if action == "pass" or action == "twice":
                    client.sendall(answer)
                elif action == "cut":
                    client.sendall(answer[: len(answer) // 2])
                    return
                elif action == "gateway":
                    client.sendall(_page(502, "Bad Gateway"))
                elif action == "drip":
                    for i in range(len(answer)):
                        if self._closed.wait(self.drip_s):
                            return
                        client.sendall(answer[i : i + 1])
                elif action == "stall":
                    client.settimeout(None)
                    while client.recv(65536):  # until the client gives up (or the proxy closes)
                        pass
                    return
                else:  # drop, kill
                    if action == "kill" and self.on_kill is not None:
                        self.on_kill()
                    return
        except OSError:
            return
        finally:
            with self._lock:
                self._conns.discard(client)
            _shut(client)


def _exchange(index: int, action: str, request: tuple[bytes, bytes]) -> Exchange:
    head, body = request
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    request_id = None
    if path == "/observe":
        request_id = json.loads(body).get("request_id")
    return Exchange(index, action, method, path, headers.get("selector-call"), request_id)


def _read_message(sock: socket.socket) -> tuple[bytes, bytes] | None:
    """One HTTP/1.1 message with a Content-Length body (or none): (head, body), None at EOF."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
        assert name.strip().lower() != b"transfer-encoding", "the proxy reads Content-Length bodies only"
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        body += chunk
    assert len(body) == length, "pipelined requests are not expected"
    return head, body


def _page(status: int, reason: str, retry_after: str | None = None) -> bytes:
    body = _PAGE.format(status=status, reason=reason).encode()
    extra = f"Retry-After: {retry_after}\r\n" if retry_after is not None else ""
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/html\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body
