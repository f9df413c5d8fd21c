"""A TCP proxy in front of Redis that loses replies, freezes or dies: what a flaky network or a store
failing at the wrong moment does to the service, on demand.

- `loss`: the probability that the reply to a script call (EVALSHA / EVAL) is lost: the command reaches
  Redis and runs, then the proxy closes the client's connection instead of forwarding the reply. The
  client library sees a connection error and, as configured in store.connect, sends the same command
  again on a fresh connection: the service must recognise its own first attempt.
- `freeze()`: keeps every connection open and forwards nothing more (a frozen store or network).
- `close()`: closes the listening socket and every connection (a store that died).
- `fail_after=n, fail="close" | "freeze"`: the first n connections are served; at the next one the
  proxy closes (the store died) or freezes (it hangs): a store lost at a chosen point of a start-up.

Threads and blocking sockets; for tests and bench scripts.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading


class StoreProxy:
    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        loss: float = 0.0,
        seed: int = 0,
        fail_after: int | None = None,
        fail: str = "close",
    ) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.fail_after, self.fail = fail_after, fail
        self.accepted = 0
        self.loss = loss
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._frozen = threading.Event()
        self._closed = threading.Event()
        self._conns: list[socket.socket] = []
        self.lost = 0  # replies dropped
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def freeze(self) -> None:
        self._frozen.set()

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            conns, self._conns = self._conns, []
        for s in [self.listener, *conns]:
            _shut(s)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            if self.fail_after is not None and self.accepted > self.fail_after:
                if self.fail == "close":
                    _shut(client)
                    self.close()
                    return
                self.freeze()
            if self._frozen.is_set():  # accepted, then nothing: a frozen store
                with self._lock:
                    self._conns.append(client)
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                _shut(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                self._conns += [client, upstream]
            state = {"script": False}
            threading.Thread(target=self._pump_up, args=(client, upstream, state), daemon=True).start()
            threading.Thread(target=self._pump_down, args=(upstream, client, state), daemon=True).start()

    def _pump_up(self, client: socket.socket, upstream: socket.socket, state: dict) -> None:
        try:
            while data := client.recv(65536):
                if self._frozen.is_set():
                    continue  # swallowed: the store never answers
                head = data[:64].upper()
                if b"EVALSHA" in head or b"\r\nEVAL\r\n" in head:
                    state["script"] = True
                upstream.sendall(data)
        except OSError:
            pass
        _shut(client)
        _shut(upstream)

    def _pump_down(self, upstream: socket.socket, client: socket.socket, state: dict) -> None:
        try:
            while data := upstream.recv(65536):
                if self._frozen.is_set():
                    continue
                if state["script"]:
                    state["script"] = False
                    with self._lock:
                        drop = self._rng.random() < self.loss
                    if drop:
                        self.lost += 1
                        break  # the command ran; its reply never arrives
                client.sendall(data)
        except OSError:
            pass
        _shut(client)
        _shut(upstream)


def _shut(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        s.close()
