"""The HTTP server's bounds, tested with real sockets against a real service: a huge header line or
too many headers get 431 (or the connection closed), a client that trickles its request head or body is
dropped within its timeout, connections beyond the limit are refused, all before authentication, and
normal clients keep working meanwhile, with one worker or several."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.parse

import httpx
import pytest

from tests.utils import ServiceProcess

pytestmark = pytest.mark.slow

HEAD_TIMEOUT = 2.0
BODY_TIMEOUT = 2.0
MAX_CONNECTIONS = 40
# A dropped client is noticed within its timeout plus this much (ticks, a loaded test machine).
MARGIN_S = 8.0
TOKEN = "http-limits-token-0123456789"
LIMITS = {
    "SELECTOR_HEADER_TIMEOUT_S": str(HEAD_TIMEOUT),
    "SELECTOR_BODY_TIMEOUT_S": str(BODY_TIMEOUT),
    "SELECTOR_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
    "SELECTOR_API_TOKEN": TOKEN,
}


@pytest.fixture(scope="module")
def svc(start_service):
    return start_service(**LIMITS)


def address(svc: ServiceProcess) -> tuple[str, int]:
    url = urllib.parse.urlparse(svc.url)
    return url.hostname, url.port


def answer_or_close(sock: socket.socket, within: float) -> tuple[bytes, float]:
    """What the server sends until it closes the connection, and when it closed (seconds from now); a
    reset counts as closed. Fails if it is still open after `within` seconds."""
    started = time.monotonic()
    sock.settimeout(within)
    out = b""
    try:
        while True:
            part = sock.recv(65536)
            if not part:
                break
            out += part
    except ConnectionResetError:
        pass
    except TimeoutError:
        pytest.fail(f"the connection is still open after {within:.0f} s; got {out[:100]!r}")
    return out, time.monotonic() - started


def healthy(svc: ServiceProcess) -> None:
    """A normal client: the open probe and an authenticated call both answer."""
    with httpx.Client(base_url=svc.url, timeout=30, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        assert http.get("/healthz").status_code == 200
        assert http.get("/datasets").status_code == 200


def send_quietly(sock: socket.socket, data: bytes) -> None:
    # the server may answer and close before it read everything: what these tests want
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        sock.sendall(data)


@pytest.mark.parametrize("size", [8 * 2**20, 64 * 2**20])
def test_a_huge_header_line_gets_431_or_is_closed(svc, size):
    with socket.create_connection(address(svc), timeout=30) as sock:
        sender = threading.Thread(
            target=send_quietly,
            args=(sock, b"GET /datasets HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * size + b"\r\n\r\n"),
        )
        sender.start()
        out, _ = answer_or_close(sock, 30)
        sender.join(30)
    assert out == b"" or out.startswith(b"HTTP/1.1 431"), out[:200]
    healthy(svc)


def test_too_many_headers_get_431(svc):
    head = (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(500)) + b"\r\n"
    )
    with socket.create_connection(address(svc), timeout=30) as sock:
        send_quietly(sock, head)
        out, _ = answer_or_close(sock, 30)
    assert out.startswith(b"HTTP/1.1 431") and b"SELECTOR_MAX_HEADERS" in out, out[:300]
    healthy(svc)


def test_slowloris_clients_are_dropped_within_the_head_timeout_and_others_are_served(svc):
    """Twenty clients trickle their request heads a byte at a time: each is closed (408) within the head
    timeout, and a normal client is served while they trickle."""
    socks = [socket.create_connection(address(svc), timeout=30) for _ in range(20)]
    stop = threading.Event()
    closed: dict[int, float] = {}
    started = time.monotonic()

    def trickle(i: int, sock: socket.socket) -> None:
        for byte in b"GET /datasets HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000:
            if stop.is_set():
                return
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                closed.setdefault(i, time.monotonic() - started)
                return
            time.sleep(0.2)

    threads = [threading.Thread(target=trickle, args=(i, s), daemon=True) for i, s in enumerate(socks)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        healthy(svc)  # served while twenty heads trickle in
        answers = [answer_or_close(sock, HEAD_TIMEOUT + MARGIN_S) for sock in socks]
    finally:
        stop.set()
        for sock in socks:
            sock.close()
    for out, _ in answers:
        assert out == b"" or out.startswith(b"HTTP/1.1 408"), out[:200]
    assert time.monotonic() - started < HEAD_TIMEOUT + MARGIN_S
    healthy(svc)


def test_a_connection_that_sends_nothing_is_dropped(svc):
    with socket.create_connection(address(svc), timeout=30) as sock:
        out, _ = answer_or_close(sock, HEAD_TIMEOUT + MARGIN_S)
    assert out == b"" or out.startswith(b"HTTP/1.1 408"), out[:200]


def test_a_trickled_chunked_body_is_answered_408_or_dropped(svc):
    head = (
        b"POST /observe HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + TOKEN.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n"
    )
    with socket.create_connection(address(svc), timeout=30) as sock:
        sock.sendall(head)
        stop = threading.Event()

        def trickle() -> None:
            while not stop.is_set():
                try:
                    sock.sendall(b"1\r\n \r\n")
                except OSError:
                    return
                time.sleep(0.3)

        sender = threading.Thread(target=trickle, daemon=True)
        sender.start()
        try:
            out, _ = answer_or_close(sock, BODY_TIMEOUT + MARGIN_S)
        finally:
            stop.set()
            sender.join(5)
    assert out == b"" or out.startswith(b"HTTP/1.1 408"), out[:200]
    healthy(svc)


def test_a_body_sent_at_a_steady_rate_is_not_cut_off(svc):
    """A 1 MiB body spread over three body timeouts, well above the minimum rate: answered by the app
    (a 401: this client has no token), not by the server's deadline."""
    body = b"x" * 2**20
    head = (
        b"POST /observe HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    with socket.create_connection(address(svc), timeout=30) as sock:
        sock.sendall(head)
        pieces = 30
        step = len(body) // pieces
        for i in range(pieces):
            sock.sendall(body[i * step : (i + 1) * step if i < pieces - 1 else len(body)])
            time.sleep(3 * BODY_TIMEOUT / pieces)
        sock.settimeout(30)
        out = sock.recv(65536)
    assert out.startswith(b"HTTP/1.1 401"), out[:200]


def test_connections_beyond_the_limit_are_refused_and_normal_clients_work_below_it(svc):
    idle = []
    try:
        for _ in range(MAX_CONNECTIONS - 5):
            idle.append(socket.create_connection(address(svc), timeout=30))
        time.sleep(0.3)
        healthy(svc)  # below the limit: served
        extra = [socket.create_connection(address(svc), timeout=30) for _ in range(10)]
        idle += extra
        refused = 0
        for sock in extra[-5:]:
            out, _ = answer_or_close(sock, 10)
            assert out == b"" or out.startswith(b"HTTP/1.1 503"), out[:200]
            refused += 1
        assert refused == 5
    finally:
        for sock in idle:
            sock.close()
    time.sleep(0.5)
    healthy(svc)  # the slots are free again


def test_the_bounds_hold_in_every_worker(redis_url):
    svc = ServiceProcess(
        redis_url=redis_url,
        env={"SELECTOR_HEADER_TIMEOUT_S": str(HEAD_TIMEOUT)},
        extra_args=["--workers", "2"],
    ).start()
    try:
        for _ in range(4):  # the kernel spreads connections over the workers
            with socket.create_connection(address(svc), timeout=30) as sock:
                send_quietly(
                    sock, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 2**20 + b"\r\n\r\n"
                )
                out, _ = answer_or_close(sock, 30)
            assert out == b"" or out.startswith(b"HTTP/1.1 431"), out[:200]
            with socket.create_connection(address(svc), timeout=30) as sock:
                out, _ = answer_or_close(sock, HEAD_TIMEOUT + MARGIN_S)
            assert out == b"" or out.startswith(b"HTTP/1.1 408"), out[:200]
        assert httpx.get(f"{svc.url}/healthz", timeout=30).status_code == 200
    finally:
        svc.stop()
